"""A tiny bootable whole-disk image: an MBR whose boot code writes a marker line to the first
serial port (COM1, 0x3f8) and halts, with one partition (so that IPA can add its config drive
partition after it, as on any partitioned whole-disk image). 2 MiB, raw."""

import hashlib
import struct

SECTOR = 512
PART_START, PART_SECTORS = 2048, 2048  # 1 MiB aligned, 1 MiB long


def boot_code(marker):
    """Real-mode code loaded at 0x7c00 by the BIOS: DS = 0, then out each byte of the message
    to 0x3f8 until the NUL, then cli; hlt forever."""
    msg = f"\r\n{marker}\r\n".encode() + b"\0"
    code = bytes([
        0x31, 0xC0,              # xor ax, ax
        0x8E, 0xD8,              # mov ds, ax
        0xBE, 0x16, 0x7C,        # mov si, 0x7c16 (the message, at offset 22)
        0xAC,                    # lodsb
        0x84, 0xC0,              # test al, al
        0x74, 0x06,              # jz halt
        0xBA, 0xF8, 0x03,        # mov dx, 0x3f8
        0xEE,                    # out dx, al
        0xEB, 0xF5,              # jmp lodsb
        0xFA,                    # halt: cli
        0xF4,                    # hlt
        0xEB, 0xFC,              # jmp halt
    ])  # fmt: skip
    assert len(code) == 22
    out = code + msg
    if len(out) > 446:
        raise ValueError("marker too long for the boot sector")
    return out.ljust(446, b"\0")


def make(path, marker):
    """Writes the image; returns (size, sha256 hex)."""
    entry = struct.pack("<B3sB3sII", 0x00, b"\xfe\xff\xff", 0x83, b"\xfe\xff\xff",
                        PART_START, PART_SECTORS)  # fmt: skip
    mbr = boot_code(marker) + entry + b"\0" * 48 + b"\x55\xaa"
    size = (PART_START + PART_SECTORS) * SECTOR
    # The partition's first bytes: a recognisable payload, so a short write shows.
    payload = (marker.encode() + b"\n") * 64
    data = mbr + b"\0" * (PART_START * SECTOR - SECTOR) + payload
    data = data.ljust(size, b"\0")
    with open(path, "wb") as f:
        f.write(data)
    return size, hashlib.sha256(data).hexdigest()


def disk_matches(disk_path, image_path):
    """Whether the disk holds the image: boot code, the image's own partition entry, and every
    byte after the MBR; the rest of the partition table may hold IPA's config drive entry and
    the disk identifier may be set.
    Returns (ok, detail)."""
    image = open(image_path, "rb").read()
    with open(disk_path, "rb") as f:
        disk = f.read(len(image))
    # Bytes 440-445 are the disk identifier, which partitioning tools write (IPA's config
    # drive partition): not the image's content.
    parts = {"boot code": (0, 440), "partition 1 entry": (446, 462),
             "after the MBR": (SECTOR, len(image))}
    bad = [k for k, (a, b) in parts.items() if disk[a:b] != image[a:b]]
    body = hashlib.sha256(disk[SECTOR:]).hexdigest()
    want = hashlib.sha256(image[SECTOR:]).hexdigest()
    return not bad, (f"sha256 after the MBR {body[:16]} (image {want[:16]})" +
                     (f"; differs: {', '.join(bad)}" if bad else ""))
