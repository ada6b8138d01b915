#!/usr/bin/env python3
"""`ironic-proxy doctor --peers` and the scale-out checks against the real distributed Ironic of
ironic_e2e.py (issue 43), with Ironic's JSON-RPC client going through each sidecar's egress.

1. On the healthy cluster, `doctor --peers` in the first sidecar (the built-in profile, as a
   pod runs it, with `IRONIC_PROXY_PEERS=none` as under the Ironic standalone operator recipe)
   finds the conductors from its Ironic's API, calls each one's JSON-RPC listener over mutual
   TLS with the identity the sidecar exported, and calls its own `[DEFAULT]host` through its
   egress: every line PASS, exit 0.
2. Scale-out: a fourth instance (Ironic and sidecar on 127.0.0.6) joins with the cluster's
   configuration, whose peer CIDRs list only the first three. Its doctor names the cause
   (`scale.peer_cidrs`, `scale.egress_targets`) and exits 1. The fix is the operator's: every
   node's peer CIDRs get the new address and each sidecar restarts, one at a time. Then the new
   node's doctor passes every scale check and reaches all four conductors.
3. One peer's sidecar stopped, one peer's sidecar issuing from another CA: the first sidecar's
   `doctor --peers` says `refused` for the one and `TLS` (not trusted) for the other, PASS for
   the rest, exit 1. Both are restored after.

The transcripts are printed. Run it as `E2E_TEST=peers_e2e scripts/e2e` (`scripts/e2e --peers`),
under `flock /tmp/ironic-proxy-heavy.lock` (fixed loopback addresses).
"""

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import ironic_e2e as base  # noqa: E402

FOURTH = "127.0.0.6"  # not 127.0.0.5: egress_checks' fake agent


class Summary(base.TitledSummary):
    TITLES = {
        1: "doctor --peers on the healthy cluster: every conductor and the egress pass",
        2: "a fourth instance outside the peer CIDRs: doctor names the cause; fixed, it passes",
        3: "one peer stopped, one from another CA: FAIL refused and FAIL TLS, the rest pass",
    }
    HEADING = "ironic-proxy doctor --peers and scale-out end-to-end summary (real Ironic)"
    LABEL = "e2e-peers"

    def extra(self):
        return [f"  {base.ironic_version()}"]


class PeersE2E(base.E2E):
    def __init__(self, args, summary):
        args.egress = True
        super().__init__(args, summary)
        self.cred = os.path.join(self.root, "egress.credentials")
        self.transcripts = []

    def doctor(self, inst, what):
        argv, env, _ = self.sidecar_command(inst, "doctor", "--peers")
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        lines = p.stdout.splitlines()
        self.transcripts.append((what, p.returncode, p.stdout))
        print(f"==== doctor --peers in the sidecar of {inst.ip}: {what} (exit {p.returncode})")
        print(p.stdout + p.stderr, flush=True)
        return p.returncode, lines

    def write_sidecar(self, inst, peer_ips, issuer_dir=None):
        """inst's sidecar file (or profile variables) for a cluster of peer_ips."""
        if inst.profile_env is not None:
            inst.profile_env["IRONIC_PROXY_PEER_CIDRS"] = ",".join(f"{ip}/32" for ip in peer_ips)
            return
        text = h.sidecar_config(inst, self.ca_dir, peer_ips) + h.egress_listener(
            inst, peer_ips, self.cred
        )
        if issuer_dir:
            # It issues from the other CA; it refuses to start unless its trust holds that CA
            # too (the cluster's and the other), so the bundle has both.
            both = os.path.join(self.root, "trust-both.crt")
            with open(both, "w") as f:
                for d in (self.ca_dir, issuer_dir):
                    with open(os.path.join(d, "ca.crt")) as ca:
                        f.write(ca.read())
            text = text.replace(f'trust = "{self.ca_dir}/ca.crt"', f'trust = "{both}"')
            text = text.replace(f'issuer_cert = "{self.ca_dir}/ca.crt"',
                                f'issuer_cert = "{issuer_dir}/ca.crt"')
            text = text.replace(f'issuer_key = "{self.ca_dir}/ca.key"',
                                f'issuer_key = "{issuer_dir}/ca.key"')
        with open(inst.sidecar_conf, "w") as f:
            f.write(text)

    def restart_sidecar(self, inst):
        self.procs.stop(inst.sidecar, timeout=60)
        self.start_sidecar(inst)

    def run(self):
        if any(h.port_in_use(FOURTH, p) for p in (h.RPC_PORT, h.API_PORT, h.ADMIN_PORT)):
            raise h.Failure(f"{FOURTH} ports already in use (another run?)")
        self.setup()
        first = self.instances[0]
        port = h.RPC_PORT

        # 1. The healthy cluster.
        code, lines = self.doctor(first, "healthy cluster")
        want = [f"PASS peers[{ip}:{port}]: mutual TLS" for ip in h.IPS]
        want.append(f"PASS egress[json-rpc-egress].json-rpc: POST http://{first.ip}:{port}/")
        missing = [w for w in want if not any(line.startswith(w) for line in lines)]
        self.s.check(1, Summary.TITLES[1], code == 0 and not missing,
                     f"exit {code}; {len(want) - len(missing)} of {len(want)} expected PASS "
                     f"lines{'; missing ' + str(missing) if missing else ''}")

        # 2. A fourth instance with the cluster's configuration (peer CIDRs of three).
        fourth = h.Instance(self.root, FOURTH)
        with open(fourth.conf, "w") as f:
            f.write(h.egress_ironic_conf(h.ironic_conf(fourth, self.db.url)))
        self.write_sidecar(fourth, h.IPS)
        self.start_sidecar(fourth)
        self.start_ironic(fourth)
        h.wait_for(f"Ironic {FOURTH} to serve", lambda: self.serving(fourth), 120)
        code_before, before = self.doctor(fourth, "fourth node, peer CIDRs of three")
        # peer_cidrs always (allow lists the three); egress_targets too when the egress
        # targets are the three addresses (harness.egress_listener), not a wider network.
        causes = [
            line for line in before
            if line.startswith(("FAIL scale.peer_cidrs: none of our names (127.0.0.6",
                                "FAIL scale.egress_targets: 127.0.0.6"))
        ]
        refused = [ip for ip in h.IPS if any(
            line.startswith(f"FAIL peers[{ip}:{port}]: allow: ") for line in before)]
        # The fix, as an operator makes it: the new address in every node's peer CIDRs, each
        # sidecar restarted in turn (the first one's profile variable, the others' files).
        four = [*h.IPS, FOURTH]
        for inst in [*self.instances, fourth]:
            self.write_sidecar(inst, four)
            self.restart_sidecar(inst)
        code_after, after = self.doctor(fourth, "fourth node after the fix")
        scale_ok = [line for line in after if line.startswith("PASS scale.")]
        peers_ok = [ip for ip in four
                    if any(line.startswith(f"PASS peers[{ip}:{port}]") for line in after)]
        self.s.check(
            2, Summary.TITLES[2],
            code_before == 1 and any("scale.peer_cidrs" in c for c in causes)
            and len(refused) == 3 and code_after == 0
            and len(peers_ok) == 4,
            f"before: exit {code_before}, causes named {causes}, refused by {refused}; "
            f"after: exit {code_after}, "
            f"{len(scale_ok)} scale checks PASS, PASS peers {peers_ok}",
        )

        # 3. One peer stopped, one issuing from another CA.
        stopped, foreign = self.instances[2], self.instances[1]
        self.procs.stop(stopped.sidecar, timeout=60)
        self.write_sidecar(foreign, four, issuer_dir=os.path.join(self.root, "foreign"))
        self.restart_sidecar(foreign)
        code, lines = self.doctor(first, "one peer stopped, one from another CA")
        refused = [line for line in lines
                   if line.startswith(f"FAIL peers[{stopped.ip}:{port}]: refused: ")]
        untrusted = [line for line in lines if line.startswith(
            f"FAIL peers[{foreign.ip}:{port}]: TLS: the peer's certificate is not trusted")]
        passing = [ip for ip in (first.ip, FOURTH)
                   if any(line.startswith(f"PASS peers[{ip}:{port}]") for line in lines)]
        self.s.check(3, Summary.TITLES[3],
                     code == 1 and len(refused) == 1 and len(untrusted) == 1 and len(passing) == 2,
                     f"exit {code}; {refused + untrusted}; PASS {passing}")
        self.write_sidecar(foreign, four)
        self.restart_sidecar(foreign)
        self.start_sidecar(stopped)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy-bin", required=True)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    base.run_scenario(PeersE2E, args, Summary())


if __name__ == "__main__":
    main()
