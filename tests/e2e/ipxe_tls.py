"""What iPXE offers in its TLS ClientHello, per iPXE version, and clients restricted to it.

Read in iPXE's source (github.com/ipxe/ipxe, master 0ab2277c4 of 2026-08-21; docs/boot-tls.md):
`src/config/crypto.h` (TLS_VERSION_MIN 1.1, TLS_VERSION_MAX 1.2; the exchanges, public-key
types, ciphers, digests and groups built in), the `__tls_cipher_suite(priority)` entries of
`src/crypto/mishmash/*.c` (the ClientHello lists them in that order), `__tls_named_group(pref)`
(x25519 01, P-256 and P-384 02, ffdhe2048/3072/4096 03), the `__tls_sig_hash_algorithm`
entries, and `tls_client_hello` in `src/net/tls.c` (extensions: server_name, max_fragment_length
4096, signature_algorithms, renegotiation_info, session_ticket, extended_master_secret,
supported_groups). No TLS 1.3, no ChaCha20.

- CURRENT: master 0ab2277c4. ECDSA certificates since 4e3cbeef8 (2025-12-18), ECDHE since
  963ec1c4f (2024-01-30), extended master secret since ab64bc5b8 (2025-10-12).
- V2_0: v2.0.0 (2026-03-06) and ironic-image's pinned iPXE d0ea2b1bb (2026-01-24): as CURRENT
  without RSA-PSS signatures and FFDHE groups.
- RSA_ONLY: the same offer without ECDSA (suites, signature algorithms): iPXE built between
  963ec1c4f and 4e3cbeef8 (ECDHE, but RSA certificates only). Not a release: the profile
  isolates the certificate's key type.
- V1_21: v1.21.1 (2020-12-31), the last release before 2.0: RSA key exchange with AES-CBC only.

Debian 12's iPXE (1.0.0+git-20190125) has no HTTPS at all (its feature line), so it never sends
a ClientHello.
"""

import subprocess

_ECDSA_SUITES = [
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-SHA256", "ECDHE-ECDSA-AES256-SHA384",
    "ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA",
]  # fmt: skip
_RSA_SUITES = [
    "ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES128-SHA256", "ECDHE-RSA-AES256-SHA384",
    "ECDHE-RSA-AES128-SHA", "ECDHE-RSA-AES256-SHA",
    "DHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES256-GCM-SHA384",
    "DHE-RSA-AES128-SHA256", "DHE-RSA-AES256-SHA256", "DHE-RSA-AES128-SHA", "DHE-RSA-AES256-SHA",
    "AES128-GCM-SHA256", "AES256-GCM-SHA384", "AES128-SHA256", "AES256-SHA256",
    "AES128-SHA", "AES256-SHA",
]  # fmt: skip
_RSA_SIGALGS = [
    "RSA+SHA1", "RSA+SHA224", "RSA+SHA256", "RSA+SHA384", "RSA+SHA512",
    "rsa_pss_rsae_sha256", "rsa_pss_rsae_sha384", "rsa_pss_rsae_sha512",
    "rsa_pss_pss_sha256", "rsa_pss_pss_sha384", "rsa_pss_pss_sha512",
]  # fmt: skip
_ECDSA_SIGALGS = ["ECDSA+SHA224", "ECDSA+SHA256", "ECDSA+SHA384", "ECDSA+SHA512"]
_GROUPS = "X25519:P-256:P-384:ffdhe2048:ffdhe3072:ffdhe4096"


class Profile:
    def __init__(self, name, suites, sigalgs, groups):
        self.name, self.suites, self.sigalgs, self.groups = name, suites, sigalgs, groups

    def s_client_args(self):
        # SECLEVEL=0: OpenSSL would otherwise drop iPXE's SHA-1 suites and signatures from
        # the offer; the server still picks what it accepts.
        args = ["-tls1_2", "-cipher", ":".join(self.suites) + ":@SECLEVEL=0",
                "-sigalgs", ":".join(self.sigalgs), "-maxfraglen", "4096"]  # fmt: skip
        if self.groups:
            args += ["-groups", self.groups]
        return args

    def curl_args(self):
        args = ["--tlsv1.2", "--tls-max", "1.2", "--ciphers", ":".join(self.suites)]
        if self.groups:
            args += ["--curves", self.groups]
        return args


# ECDSA suites share priorities with the RSA ones (01 AES128-GCM, 02 AES256-GCM, ...); the
# order between the two at one priority is the linker's.
CURRENT = Profile(
    "iPXE master 0ab2277c4 (2026-08-21)",
    [s for pair in zip(_ECDSA_SUITES, _RSA_SUITES) for s in pair] + _RSA_SUITES[6:],
    _RSA_SIGALGS + _ECDSA_SIGALGS,
    _GROUPS,
)
# v2.0.0 and ironic-image's pin: no RSA-PSS signatures (63c1a6301, 2026-05-06) and no FFDHE
# named groups (241c36a6a, 2026-06-17) yet.
V2_0 = Profile(
    "iPXE 2.0.0 / ironic-image's pinned d0ea2b1bb",
    CURRENT.suites,
    [a for a in CURRENT.sigalgs if not a.startswith("rsa_pss")],
    "X25519:P-256:P-384",
)
RSA_ONLY = Profile("iPXE 2.0 without ECDSA (2024-01 to 2025-12 builds)", _RSA_SUITES,
                   _RSA_SIGALGS, _GROUPS)  # fmt: skip
# v1.21.1's crypto.h: CRYPTO_PUBKEY_RSA and CRYPTO_CIPHER_AES_CBC only (rsa_aes_cbc_sha1.c,
# rsa_aes_cbc_sha256.c); no supported_groups extension.
V1_21 = Profile("iPXE 1.21.1", ["AES128-SHA256", "AES256-SHA256", "AES128-SHA", "AES256-SHA"],
                ["RSA+SHA256", "RSA+SHA1"], None)  # fmt: skip


def s_client(address, profile, ca, request, timeout=20, verify_ip=None):
    """`openssl s_client` offering what `profile` offers; sends `request`, reads until the
    server closes. `verify_ip`: also check the certificate names that IP, as iPXE does.
    Returns (handshake: dict of -brief's "Key: value" lines, stdout bytes, stderr text)."""
    argv = ["openssl", "s_client", "-connect", address, "-brief", "-ign_eof", "-CAfile", ca,
            "-verify_return_error"] + (["-verify_ip", verify_ip] if verify_ip else []) + \
        profile.s_client_args()  # fmt: skip
    p = subprocess.run(argv, input=request.encode(), capture_output=True, timeout=timeout)
    err = p.stderr.decode(errors="replace")
    info = {}
    for line in err.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key and not key.startswith(" "):
            info.setdefault(key.strip(), value.strip())
    return info, p.stdout, err


def curl(url, profile, ca, user_agent="iPXE/2.0.0", timeout=20):
    """GET with curl offering what `profile` offers. Returns (status, body bytes)."""
    argv = ["curl", "-sS", "--noproxy", "*", "--cacert", ca, "-A", user_agent, "-o", "-",
            "-w", "\n%{http_code}", url] + profile.curl_args()  # fmt: skip
    p = subprocess.run(argv, capture_output=True, timeout=timeout)
    body, _, code = p.stdout.rpartition(b"\n")
    return (int(code) if code.strip().isdigit() else 0), body
