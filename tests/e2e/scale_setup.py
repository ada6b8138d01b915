"""Configuration of the scale e2e (tests/e2e/scale_e2e.py, docs/e2e.md "Scale"): Ironic as the
kit configures it, sushy-tools' fake system driver and fake-ipa in shards, and HAProxy for
`--compare haproxy`.

Addresses: 127.0.0.11-17, none of scripts/e2e's 127.0.0.1-4, so both can run at once.
"""

import hashlib
import os
import uuid

import harness as h

LB_HOST = "127.0.0.11"
IPS = ["127.0.0.12", "127.0.0.13", "127.0.0.14"]
IMAGE_IP = "127.0.0.15"  # the image server (tests/e2e/static_httpd.py), as ironic-image's httpd
IMAGE_PORT = 6180
SUSHY_IP = "127.0.0.16"
AGENT_IP = "127.0.0.17"
SUSHY_PORT = 8000  # shard k listens on SUSHY_PORT + k
AGENT_PORT = 9999  # fake-ipa's default; shard k listens on AGENT_PORT + k
# One sushy-tools and one fake-ipa process per shard. fake-ipa heartbeats from 2 threads that
# sleep after every agent they visit (fake_ipa/heartbeater.py), so one process carries about
# two heartbeats a second whatever its number of agents: shards keep an agent's heartbeats
# frequent enough for its commands to finish, as Metal3 runs several fake-ipa for scale.
SHARD_SIZE = 10
# Handed to the agents in the lookup answer (`heartbeat_timeout`); fake-ipa heartbeats every
# 0.3-0.6 of it, and an async command's result is only read at a heartbeat.
HEARTBEAT_TIMEOUT = 4
REDFISH_USER, REDFISH_PASSWORD = "admin", "password"


def set_base(base):
    """Moves every address to 127.0.0.<base>-<base+6> (default 11): two runs side by side, e.g.
    two modes under the same machine load."""
    global LB_HOST, IPS, IMAGE_IP, SUSHY_IP, AGENT_IP
    if not 5 <= base <= 248:
        raise ValueError(f"address base {base} outside 5..248")
    LB_HOST = f"127.0.0.{base}"
    IPS = [f"127.0.0.{base + i}" for i in (1, 2, 3)]
    IMAGE_IP, SUSHY_IP, AGENT_IP = (f"127.0.0.{base + i}" for i in (4, 5, 6))


def shards(n):
    return max(1, (n + SHARD_SIZE - 1) // SHARD_SIZE)


class Host:
    """One fake machine: its sushy-tools system, its boot MAC, its shard."""

    def __init__(self, i, shard):
        self.i = i
        self.name = f"scale-{i:04d}"
        self.uuid = str(uuid.UUID(int=0x5CA1E << 100 | i))
        self.mac = "52:54:%02x:%02x:%02x:%02x" % (0x10 + (i >> 24 & 0xFF), i >> 16 & 0xFF,
                                                   i >> 8 & 0xFF, i & 0xFF)  # fmt: skip
        self.shard = shard

    @property
    def redfish_address(self):
        return f"http://{SUSHY_IP}:{SUSHY_PORT + self.shard}"


def make_hosts(n):
    k = shards(n)
    return [Host(i, i % k) for i in range(n)]


def sushy_config(shard, hosts, state_dir):
    """sushy-tools' configuration (a Python file) for one shard, fake driver with its systems;
    each power change is notified to the shard's fake-ipa (EXTERNAL_NOTIFICATION_URL)."""
    systems = [
        {
            "uuid": x.uuid,
            "name": x.name,
            "power_state": "Off",
            "external_notifier": True,
            # Not loopback: Ironic's validate-interfaces hook skips loopback addresses.
            "nics": [{"mac": x.mac, "ip": "10.1.%d.%d" % (x.i // 200, x.i % 200 + 10)}],
        }
        for x in hosts
        if x.shard == shard
    ]
    return f"""# sushy-tools, fake driver, shard {shard} (written by tests/e2e/scale_setup.py).
SUSHY_EMULATOR_LISTEN_IP = "{SUSHY_IP}"
SUSHY_EMULATOR_LISTEN_PORT = {SUSHY_PORT + shard}
SUSHY_EMULATOR_FAKE_DRIVER = True
# The fake driver keeps its systems in a database (memoize.PersistentDict), by default in
# $TMPDIR/sushy-emulator, shared by every run: one of the run's own, so each starts powered off.
SUSHY_EMULATOR_STATE_DIR = "{state_dir}"
EXTERNAL_NOTIFICATION_URL = "http://{AGENT_IP}:{AGENT_PORT + shard}"
SUSHY_EMULATOR_FAKE_SYSTEMS = {systems!r}
"""


def fake_ipa_config(shard, api_url, ca):
    """fake-ipa's configuration (a Python file, fake_ipa/main.py reads it with
    `app.config.from_pyfile`): lookups, heartbeats and inspection data to api_url, verifying
    `ca` (FAKE_IPA_CAFILE, ironic_api_client.get_ssl_client_options); agents advertised on
    AGENT_IP so that Ironic's commands reach them over plain HTTP, as IPA's do."""
    return f"""# fake-ipa, shard {shard} (written by tests/e2e/scale_setup.py).
FAKE_IPA_API_URL = "{api_url}"
FAKE_IPA_INSPECTION_CALLBACK_URL = "{api_url}/v1/continue_inspection"
FAKE_IPA_ADVERTISE_ADDRESS_IP = "{AGENT_IP}"
FAKE_IPA_ADVERTISE_ADDRESS_PORT = {AGENT_PORT + shard}
SUSHY_FAKE_IPA_LISTEN_IP = "{AGENT_IP}"
SUSHY_FAKE_IPA_LISTEN_PORT = {AGENT_PORT + shard}
FAKE_IPA_INSECURE = False
FAKE_IPA_CAFILE = {ca!r}
# fake-ipa waits this long after a power-on notification (fake_agent.py: "waiting for ironic
# to unlock the node"): sushy-tools applies a power change 1-11 s after it is asked and Ironic
# holds the node until it sees it, and an inspection POST that arrives before the node waits
# is refused and never retried (the driver then inspects again, after Ironic's
# inspect_wait_timeout). The default 180-240 s models real hardware.
FAKE_IPA_MIN_BOOT_TIME = 30
FAKE_IPA_MAX_BOOT_TIME = 40
FAKE_IPA_REDFISH_URL = "http://{SUSHY_IP}:{SUSHY_PORT + shard}"
FAKE_IPA_REDFISH_USER = "{REDFISH_USER}"
FAKE_IPA_REDFISH_PASSWORD = "{REDFISH_PASSWORD}"
"""


def ironic_conf(inst, db_url, mode, public_url, tls_dir=None):
    """ironic.conf of one all-in-one instance, with the settings ironic-image renders
    (ironic-config/ironic.conf.j2 and scripts/ironic-common.sh defaults: redfish, agent
    inspection, fast track, automated cleaning with metadata erase only, deploy interface
    direct) and the kit's pairing (config/k8s/ironic.conf.fragment). mode: "proxy" (sockets
    behind the sidecar, JSON-RPC client through the egress), "direct" (plain TCP for both),
    "haproxy" (API plain TCP behind HAProxy, JSON-RPC over Ironic's own TLS, tls_dir)."""
    if mode == "proxy":
        api = f"unix_socket = {inst.api_sock}\nunix_socket_mode = 0660"
        rpc = (f"unix_socket = {inst.rpc_sock}\nunix_socket_mode = 0660\n"
               "use_ssl = false\nclient_use_ssl = false")  # fmt: skip
    else:
        api = f"host_ip = {inst.ip}\nport = {h.API_PORT}"
        rpc = f"host_ip = {inst.ip}\nuse_ssl = false\nclient_use_ssl = false"
        if mode == "haproxy":
            rpc = (f"host_ip = {inst.ip}\nuse_ssl = true\ncert_file = {tls_dir}/tls.crt\n"
                   f"key_file = {tls_dir}/tls.key\nclient_use_ssl = true\n"
                   f"cafile = {tls_dir}/ca.crt")  # fmt: skip
    d = inst.dir
    for sub in ("http", "tftp", "master", "tmp", "deploy-logs"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    return f"""# Ironic {inst.ip}, {mode} (written by tests/e2e/scale_setup.py).
[DEFAULT]
host = {inst.ip}
my_ip = {inst.ip}
auth_strategy = noauth
rpc_transport = json-rpc
debug = False
hash_ring_algorithm = sha256
enabled_hardware_types = redfish,fake-hardware
enabled_bios_interfaces = no-bios,redfish
enabled_boot_interfaces = ipxe,fake
enabled_console_interfaces = no-console
enabled_deploy_interfaces = direct,fake
enabled_firmware_interfaces = no-firmware,redfish
enabled_inspect_interfaces = no-inspect,agent,redfish
enabled_management_interfaces = redfish,fake
enabled_network_interfaces = noop
enabled_power_interfaces = redfish,fake
enabled_raid_interfaces = no-raid,agent,redfish
enabled_rescue_interfaces = no-rescue
enabled_storage_interfaces = noop
enabled_vendor_interfaces = no-vendor,redfish
default_inspect_interface = agent
default_network_interface = noop
tempdir = {d}/tmp

[agent]
deploy_logs_collect = always
deploy_logs_local_path = {d}/deploy-logs
max_command_attempts = 30
# fake-ipa advertises http:// (https only with a certificate of its own, and then Ironic's
# commands would bypass HTTP_PROXY, which covers http:// only): Ironic 39 refuses plain
# callback URLs unless this is false.
require_tls = false
# fake-ipa runs an async command (standby.power_off) only when Ironic next reads the command
# list, which Ironic does not while it waits for the power-off (it polls Redfish): every deploy
# would wait out 6 x 5 s and then power off hard. 2 x 5 s keeps that wait, shorter.
post_deploy_get_power_state_retries = 2

[api]
{api}
public_endpoint = {public_url}
ramdisk_heartbeat_timeout = {HEARTBEAT_TIMEOUT}

[conductor]
automated_clean = true
deploy_callback_timeout = 4800
node_history = False
power_state_change_timeout = 120
# Inspection data that fake-ipa posted too early is never posted again (see fake_ipa_config):
# the node then fails after this, and the driver inspects it again, as BMO retries.
inspect_wait_timeout = 240
file_url_allowed_paths = {d}/master,{os.path.dirname(d)}/images

[database]
connection = {db_url}

[deploy]
default_boot_option = local
erase_devices_metadata_priority = 10
erase_devices_priority = 0
http_root = {d}/http
http_url = http://{inst.ip}:6180
fast_track = true

[dhcp]
dhcp_provider = none

[inspector]
require_managed_boot = False
power_off = false
add_ports = all
keep_ports = present

[json_rpc]
auth_strategy = noauth
port = {h.RPC_PORT}
{rpc}

[nova]
send_power_notifications = false

[pxe]
boot_retry_timeout = 1200
images_path = {d}/tmp
tftp_root = {d}/tftp
tftp_master_path = {d}/tftp/master_images
instance_master_path = {d}/master

[redfish]
use_swift = false

[service_catalog]
# ironic-image: IRONIC_BASE_URL; the address agent inspection hands the ramdisk.
endpoint_override = {public_url}
"""


def image(root):
    """A small whole-disk image (raw, 8 KiB) and its sha256, for instance_info (served over
    HTTP as Metal3's images are: Ironic 39 cannot deploy a file:// image_source, its
    `images.is_source_a_path` reads `.url` of FileImageService's answer, a str), and the
    deploy kernel and ramdisk (file://, as ironic-image's DEPLOY_KERNEL_URL)."""
    images = os.path.join(root, "images")
    os.makedirs(images, exist_ok=True)
    files = {}
    for name, data in (("disk.img", b"\0" * 8192), ("kernel", b"\0" * 8192),
                       ("ramdisk", b"\0" * 8192)):  # fmt: skip
        path = os.path.join(images, name)
        with open(path, "wb") as f:
            f.write(data)
        files[name] = path
    files["sha256"] = hashlib.sha256(b"\0" * 8192).hexdigest()
    files["dir"] = images
    files["url"] = f"http://{IMAGE_IP}:{IMAGE_PORT}/disk.img"
    return files


def haproxy_config(lb_pem, stats_port, ips, threads=None):
    """HAProxy as the balancer and TLS front an operator would assemble: TLS on the balancer's
    address, least connections over the three Ironic APIs (plain HTTP), health checks as the
    proxy balancer's (GET / every 2 s), stats on loopback for the spread; `threads`: its
    `nbthread` (default: one per CPU)."""
    servers = "\n".join(
        f"  server i{ip.rsplit('.', 1)[1]} {ip}:{h.API_PORT} check inter 2s fall 2 rise 1"
        for ip in ips
    )
    return f"""# HAProxy for --compare haproxy (written by tests/e2e/scale_setup.py).
global
  maxconn 8000{f"{chr(10)}  nbthread {threads}" if threads else ""}
  log stdout format raw local0 info

defaults
  mode http
  log global
  option httplog
  timeout connect 5s
  timeout client 120s
  timeout server 120s
  option http-keep-alive
  retries 2
  option redispatch

frontend api
  bind {LB_HOST}:{h.LB_PORT} ssl crt {lb_pem} alpn http/1.1
  default_backend ironic

backend ironic
  balance leastconn
  option httpchk GET /
{servers}

frontend stats
  bind 127.0.0.1:{stats_port}
  stats enable
  stats uri /stats
"""
