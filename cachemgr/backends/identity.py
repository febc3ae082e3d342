"""Stable identities of block devices.

Kernel names (``sdb``, ``bcache0``, ``dm-3``) change across boots and hotplug: a re-inserted SSD
can come back as another ``sdX`` (docs/kernel-notes.md, "SCSI and NVMe hotplug"). What
survives is the serial, the WWN, the udev ``/dev/disk/by-id`` links and the superblock
UUID. :func:`identify` gathers them into the model's :class:`~cachemgr.core.model.Identity` from
four sources, each turned into typed data where it is read:

1. **sysfs** (:func:`cachemgr.backends.bcache.identity`): size, ``dev``, rotational,
   partition parent, and the kernel's ``device/wwid``, ``device/serial`` (7.2; absent on
   6.1), ``device/model``.
2. **the udev database** through pyudev (:func:`udev_info`), only once udevd has processed the
   device (``USEC_INITIALIZED``; pyudev enumerates /sys without udevd, but then has no ``ID_*``
   properties: docs/kernel-notes.md, "udev and pyudev"): ``ID_SCSI_SERIAL`` /
   ``ID_SERIAL_SHORT`` / ``ID_SERIAL``, ``ID_WWN_WITH_EXTENSION`` / ``ID_WWN``, ``ID_PATH``,
   ``ID_FS_TYPE``, ``ID_FS_UUID`` and the device links.
3. **libblkid** through pylibblkid (:func:`probe_superblock`): the superblock's TYPE and UUID
   (a bcache cache or backing device shows ``TYPE=bcache``, ``UUID`` = its ``dev.uuid``).
4. **SCSI VPD pages** (:func:`parse_vpd_pg80`, :func:`parse_vpd_pg83`): the unit serial number
   and the designators the kernel builds ``wwid`` from, read when sysfs and udev gave none
   (older kernels have no ``device/serial``).

Precedence follows lsblk (util-linux lsblk-properties.c), so that ``lsblk -o SERIAL,WWN``
agrees with us with and without udevd: serial = ``ID_SCSI_SERIAL``, ``ID_SERIAL_SHORT``,
``ID_SERIAL``, then the kernel's; WWN = ``ID_WWN_WITH_EXTENSION``, ``ID_WWN``, then the
kernel's ``wwid``. On the 7.2 lab kernel a scsi_debug disk reads the same either way: serial
``2000`` (udev ``ID_SCSI_SERIAL=2000``, sysfs ``device/serial`` ``2000``, VPD 0x80 ``2000``),
WWN ``naa.33333330000007d0`` (udev ``ID_WWN=0x33333330000007d0``, sysfs ``device/wwid``
``naa.33333330000007d0``). Note that udev's ``ID_SERIAL`` for a SCSI disk is *not* the unit
serial but page 0x83's designator (``333333330000007d0``: type digit + NAA hex, scsi_id).

WWNs are kept in the kernel's ``wwid`` form (``naa.<hex>``, ``eui.<hex>``, ``t10.<text>``):
:func:`normalize_wwn` maps udev's ``0x<hex>`` and the by-id ``wwn-0x<hex>`` onto it.

Nothing here names the sysfs mount point: every kernel file is read through a
:class:`~cachemgr.core.sysfs.Sysfs`. pyudev and libblkid look at the live system, so they are used
only when that Sysfs is the live one (``udev=AUTO``, ``probe=AUTO``); tests pass lookups built
from a capture (:func:`parse_udev_db`) instead.
"""

from __future__ import annotations

import enum
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from cachemgr.backends import bcache
from cachemgr.core.errors import KernelFormatError, UsageError
from cachemgr.core.model import Identity
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)

BY_ID = "/dev/disk/by-id/"
NO_DEVICE_HINT = "lsblk -o NAME,SERIAL,WWN,MODEL lists the disks with their serials and WWNs"


# ---------------------------------------------------------------------------------------
# WWNs


_HEX = re.compile(r"^[0-9a-fA-F]+$")
_WWN_LIKE = re.compile(
    r"^(?:(?:naa|eui)\.[0-9a-f]{16}(?:[0-9a-f]{8}|[0-9a-f]{16})?"  # naa.<16|32>, eui.<16|24|32>
    r"|(?:wwn-)?0x[0-9a-f]{16}(?:[0-9a-f]{16})?"  # udev ID_WWN(_WITH_EXTENSION), by-id name
    r"|t10\..+|nvme\..+)$",
    re.IGNORECASE,
)


def normalize_wwn(text: str | None) -> str | None:
    """A WWN in the kernel's ``wwid`` form, or None for an empty value.

    Accepted: the kernel's ``naa.33333330000007d0`` / ``eui.0025385b71b07a3c`` (hex lowered),
    udev's ``ID_WWN`` / ``ID_WWN_WITH_EXTENSION`` ``0x33333330000007d0`` (an NAA, as scsi_id
    and ata_id only set it for NAA designators), the by-id link name
    ``wwn-0x33333330000007d0``, and the text forms ``t10.…`` / ``nvme.…`` (kept as they are:
    their case is significant). NUL padding and whitespace around are dropped (a SCSI name
    string designator is NUL-padded to a multiple of 4 bytes).
    """
    if text is None:
        return None
    t = text.strip().strip("\0").strip()
    if not t:
        return None
    low = t.lower()
    if low.startswith("wwn-"):
        t, low = t[4:], low[4:]
    if low.startswith("0x") and _HEX.match(low[2:]):
        return "naa." + low[2:]
    if low.startswith(("naa.", "eui.")) and _HEX.match(low[4:]):
        return low
    return t


def looks_like_wwn(text: str) -> bool:
    """True for the forms :func:`normalize_wwn` knows (what an admin may paste as a WWN)."""
    return bool(_WWN_LIKE.match(text.strip()))


# ---------------------------------------------------------------------------------------
# SCSI VPD pages (SPC-5 7.7.4 Device Identification, 7.7.18 Unit Serial Number)


def _page(data: bytes, code: int, what: str) -> bytes:
    """The payload of a VPD page after its 4-byte header, checked.

    Header: byte 0 peripheral qualifier/device type, byte 1 the page code, bytes 2-3 the page
    length (big-endian) not counting the header. The kernel's ``vpd_pgXX`` attribute is the
    page exactly as the device returned it (scsi_get_vpd_buf: header + page length), so a page
    shorter than its length is corrupt; bytes after it are ignored.
    """
    if len(data) < 4:
        raise KernelFormatError(f"{what} ({len(data)} bytes, shorter than its header)",
                                data.hex(" "))
    if data[1] != code:
        raise KernelFormatError(f"{what} (page code 0x{data[1]:02x}, not 0x{code:02x})",
                                data.hex(" "))
    length = int.from_bytes(data[2:4], "big")
    if 4 + length > len(data):
        raise KernelFormatError(
            f"{what} (page length {length} but {len(data) - 4} bytes follow the header)",
            data.hex(" "))
    return data[4:4 + length]


def parse_vpd_pg80(data: bytes) -> str:
    """The unit serial number from a ``device/vpd_pg80`` page ("" when the device has none).

    Sample (7.2 lab, scsi_debug target 0, ``od -c``)::

        \\0 200 \\0 004   2   0   0   0        -> "2000"

    that is ``00 80 00 04`` (type 0, page 0x80, length 4) then the ASCII serial. SPC says the
    serial is right-aligned ASCII; devices pad it with spaces (either side) or NULs, which are
    dropped, as the kernel's own ``device/serial`` does (scsi_vpd_lun_serial). Raises
    KernelFormatError, with the page in hex, for a short or truncated page, a wrong page code
    or a byte that is not printable ASCII.
    """
    payload = _page(data, 0x80, "VPD page 0x80")
    text = payload.strip(b"\0 \t\r\n")
    if any(b < 0x20 or b > 0x7E for b in text):
        raise KernelFormatError("VPD page 0x80 (serial is not printable ASCII)", data.hex(" "))
    return text.decode("ascii")


# Designator fields (SPC-5 table 586)
CODE_SET_BINARY, CODE_SET_ASCII, CODE_SET_UTF8 = 1, 2, 3
ASSOC_LUN, ASSOC_TARGET_PORT, ASSOC_TARGET_DEVICE = 0, 1, 2
TYPE_VENDOR, TYPE_T10, TYPE_EUI64, TYPE_NAA = 0, 1, 2, 3
TYPE_RELATIVE_PORT, TYPE_PORT_GROUP, TYPE_LU_GROUP, TYPE_MD5 = 4, 5, 6, 7
TYPE_SCSI_NAME, TYPE_PROTOCOL_PORT, TYPE_UUID = 8, 9, 10


@dataclass(frozen=True)
class Designator:
    """One designation descriptor of VPD page 0x83.

    Descriptor layout: byte 0 protocol identifier (high nibble) and code set (low nibble);
    byte 1 PIV (bit 7), association (bits 5-4) and designator type (bits 3-0); byte 2
    reserved; byte 3 the designator's length; then the designator.
    """

    protocol: int
    code_set: int
    piv: bool
    association: int
    type: int
    value: bytes

    def encode(self) -> bytes:
        """The descriptor's bytes (the inverse of the parser; tests build pages with it)."""
        return bytes([
            (self.protocol & 0xF) << 4 | (self.code_set & 0xF),
            (0x80 if self.piv else 0) | (self.association & 0x3) << 4 | (self.type & 0xF),
            0,
            len(self.value),
        ]) + self.value

    def render(self) -> str | None:
        """The designator as the kernel writes it in ``wwid`` (scsi_vpd_lun_id), if it can.

        NAA 8/16 bytes -> ``naa.<hex>``; EUI-64 8/12/16 bytes -> ``eui.<hex>``; T10 vendor ID
        -> ``t10.<text>`` (the kernel's ``%pE`` escapes non-printable bytes; here as octal
        ``\\ooo``); SCSI name string -> its text (it carries its own ``naa.``/``eui.``/``iqn.``
        prefix), NUL padding dropped. Other types and lengths: None.
        """
        v = self.value
        if self.type == TYPE_NAA and len(v) in (8, 16):
            return "naa." + v.hex()
        if self.type == TYPE_EUI64 and len(v) in (8, 12, 16):
            return "eui." + v.hex()
        if self.type == TYPE_T10 and v:
            return "t10." + "".join(chr(b) if 0x20 <= b < 0x7F else f"\\{b:03o}" for b in v)
        if self.type == TYPE_SCSI_NAME and v:
            return v.rstrip(b"\0").decode("utf-8", errors="replace") or None
        return None


def parse_vpd_pg83(data: bytes) -> tuple[Designator, ...]:
    """The designation descriptors of a ``device/vpd_pg83`` page, in page order.

    Sample (7.2 lab, scsi_debug target 0 with ``vpd_use_hostno=0``)::

        00 83 00 70                                 header: page 0x83, 112 bytes
        02 01 00 1c "Linux   scsi_debug      2000"  ASCII, LUN, T10 vendor ID
        01 03 00 08 33 33 33 30 00 00 07 d0         binary, LUN, NAA -> naa.33333330000007d0
        61 94 00 04 00 00 00 01                     SAS, PIV, target port, relative port 1
        61 93 00 08 32 22 22 20 00 00 07 ce         SAS, PIV, target port, NAA
        61 95 00 04 00 00 01 00                     SAS, PIV, target port, port group
        61 a3 00 08 32 22 22 20 00 00 07 cd         SAS, PIV, target device, NAA
        63 a8 00 18 "naa.32222220000007CD" 00 * 4   UTF-8, target device, SCSI name string

    Raises KernelFormatError, with the page in hex, for a short or truncated page, a wrong
    page code, or a descriptor that runs past the page's end (the kernel's own walk stops
    there since 2025, "scsi: Bound VPD page 0x83 walks"; here it is an error, not a guess).
    """
    payload = _page(data, 0x83, "VPD page 0x83")
    out = []
    off = 0
    while off < len(payload):
        if len(payload) - off < 4:
            raise KernelFormatError(
                f"VPD page 0x83 (descriptor header at offset {off + 4} is cut short)",
                data.hex(" "))
        b0, b1, n = payload[off], payload[off + 1], payload[off + 3]
        if off + 4 + n > len(payload):
            raise KernelFormatError(
                f"VPD page 0x83 (descriptor at offset {off + 4} runs past the page end)",
                data.hex(" "))
        out.append(Designator(
            protocol=b0 >> 4,
            code_set=b0 & 0xF,
            piv=bool(b1 & 0x80),
            association=(b1 >> 4) & 0x3,
            type=b1 & 0xF,
            value=bytes(payload[off + 4:off + 4 + n]),
        ))
        off += 4 + n
    return tuple(out)


def _designator_prio(d: Designator) -> int:
    """The kernel's designator_prio() (drivers/scsi/scsi_lib.c, since 5.11)."""
    if d.association != ASSOC_LUN or not d.value:
        return 0
    if d.type == TYPE_SCSI_NAME:
        return 9
    if d.type == TYPE_NAA:
        return {6: 8, 5: 5, 4: 4, 3: 1}.get(d.value[0] >> 4, 0)
    if d.type == TYPE_EUI64:
        return {16: 7, 12: 6, 8: 3}.get(len(d.value), 0)
    if d.type == TYPE_T10:
        return 1
    return 0


def kernel_wwid(designators: Iterable[Designator]) -> str | None:
    """The identifier the kernel shows in ``device/wwid``, chosen from page 0x83.

    scsi_vpd_lun_id(): only LUN designators count; the order of preference is SCSI name
    string, NAA registered extended, EUI-64 16 and 12 bytes, NAA registered, NAA extended,
    EUI-64 8 bytes, then T10 vendor ID and NAA locally assigned; of equal priority the later
    one wins (so on scsi_debug the locally assigned NAA after the T10 ID is the wwid).
    """
    cur_prio, cur_size = 0, 0
    chosen: str | None = None
    for d in designators:
        prio = _designator_prio(d)
        if prio == 0 or cur_prio > prio:
            continue
        if d.type in (TYPE_T10, TYPE_SCSI_NAME) and cur_size > len(d.value):
            continue
        cur_prio, cur_size = prio, len(d.value)
        rendered = d.render()
        if rendered is not None:
            chosen = rendered
    return chosen


# ---------------------------------------------------------------------------------------
# udev


_UDEV_ESC = re.compile(rb"\\x([0-9a-fA-F]{2})")


def _udev_decode(text: str) -> str:
    """udev's ``*_ENC`` values escape bytes as ``\\xNN`` (``scsi_debug\\x20\\x20``)."""
    raw = _UDEV_ESC.sub(lambda m: bytes([int(m.group(1), 16)]), text.encode())
    return raw.decode(errors="replace")


def _nonempty(text: str | None) -> str | None:
    if text is None:
        return None
    return text.strip() or None


@dataclass(frozen=True)
class UdevInfo:
    """What udevd recorded for a block device (its database, ``udevadm info``)."""

    serial: str | None = None  # ID_SERIAL: for SCSI the page 0x83 id, for ATA model_serial
    serial_short: str | None = None  # ID_SERIAL_SHORT
    scsi_serial: str | None = None  # ID_SCSI_SERIAL: the unit serial number (VPD 0x80)
    wwn: str | None = None  # ID_WWN_WITH_EXTENSION or ID_WWN, in the kernel's form
    path: str | None = None  # ID_PATH (the by-path name)
    model: str | None = None  # ID_MODEL_ENC decoded, else ID_MODEL (spaces as "_")
    fs_type: str | None = None  # ID_FS_TYPE
    fs_uuid: str | None = None  # ID_FS_UUID
    links: tuple[str, ...] = ()  # every /dev link udev made (DEVLINKS), sorted

    @classmethod
    def from_properties(cls, props: Mapping[str, str], links: Iterable[str] = ()) -> UdevInfo:
        """Build from udev properties (pyudev's ``Device.properties``, ``udevadm info`` E:)."""
        model_enc = props.get("ID_MODEL_ENC")
        all_links = set(links) | set((props.get("DEVLINKS") or "").split())
        return cls(
            serial=_nonempty(props.get("ID_SERIAL")),
            serial_short=_nonempty(props.get("ID_SERIAL_SHORT")),
            scsi_serial=_nonempty(props.get("ID_SCSI_SERIAL")),
            wwn=normalize_wwn(props.get("ID_WWN_WITH_EXTENSION") or props.get("ID_WWN")),
            path=_nonempty(props.get("ID_PATH")),
            model=_nonempty(_udev_decode(model_enc) if model_enc else props.get("ID_MODEL")),
            fs_type=_nonempty(props.get("ID_FS_TYPE")),
            fs_uuid=_nonempty(props.get("ID_FS_UUID")),
            links=tuple(sorted(all_links)),
        )

    @property
    def by_id(self) -> tuple[str, ...]:
        return tuple(link for link in self.links if link.startswith(BY_ID))

    @property
    def unit_serial(self) -> str | None:
        """The serial as lsblk shows it: ID_SCSI_SERIAL, ID_SERIAL_SHORT, then ID_SERIAL."""
        return self.scsi_serial or self.serial_short or self.serial


UdevLookup = Callable[[str], UdevInfo | None]


def parse_udev_db(text: str) -> dict[str, UdevInfo]:
    """Kernel name -> UdevInfo from ``udevadm info --export-db`` (block devices only).

    Records are separated by blank lines; each line is ``X: value``. Sample (7.2 lab,
    udev 252)::

        P: /devices/pseudo_0/adapter0/host0/target0:0:0/0:0:0:0/block/sda
        M: sda
        U: block
        N: sda
        S: disk/by-id/wwn-0x33333330000007d0
        E: ID_SCSI_SERIAL=2000
        E: ID_WWN=0x33333330000007d0

    ``S:`` links are relative to /dev; ``E:`` lines are properties. Other letters (``T:``,
    ``D:``, ``L:``, ``Q:``, ``R:``, ``I:``, ``V:``...) come and go between udev versions and
    are ignored. A line without the ``X: `` shape raises KernelFormatError.
    """
    out: dict[str, UdevInfo] = {}
    for record in re.split(r"\n\s*\n", text):
        props: dict[str, str] = {}
        links: list[str] = []
        fields: dict[str, str] = {}
        for line in record.splitlines():
            if not line.strip():
                continue
            if len(line) < 3 or line[1:3] != ": " or not line[0].isalpha():
                raise KernelFormatError("udev database line", line)
            key, value = line[0], line[3:]
            if key == "E":
                k, sep, v = value.partition("=")
                if not sep:
                    raise KernelFormatError("udev database property", line)
                props[k] = v
            elif key == "S":
                links.append("/dev/" + value)
            else:
                fields[key] = value
        if not fields and not props:
            continue
        if fields.get("U", props.get("SUBSYSTEM")) != "block":
            continue
        name = fields.get("N") or fields.get("M") or os.path.basename(fields.get("P", ""))
        if name:
            out[name] = UdevInfo.from_properties(props, links)
    return out


_context: object | None = None


def udev_info(name: str) -> UdevInfo | None:
    """What udevd recorded for block device ``name``, through pyudev; None when it has nothing.

    pyudev finds the device in /sys even without udevd, but then ``is_initialized`` is false
    and its properties are only the kernel's uevent (DEVNAME, MAJOR...): that is "no udev
    data" here, never an empty identity (docs/kernel-notes.md, "udev and pyudev"; seen in
    the lab without ``--udev``).
    """
    global _context
    try:
        import pyudev

        if _context is None:
            _context = pyudev.Context()
        dev = pyudev.Devices.from_name(_context, "block", name)
        if not dev.is_initialized:
            return None
        return UdevInfo.from_properties(dict(dev.properties), tuple(dev.device_links))
    except (ImportError, LookupError, OSError, ValueError) as exc:
        log.debug("udev: no data for %s: %s", name, exc)
        return None


# ---------------------------------------------------------------------------------------
# libblkid


@dataclass(frozen=True)
class Superblock:
    """What libblkid found on a device (``blkid -p``): TYPE, UUID, LABEL, USAGE, VERSION."""

    type: str | None = None
    uuid: str | None = None
    label: str | None = None
    usage: str | None = None
    version: str | None = None
    pttype: str | None = None  # PTTYPE (gpt, dos), with partitions probed (probe_signature)
    ptuuid: str | None = None  # PTUUID

    def words(self) -> str:
        """What it is, as an admin compares it: "ext4 UUID 1b2c...", "gpt PTUUID 9f..."."""
        parts = [f"{self.type} UUID {self.uuid}" if self.type and self.uuid else
                 self.type or "", f"{self.pttype} PTUUID {self.ptuuid}" if self.pttype
                 and self.ptuuid else self.pttype or ""]
        return ", ".join(p for p in parts if p) or "no signature"

    @classmethod
    def from_probe(cls, values: Mapping[str, bytes | str]) -> Superblock:
        """From ``dict(probe)`` (pylibblkid gives bytes values) or ``blkid -o export`` text."""

        def get(key: str) -> str | None:
            v = values.get(key)
            if isinstance(v, bytes):
                v = v.decode(errors="replace")
            return _nonempty(v)

        return cls(type=get("TYPE"), uuid=get("UUID"), label=get("LABEL"),
                   usage=get("USAGE"), version=get("VERSION"), pttype=get("PTTYPE"),
                   ptuuid=get("PTUUID"))


Prober = Callable[[str], Superblock | None]


def probe_superblock(node: str) -> Superblock | None:
    """libblkid's safe probe of ``node`` for a superblock; None if none or unreadable.

    Read-only and non-exclusive (O_RDONLY), so it works on a device bcache holds. A safe
    probe refuses ambivalent results (two signatures); that too reads as None.
    """
    try:
        import blkid

        probe = blkid.Probe()
        probe.set_device(node)
        probe.enable_superblocks(True)
        probe.set_superblocks_flags(blkid.SUBLKS_TYPE | blkid.SUBLKS_UUID | blkid.SUBLKS_LABEL
                                    | blkid.SUBLKS_USAGE | blkid.SUBLKS_VERSION)
        if not probe.do_safeprobe():
            return None
        return Superblock.from_probe(dict(probe))
    except (ImportError, OSError, RuntimeError) as exc:
        # pylibblkid raises OSError when open() fails, RuntimeError when libblkid fails
        log.debug("blkid: cannot probe %s: %s", node, exc)
        return None


def probe_signature(node: str) -> Superblock | None:
    """What ``node`` holds as ``blkid -p`` shows it: a superblock (file system, LVM PV,
    RAID member) or a partition table (PTTYPE, PTUUID); an empty :class:`Superblock` when
    it holds none, None when it cannot be read. Read-only, as :func:`probe_superblock`."""
    try:
        import blkid

        probe = blkid.Probe()
        probe.set_device(node)
        probe.enable_superblocks(True)
        probe.set_superblocks_flags(blkid.SUBLKS_TYPE | blkid.SUBLKS_UUID | blkid.SUBLKS_LABEL
                                    | blkid.SUBLKS_USAGE | blkid.SUBLKS_VERSION)
        probe.enable_partitions(True)
        found = probe.do_safeprobe()
        return Superblock.from_probe(dict(probe)) if found else Superblock()
    except (ImportError, OSError, RuntimeError) as exc:
        log.debug("blkid: cannot probe %s: %s", node, exc)
        return None
    finally:
        drop_page_cache(node)


def drop_page_cache(node: str) -> None:
    """Drop the clean pages libblkid's buffered reads left in ``node``'s page cache. The
    node probed may be a dm-cache origin under a live cache: writes through the cache reach
    the origin below its page cache, so pages read now go stale, and whoever opens the
    origin later (after ``remove --keep-device``, say) would read the old blocks from them
    (lab, UML 7.2, 2026-11-28: test_remove_refused_in_use_then_keep_device read a space
    where the origin held a zero byte after a create that probed it).
    POSIX_FADV_DONTNEED on a block device drops its clean cached pages in the range."""
    try:
        fd = os.open(node, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as exc:
        log.debug("%s: page cache not dropped: %s", node, exc)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------
# identify


class Auto(enum.Enum):
    """Use the live source (pyudev / libblkid) if the Sysfs is the live /sys, else none."""

    AUTO = "auto"


AUTO = Auto.AUTO
UdevArg = UdevLookup | Literal[Auto.AUTO] | None
ProbeArg = Prober | Literal[Auto.AUTO] | None
# the text of a /proc file; AUTO: read it on the live system, skip it on a capture
ProcText = str | Literal[Auto.AUTO] | None


def id_words(wwid: str | None, serial: str | None) -> str:
    """A disk's identity for a message: ``naa.…, serial X`` (what it has of the two)."""
    return ", ".join(x for x in (wwid, f"serial {serial}" if serial else None) if x)


def _udev_lookup(sysfs: Sysfs, udev: UdevArg) -> UdevLookup | None:
    if udev is AUTO:
        return udev_info if sysfs.live else None
    return udev


def _prober(sysfs: Sysfs, probe: ProbeArg) -> Prober | None:
    if probe is AUTO:
        return probe_superblock if sysfs.live else None
    return probe


def read_bytes(sysfs: Sysfs, rel: str) -> bytes | None:
    """A binary sysfs attribute (the vpd pages), or None when missing or unreadable.

    Sysfs.read decodes text with errors="replace", which would corrupt a binary page.
    """
    return sysfs.read_bytes(rel)


def vpd_serial(sysfs: Sysfs, rel: str) -> str | None:
    """The unit serial from ``<rel>/device/vpd_pg80``; None when absent, empty or malformed."""
    data = read_bytes(sysfs, f"{rel}/device/vpd_pg80")
    if not data:
        return None
    try:
        return parse_vpd_pg80(data) or None
    except KernelFormatError as exc:
        log.warning("%s: %s", rel, exc)
        return None


def vpd_wwid(sysfs: Sysfs, rel: str) -> str | None:
    """The kernel's wwid choice from ``<rel>/device/vpd_pg83``; None when absent or malformed."""
    data = read_bytes(sysfs, f"{rel}/device/vpd_pg83")
    if not data:
        return None
    try:
        return kernel_wwid(parse_vpd_pg83(data))
    except KernelFormatError as exc:
        log.warning("%s: %s", rel, exc)
        return None


def _rel(sysfs: Sysfs, name: str) -> str:
    rel = bcache.block_dirs(sysfs).get(name)
    if rel is None:
        raise UsageError(f"no such block device: {name}", hint=NO_DEVICE_HINT)
    return rel


def _kernel_text(text: str | None) -> str | None:
    """A sysfs string, or None for the kernel's way of printing a NULL pointer.

    UML's ubd driver prints its ``serial`` attribute with ``%s`` and no serial set: the 7.2
    lab's ``block/ubda/serial`` reads ``(null)`` (lsblk shows no serial for it).
    """
    text = _nonempty(text)
    return None if text == "(null)" else text


def _merge(sysfs: Sysfs, base: Identity, rel: str, u: UdevInfo | None,
           sb: Superblock | None) -> Identity:
    serial = (u.unit_serial if u else None) or _kernel_text(base.serial)
    wwn = (u.wwn if u else None) or normalize_wwn(_kernel_text(base.wwn))
    if serial is None:
        serial = vpd_serial(sysfs, rel)
    if wwn is None:
        wwn = vpd_wwid(sysfs, rel)
    return replace(
        base,
        serial=serial,
        wwn=wwn,
        # the kernel's model keeps its spaces; udev's ID_MODEL turns them into "_"
        model=_kernel_text(base.model) or (u.model if u else None),
        vendor=_kernel_text(sysfs.read_opt(f"{rel}/device/vendor")),
        by_id=u.by_id if u else (),
        by_path=f"/dev/disk/by-path/{u.path}" if u and u.path else None,
        fs_type=(sb.type if sb else None) or (u.fs_type if u else None),
        fs_uuid=(sb.uuid if sb else None) or (u.fs_uuid if u else None),
    )


def identify(sysfs: Sysfs, name: str, *, udev: UdevArg = AUTO,
             probe: ProbeArg = AUTO) -> Identity:
    """The identity of block device ``name`` (a kernel name: ``sdb``, ``ubda1``, ``dm-0``).

    ``udev``: a lookup name -> UdevInfo (default: pyudev on the live system, nothing on a
    capture); ``probe``: node -> Superblock (default: libblkid on the live system). Missing
    files and missing udev data leave fields None. Raises UsageError for an unknown name.
    """
    rel = _rel(sysfs, name)
    return _identify(sysfs, name, rel, _udev_lookup(sysfs, udev), _prober(sysfs, probe))


def _identify(sysfs: Sysfs, name: str, rel: str, lookup: UdevLookup | None,
              prober: Prober | None) -> Identity:
    base = bcache.identity(sysfs, name, rel)
    u = lookup(name) if lookup else None
    sb = prober(f"/dev/{name}") if prober else None
    return _merge(sysfs, base, rel, u, sb)


def kernel_identity(sysfs: Sysfs, name: str, rel: str | None = None) -> Identity:
    """What the kernel alone says (sysfs and the VPD pages): no udev, no superblock probe.

    The same on a host with or without udevd; the SCSI backend matches disks with it.
    ``rel`` is the device's directory when the caller knows it (``block/sdb`` for a disk).
    """
    return _identify(sysfs, name, rel or _rel(sysfs, name), None, None)


def identify_all(sysfs: Sysfs, *, udev: UdevArg = AUTO,
                 probe: ProbeArg = AUTO) -> dict[str, Identity]:
    """Every block device (disks and partitions) by kernel name."""
    lookup, prober = _udev_lookup(sysfs, udev), _prober(sysfs, probe)
    return {name: _identify(sysfs, name, rel, lookup, prober)
            for name, rel in sorted(bcache.block_dirs(sysfs).items())}

