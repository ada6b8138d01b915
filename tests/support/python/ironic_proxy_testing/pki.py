"""The test certificates, made per run by the proxy's own `ironic-proxy ca init` / `cert issue`
(the commands an operator runs), or by the openssl CLI where a harness needs a certificate the
proxy did not make (a self-signed leaf, as a user would bring one)."""

import os

from .procs import run


def ca_init(binary, out, *, name=None, permit_ip=(), permit_dns=(), what="ca init"):
    """`ironic-proxy ca init --out OUT`: OUT/ca.crt and OUT/ca.key. `permit_ip` / `permit_dns`:
    the CA's name constraints (CIDRs, DNS suffixes)."""
    argv = [binary, "ca", "init", "--out", out]
    if name is not None:
        argv += ["--name", name]
    for cidr in permit_ip:
        argv += ["--permit-ip", cidr]
    for suffix in permit_dns:
        argv += ["--permit-dns", suffix]
    return run(argv, what)


def issue(binary, ca_dir, out, *, dns=(), ips=(), validity=None, what="cert issue"):
    """`ironic-proxy cert issue` from the CA in ca_dir (ca.crt, ca.key): OUT/tls.crt and
    OUT/tls.key for the DNS names and IPs given."""
    ca_dir = str(ca_dir)
    argv = [binary, "cert", "issue", "--ca-cert", os.path.join(ca_dir, "ca.crt"),
            "--ca-key", os.path.join(ca_dir, "ca.key")]  # fmt: skip
    for name in dns:
        argv += ["--dns", name]
    for ip in ips:
        argv += ["--ip", ip]
    if validity is not None:
        argv += ["--validity", validity]
    argv += ["--out", out]
    return run(argv, what)


def self_signed(cert, key, cn, days=2, what="openssl req (self-signed)"):
    """A self-signed P-256 certificate and its key, made by the openssl CLI."""
    return run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-nodes", "-days", str(days), "-subj", f"/CN={cn}", "-keyout", key, "-out", cert],
               what)  # fmt: skip
