"""The first instance's sidecar run from the container image instead of the host binary (issue 32,
`E2E_SIDECAR_IMAGE=localhost/ironic-proxy:latest scripts/e2e`; docs/e2e.md).

The container runs as the kit runs its sidecar (scripts/podman-run --as-kit: runc, the host's
network, a read-only root, user 997:994, no capabilities) with the same environment-only profile
the host-binary run gives that instance, and the files it uses bind-mounted at the same paths:

- the CA directory, read-only, its files root:994 0440 (a Secret of defaultMode 0440 in a pod
  with fsGroup 994, as check-container makes it);
- the instance's directory, read-only: Ironic's API and JSON-RPC sockets. It is made root:994
  and setgid, so the sockets Ironic (root here) creates there are group 994, and ironic.conf
  gives them mode 0660 (`unix_socket_mode`, harness.ironic_conf): the ironic user's group can
  connect, as in ironic-image's pod (its sockets 0660, 997:994). A read-only mount does not stop
  connect(2) on a socket;
- the export directory, writable, owned by 997:994 (the sidecar writes its certificate there;
  Ironic, root here, reads it);
- any other file the profile names (the egress credentials, an htpasswd), read-only, made
  root:994 0440 like a Secret; or, for a socket not made yet (the networking service's), its
  directory, read-only, made group 994 and setgid like the instance's directory (its server
  must then create the socket 0660 too: networking_e2e.py sets `unix_socket_mode`).

The user is the kit's, 997:994, not root: the files are given the owners and modes kubelet would
give them, so the run shows the image works with the kit's permissions, not only as root.

`podman run` stays attached (its output is the sidecar's log, as the host binary's is) and
forwards signals to the container (--sig-proxy), so the test stops it as it stops a process;
harness.Procs knows the container's unique name: it sends SIGKILL through podman (the client
would not forward it) and, once the client is gone, removes the container and checks it is.
"""

import json
import os
import shutil
import stat
import subprocess

import harness as h

ENV = "E2E_SIDECAR_IMAGE"
UID, GID = 997, 994  # ironic-image's ironic user; IrSO's ironicUser/ironicGroup
PODMAN_RUN = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "scripts",
    "podman-run",
)


def image_from_env():
    """The image E2E_SIDECAR_IMAGE names, or None when unset or empty."""
    return os.environ.get(ENV) or None


def describe(image):
    """`<image> (id <12 hex>, <size> MB)`; Failure when podman does not have it (never a skip:
    the run was asked to test the image)."""
    if shutil.which("podman") is None:
        raise h.Failure(f"{ENV}={image}: podman is not installed (scripts/build-image installs it)")
    p = subprocess.run(
        ["podman", "image", "inspect", "--format", "json", image],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if p.returncode != 0:
        raise h.Failure(
            f"{ENV}={image}: no such image in podman's store (scripts/build-image): "
            + p.stderr.strip()[-300:]
        )
    info = json.loads(p.stdout)[0]
    return f"{image} (id {info['Id'][:12]}, {info['Size'] / 1e6:.1f} MB)"


def secret(path):
    """A file as kubelet mounts a Secret key with defaultMode 0440 in a pod of fsGroup 994."""
    os.chown(path, 0, GID)
    os.chmod(path, 0o440)


def prepare(inst, ca_dir, env):
    """Gives the files of inst's sidecar the owners and modes of the kit's pod; returns the
    podman mount options, every path mounted where it is on the host."""
    for name in os.listdir(ca_dir):
        secret(os.path.join(ca_dir, name))
    os.chown(ca_dir, 0, GID)
    os.chmod(ca_dir, 0o750)
    # setgid: Ironic's sockets get group 994 (an fsGroup emptyDir).
    os.chown(inst.dir, 0, GID)
    os.chmod(inst.dir, 0o2750)
    os.makedirs(inst.tls_dir, exist_ok=True)
    os.chown(inst.tls_dir, UID, GID)
    os.chmod(inst.tls_dir, 0o750)
    mounts = [f"{ca_dir}:{ca_dir}:ro", f"{inst.dir}:{inst.dir}:ro", f"{inst.tls_dir}:{inst.tls_dir}"]
    covered = (ca_dir + os.sep, inst.dir + os.sep)
    for value in env.values():
        if not value.startswith("/") or value.startswith(covered) or value in (ca_dir, inst.dir):
            continue
        if os.path.isfile(value):
            secret(value)
            mounts.append(f"{value}:{value}:ro")
        else:  # a socket the test starts later: its directory, group 994 and setgid as above
            parent = os.path.dirname(value)
            os.chown(parent, -1, GID)
            os.chmod(parent, os.stat(parent).st_mode & 0o7777 | stat.S_ISGID)
            mounts.append(f"{parent}:{parent}:ro")
    # In this order: the export directory is mounted over part of the instance's directory.
    return [arg for m in dict.fromkeys(mounts) for arg in ("-v", m)]


def argv(image, name, env, mounts, command):
    """`podman run` of image as the kit runs its sidecar, attached, removed when it exits."""
    out = [PODMAN_RUN, "--as-kit", "--rm", "--name", name, "--sig-proxy=true"]
    for key, value in sorted(env.items()):
        out += ["-e", f"{key}={value}"]
    return out + mounts + [image, *command]
