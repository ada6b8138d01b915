"""The hosts and their BMC: libvirt started by hand in the root namespace (there is no systemd;
it only creates the VMs' taps on the bridge), QEMU domains of type `qemu` (TCG: guests stall
under KVM here) with their NIC on the provisioning bridge, a disk file and the serial console
to a file, and sushy-tools' Redfish emulator with its libvirt driver in the `bmc` namespace."""

import os
import shutil
import subprocess
import time
import uuid

from ironic_proxy_testing.procs import Failure, run, wait_for

from .kit import wait_listening

REDFISH_PORT = 8000
POOL = "default"
LIBVIRT_SOCK = "/run/libvirt/libvirt-sock"
# Where virsh and sushy-tools reach libvirtd: the system's, or a private one's socket
# (Libvirt(private=True) sets it).
URI = "qemu:///system"


class Libvirt:
    """virtlogd and libvirtd, ours (stopped by PID) unless one already answers: then theirs,
    used and left alone. private=True: always ours, with its own /run/libvirt (a directory of
    the run bound there in their mount namespaces) and pid files, so that it neither uses nor
    is used by another run's libvirtd, which another run may stop under it; virsh and
    sushy-tools reach it by its socket (URI)."""

    def __init__(self, tmp, private=False):
        self.tmp, self.procs, self.private = tmp, [], private
        self.pool = False  # whether we created the storage pool

    def answers(self):
        return subprocess.run(["virsh", "-c", URI, "version"],
                              capture_output=True, timeout=20).returncode == 0

    def start(self):
        global URI
        run_dir = os.path.join(self.tmp, "run-libvirt")
        if self.private:
            os.makedirs(run_dir)
            URI = f"qemu:///system?socket={run_dir}/libvirt-sock"
        elif os.path.exists(LIBVIRT_SOCK) and self.answers():
            return
        if subprocess.run(["id", "libvirt-qemu"], capture_output=True).returncode != 0:
            run(["adduser", "--system", "--group", "--no-create-home", "libvirt-qemu"],
                "adduser libvirt-qemu")
        # libvirtd sees no usable /dev/kvm (an empty file bound over it in its own mount
        # namespace): guests stall under KVM here, and so does libvirt's probe of QEMU with
        # KVM, which holds every capabilities call (sushy-tools makes them) for minutes.
        # Its QEMU then runs without libvirt's private /dev (qemu.conf `namespaces = []`,
        # bound over the system's file in the same namespace), which would copy that file.
        nokvm = os.path.join(self.tmp, "no-kvm")
        open(nokvm, "w").close()
        # The whole /etc/libvirt is a copy of the run's (Debian ships no qemu.conf without
        # libvirt-daemon-config-qemu): the domains defined live and die with the run too.
        etc = os.path.join(self.tmp, "etc-libvirt")
        shutil.copytree("/etc/libvirt", etc, symlinks=True)
        with open(os.path.join(etc, "qemu.conf"), "a") as f:
            f.write("\nnamespaces = []\n")
        argv = {"virtlogd": ["/usr/sbin/virtlogd"],
                "libvirtd": ["unshare", "-m", "--propagation", "private", "sh", "-c",
                             f"mount --bind {etc} /etc/libvirt && "
                             f"{{ [ ! -e /dev/kvm ] || mount --bind {nokvm} /dev/kvm; }} && "
                             "exec /usr/sbin/libvirtd"]}
        logd_sock = "/run/libvirt/virtlogd-sock"
        if self.private:
            own_run = f"mkdir -p /run/libvirt && mount --bind {run_dir} /run/libvirt && "
            argv = {"virtlogd": ["unshare", "-m", "--propagation", "private", "sh", "-c",
                                 own_run + f"exec /usr/sbin/virtlogd --pid-file "
                                 f"{self.tmp}/virtlogd.pid"],
                    "libvirtd": argv["libvirtd"][:-1] + [
                        own_run + argv["libvirtd"][-1] + f" --pid-file {self.tmp}/libvirtd.pid"]}
            logd_sock = os.path.join(run_dir, "virtlogd-sock")
        for prog in ("virtlogd", "libvirtd"):
            log = open(os.path.join(self.tmp, f"{prog}.log"), "ab")  # noqa: SIM115
            self.procs.append(subprocess.Popen(argv[prog], stdout=log,
                                               stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL,
                                               start_new_session=True))
            log.close()
            if prog == "virtlogd":
                wait_for("virtlogd", lambda: os.path.exists(logd_sock), 30)
        wait_for("libvirtd", self.answers, 60, interval=0.5)

    def storage_pool(self):
        """The storage pool sushy-tools' libvirt driver uploads virtual media into (its
        SUSHY_EMULATOR_STORAGE_POOL, `default`): a transient directory pool in the run's
        directory, made unless one exists."""
        if subprocess.run(["virsh", "-c", URI, "pool-info", POOL],
                          capture_output=True, timeout=60).returncode == 0:
            return
        path = os.path.join(self.tmp, "pool")
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o755)
        virsh("pool-create-as", POOL, "dir", "--target", path)
        self.pool = True

    def stop(self):
        if self.pool:
            virsh("pool-destroy", POOL, check=False)
            self.pool = False
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []


def virsh(*args, check=True):
    # Long: libvirtd probes QEMU's capabilities on first use, slow under TCG on busy cores.
    p = subprocess.run(["virsh", "-c", URI, *args], capture_output=True,
                       text=True, timeout=600)
    if check and p.returncode != 0:
        raise Failure(f"virsh {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout


DOMAIN = """<domain type='qemu'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='MiB'>{memory}</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <boot dev='{first}'/>
    <boot dev='hd'/>
    <bootmenu enable='no'/>
  </os>
  <features><acpi/><apic/></features>
  <cpu mode='custom' match='exact'><model fallback='allow'>qemu64</model></cpu>
  <on_reboot>restart</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='unsafe'/>
      <source file='{disk}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <target dev='hdc' bus='ide'/>
      <readonly/>
    </disk>
    <interface type='bridge'>
      <source bridge='{bridge}'/>
      <mac address='{mac}'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'>
      <source path='{console}' append='on'/>
      <target port='0'/>
    </serial>
    <console type='file'>
      <source path='{console}' append='on'/>
      <target type='serial' port='0'/>
    </console>
    <graphics type='vnc' listen='127.0.0.1' autoport='yes'/>
    <video><model type='cirrus'/></video>
  </devices>
</domain>
"""


class Host:
    """One VM: its domain (defined, shut off), disk, console file and boot MAC."""

    def __init__(self, tmp, tag, name, mac, bridge, disk_gib=5, memory=2048, pxe=True):
        """pxe: the NIC first in the boot order (host A); else the disk, and the BMC's virtual
        media sets the CD for the ramdisk's boots (host B)."""
        self.name = f"{tag}-{name}"
        self.short, self.mac = name, mac
        self.uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"e2e-provision/{self.name}"))
        vmdir = os.path.join(tmp, "vms")
        os.makedirs(vmdir, exist_ok=True)
        os.chmod(vmdir, 0o755)
        self.disk = os.path.join(vmdir, f"{name}.img")
        self.console = os.path.join(vmdir, f"{name}.console.log")
        with open(self.disk, "wb") as f:
            f.truncate(disk_gib << 30)
        open(self.console, "w").close()
        xml = DOMAIN.format(name=self.name, uuid=self.uuid, memory=memory, disk=self.disk,
                            first="network" if pxe else "hd", bridge=bridge, mac=mac,
                            console=self.console)
        path = os.path.join(vmdir, f"{name}.xml")
        with open(path, "w") as f:
            f.write(xml)
        virsh("define", path)

    def console_text(self):
        try:
            with open(self.console, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def destroy(self):
        virsh("destroy", self.name, check=False)
        virsh("undefine", self.name, check=False)


def start_sushy(topo, tmp, venv, users_file, ca_file):
    """sushy-emulator (Redfish) with the libvirt driver on bmc:8000, Basic auth from an
    htpasswd file; it fetches virtual media over TLS (requests, verify on), verified against
    ca_file: a client's CA bundle, which a CA rotation rewrites in place (requests reads it
    per connection)."""
    conf = os.path.join(tmp, "sushy.conf")
    with open(conf, "w") as f:
        f.write(f"SUSHY_EMULATOR_LISTEN_IP = {topo.ip('bmc')!r}\n"
                f"SUSHY_EMULATOR_LISTEN_PORT = {REDFISH_PORT}\n"
                f"SUSHY_EMULATOR_LIBVIRT_URI = {URI!r}\n"
                f"SUSHY_EMULATOR_AUTH_FILE = {users_file!r}\n"
                "SUSHY_EMULATOR_VMEDIA_VERIFY_SSL = True\n"
                "SUSHY_EMULATOR_IGNORE_BOOT_DEVICE = False\n")
    env = {**os.environ, "REQUESTS_CA_BUNDLE": ca_file, "SSL_CERT_FILE": ca_file}
    p = topo.start("bmc", "sushy-emulator", [os.path.join(venv, "bin", "sushy-emulator"),
                                              "--config", conf],
                   os.path.join(tmp, "bmc-sushy.log"), env=env)
    wait_listening(topo, "bmc", REDFISH_PORT, what="sushy-emulator")
    return p


def wait_console(host, marker, timeout, part=lambda text: text):
    """Waits until `marker` appears in `part` of a host's serial console; returns the seconds
    taken."""
    t0 = time.monotonic()
    wait_for(f"{marker!r} on {host.name}'s console", lambda: marker in part(host.console_text()),
             timeout, interval=1)
    return time.monotonic() - t0


def cleanup_vm_dir(tmp):
    shutil.rmtree(os.path.join(tmp, "vms"), ignore_errors=True)
