"""A real iPXE in a QEMU virtual machine, for the boot-file end-to-end test (issue 33).

QEMU with TCG (no KVM: nested here, SeaBIOS often stalls at the option ROM banner under it),
SeaBIOS, and the iPXE option ROM of the NIC (Debian's `ipxe-qemu`), one virtio NIC with the MAC
we give it and `bootindex=1`, on QEMU's user-mode network: its DHCP hands out the boot file URL,
and the guest's connections to 10.0.2.2 land on the host's 127.0.0.1 (others, e.g. to
127.0.0.3, are made from the host to that address). No disk, no OS: iPXE fetches boot.ipxe,
chains the node's configuration and boots the kernel it names.

After its banner iPXE writes only to the VGA console. The console is read through QMP: the text
page at 0xb8000 (`pmemsave`; characters at even offsets, code page 437) polled every quarter
second with the VM paused for the read, merged into one transcript across scrolls, and a
`screendump` (PPM, converted to PNG without extra libraries) at the end.
"""

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time
import zlib

QEMU = "qemu-system-x86_64"
# QEMU 7.2 loads this ROM for virtio-net-pci (romfile default); Debian's ipxe-qemu ships it in
# the firmware path Debian's QEMU searches.
ROM = "/usr/lib/ipxe/qemu/efi-virtio.rom"
# E2E_BOOT_ACCEL=kvm tries KVM; TCG by default (see above).
ACCEL = os.environ.get("E2E_BOOT_ACCEL", "tcg")
ROWS, COLS = 25, 80
VGA_TEXT = 0xB8000


class VmError(Exception):
    """QEMU could not be started or driven."""


def require_qemu():
    """QEMU and the iPXE ROM, or VmError saying what is missing (the test fails, never skips)."""
    missing = [p for p in (QEMU,) if shutil.which(p) is None]
    if not os.path.exists(ROM):
        missing.append(ROM + " (Debian package ipxe-qemu)")
    if missing:
        raise VmError("missing: " + ", ".join(missing))
    return subprocess.run([QEMU, "--version"], capture_output=True, text=True).stdout.split("\n")[0]


class Qmp:
    """A QMP connection: one JSON command per line, its answer skipping events."""

    def __init__(self, path, timeout=10):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.file = self.sock.makefile("rwb")
        json.loads(self.file.readline())  # the greeting
        self.execute("qmp_capabilities")

    def execute(self, command, **arguments):
        self.file.write(json.dumps({"execute": command, "arguments": arguments}).encode() + b"\n")
        self.file.flush()
        while True:
            line = self.file.readline()
            if not line:
                raise VmError(f"QMP closed during {command}")
            answer = json.loads(line)
            if "error" in answer:
                raise VmError(f"QMP {command}: {answer['error']}")
            if "return" in answer:
                return answer["return"]

    def close(self):
        self.file.close()
        self.sock.close()


def vga_rows(path):
    """The 25 rows of an 80-column text page saved from 0xb8000 (character, attribute pairs)."""
    with open(path, "rb") as f:
        data = f.read()
    chars = data[0 : ROWS * COLS * 2 : 2]
    text = chars.decode("cp437").replace("\0", " ")  # a page never written holds zeros
    return [text[r * COLS : (r + 1) * COLS].rstrip() for r in range(ROWS)]


def merge(transcript, rows):
    """Appends the rows of a new screen that are not yet in the transcript. The screen scrolls,
    so the longest tail of the transcript that heads the new screen is skipped; the last line of
    that tail may have changed meanwhile (`http://…… ok` is written in two steps, and iPXE
    erases its "Press Ctrl-B" line), so it is replaced."""
    rows = list(rows)
    while rows and not rows[-1]:
        rows.pop()
    if not rows:
        return
    for k in range(min(len(transcript), len(rows)), 0, -1):
        tail = transcript[-k:]
        if tail[:-1] != rows[: k - 1]:
            continue
        # An overwritten last line is accepted only after two matching lines with text.
        if rows[k - 1].startswith(tail[-1]) or sum(1 for r in tail[:-1] if r) >= 2:
            transcript[-1] = rows[k - 1]
            transcript.extend(rows[k:])
            return
    transcript.extend(rows)


def unwrap(rows):
    """The transcript as text, with the lines the console wrapped at 80 columns joined again."""
    return "".join(r + ("" if len(r) == COLS else "\n") for r in rows)


def ppm_to_png(src, dst):
    """A binary PPM (P6, what QEMU's screendump writes) as an 8-bit RGB PNG."""
    with open(src, "rb") as f:
        magic, width, height, _maxval, pixels = f.read().split(maxsplit=4)
    if magic != b"P6":
        raise VmError(f"{src}: not a binary PPM")
    w, h = int(width), int(height)
    raw = b"".join(b"\0" + pixels[y * w * 3 : (y + 1) * w * 3] for y in range(h))

    def chunk(kind, data):
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    with open(dst, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 6)))
        f.write(chunk(b"IEND", b""))


class Boot:
    """What one VM showed: the console transcript, when each awaited text first appeared
    (seconds from QEMU's start), the screenshot files and the wall-clock window."""

    def __init__(self, name):
        self.name = name
        self.transcript = []
        self.seen = {}  # text -> seconds after start
        self.started = self.ended = None  # time.time()
        self.png = self.ppm = None
        self.serial = ""  # the serial console, control sequences removed

    def text(self):
        return "\n".join(self.transcript)


def serial_text(path):
    """The serial console as text: iPXE's cursor moves and colours removed, CR dropped."""
    try:
        with open(path, "rb") as f:
            raw = f.read().decode("cp437", errors="replace")
    except OSError:
        return ""
    raw = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw).replace("\x08 \x08", "")
    return raw.replace("\r", "")


def boot(directory, name, mac, bootfile, until, timeout=90, then=(), rom=None):
    """Runs one VM until every text in `until` was on its console, and then for the texts in
    `then` (what the firmware does next) for at most 10 s more; kills it (its pid only) after
    `timeout` s in any case. Returns a Boot; VmError if QEMU would not start. `rom`: the NIC's
    option ROM instead of QEMU's default (the pinned HTTPS iPXE, which also writes to the
    serial port: its lines are searched and kept too, in `Boot.serial`)."""
    d = os.path.join(directory, name)
    os.makedirs(d, exist_ok=True)
    qmp_path, vga = os.path.join(d, "qmp.sock"), os.path.join(d, "vga.bin")
    argv = [
        QEMU, "-accel", ACCEL, "-m", "256", "-nodefaults", "-vga", "std", "-display", "none",
        "-serial", "file:" + os.path.join(d, "serial.log"), "-no-reboot",
        "-qmp", f"unix:{qmp_path},server=on,wait=off",
        "-netdev", f"user,id=n0,bootfile={bootfile}",
        "-device", f"virtio-net-pci,netdev=n0,mac={mac},bootindex=1"
        + (f",romfile={rom}" if rom else ""),
    ]  # fmt: skip
    serial = os.path.join(d, "serial.log")
    result = Boot(name)
    with open(os.path.join(d, "qemu.log"), "wb") as log:
        result.started = time.time()
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    qmp = None
    try:
        deadline = t0 + timeout
        while qmp is None:
            if proc.poll() is not None:
                raise VmError(f"QEMU exited {proc.returncode}: see {d}/qemu.log")
            try:
                qmp = Qmp(qmp_path)
            except OSError:
                if time.monotonic() > t0 + 10:
                    raise VmError(f"no QMP socket after 10 s ({d})") from None
                time.sleep(0.05)
        wanted = list(until) + list(then)
        then_deadline = None
        while time.monotonic() < deadline and proc.poll() is None:
            # Paused while it is read: a page saved during a scroll mixes two screens.
            qmp.execute("stop")
            qmp.execute("pmemsave", val=VGA_TEXT, size=ROWS * COLS * 2, filename=vga)
            qmp.execute("cont")
            now = time.monotonic() - t0
            merge(result.transcript, vga_rows(vga))
            result.serial = serial_text(serial)
            screen = unwrap(result.transcript) + "\n" + result.serial
            for text in wanted:
                if text not in result.seen and text in screen:
                    result.seen[text] = now
            if all(t in result.seen for t in until):
                if then_deadline is None:
                    then_deadline = time.monotonic() + 10
                if all(t in result.seen for t in then) or time.monotonic() > then_deadline:
                    break
            time.sleep(0.25)
        result.ppm = os.path.join(d, "screen.ppm")
        qmp.execute("screendump", filename=result.ppm)
        result.png = os.path.join(d, "screen.png")
        ppm_to_png(result.ppm, result.png)
    finally:
        result.ended = time.time()
        result.serial = serial_text(serial)
        if qmp is not None:
            qmp.close()
        proc.kill()
        proc.wait(timeout=10)
        with open(os.path.join(d, "console.txt"), "w") as f:
            f.write(result.text() + "\n")
    return result
