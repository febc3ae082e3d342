"""Records of the dm-cache devices cachemgr created, so that they survive a reboot.

A dm-cache device is a table in the kernel: nothing re-creates it after a reboot, and in
writeback its origin then holds stale blocks (the newest are on the cache device), which
anything that opens the origin reads. ``create dm-cache`` therefore writes
``/etc/cachemgr/dmcache/NAME.json`` (``CACHEMGR_DMCACHE_DIR`` overrides the directory: tests,
and the lab, whose /etc does not survive a boot): the stable identity of the origin, cache
and metadata devices, the block size, the policy and the mode. ``remove`` (with or without
``--keep-device``: either way no cache is left to bring back) deletes it. The boot pass
(``cachemgr autoattach``) and the udev worker assemble a recorded device once its three
devices are present and are proven to be the recorded ones (:func:`resolve`,
:func:`assemble`; below); status and the health model list a record that is not
assembled.

The identity of a device is, strongest first: its WWN, its serial (a partition's: its
disk's with ``-partN``, since udev copies a disk's onto its partitions), its first
/dev/disk/by-id link, its by-path link, its place in sysfs (``sys_path``: the device's
directory under /sys/devices without the kernel's name, plus the partition number:
``devices/platform/uml-blkdev.1`` for the UML lab's second ubd disk,
``devices/pci0000:00/0000:00:05.0/virtio3`` for a qemu virtio disk; for an NVMe namespace,
which has no ``block/`` directory of its own, its controller's PCI place and namespace id,
``devices/pci0000:00/0000:00:02.0/0000:01:00.0:ns1``), or for a device-mapper device its
dm UUID or name. The strongest key recorded decides which device
fills a role; its size must also be the recorded one; and the metadata device must carry a
dm-cache superblock with the recorded block size (and, once committed, the cache's number
of blocks): a blank or foreign metadata device would make the kernel format fresh metadata
and throw the cache's dirty blocks away.

Which devices are proven, and what happens otherwise (issue #41 item 1; docs/admin-guide.md,
"After a reboot: the record and the boot pass"):

* A WWN, a serial, a by-id link or a dm UUID names the device itself: another disk in its
  slot has another one (refused: "sits where it was but is another device"). A role found by
  one of these is proven, and when all three are the boot pass and the udev worker assemble
  the device by themselves.
* A by-path link, a sysfs place (``sys_path``) or a dm name without a UUID (``PLACE_KEYS``)
  says where a device sits or what it is called, not which it is: after a swap, a
  renumbering or a power cut, a same-size disk in the origin's slot matches the place and
  the size exactly. Assembling a writeback cache over it writes the cache's dirty blocks
  onto it (seen in the lab: 32 MiB of a bystander disk overwritten, the real origin left
  stale) and reads through the cache return another disk's blocks. A role found this way
  is ``unproven`` (:class:`Resolution`): the boot pass and the udev worker refuse the whole
  device (the boot pass exits 3), the health model says CRITICAL in writeback naming what to
  check and the one command, ``cachemgr assemble NAME``, which shows what blkid sees on each
  device now beside what it saw at create and asks (``--yes`` without a terminal). The same
  rule holds for the cache and metadata devices: another cache's SSD in the slot, with
  metadata of the same block size and count, passes the superblock check.
* No key at all (a loop device): never assembled, by either.

Why not prove a place-only device by its content instead: nothing on it is both stable and
its own. The origin's content is the VM's: a file system, partition table or LVM UUID can
change after create (a reformat inside the VM, whose newest blocks may sit dirty on the
cache while the origin holds the old ones), and VM clones and copied images share them, so a
cloned disk in the slot would pass. The cache device holds only cached blocks; the metadata
superblock carries no identity of its own (its ``uuid`` field is all zeros on the lab
kernel: docs/kernel-notes.md) and the same block size and count are the norm when caches
are made by one script. Writing an identity of cachemgr's own would take space from one of
the three devices that the kernel or the VM owns. So the content is recorded
(:attr:`DeviceId.signature`, blkid at create, through identity.probe_signature) and shown
to the admin, who knows what the disk should be; it is never taken as proof.

The UML lab's ubd disks have no WWN, serial or udev links (``block/ubda/serial`` reads
``(null)``): there ``sys_path`` (the ubd slot) is the strongest key, so a lab dm-cache is
assembled by ``cachemgr assemble``. Disks with serials (virtio ``serial=``, SCSI, NVMe)
are assembled at boot.

Files: JSON, written atomically (a temporary file, fsync, rename, fsync of the directory),
mode 0600, in a directory opened without following a link and, run as root, refused when
another user could change it or a directory above it (cachemgr/core/safefs.py, the state
directory's discipline). Run as root, a record file that another user owns or that group or
others may write is not used (:func:`untrusted`: whoever writes a record picks the disks a
cache is assembled over, as the policy file's writer picks what is attached,
procedures/policy.py ``check_trusted``); it is a bad line of :func:`load_all`, which the
boot pass refuses and ``check`` reports.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cachemgr.backends import identity as identity_mod
from cachemgr.backends.blockdev import block_dirs, in_use
from cachemgr.backends.dmcache import command, discover
from cachemgr.backends.dmcache.build import CACHE_SUPERBLOCK_MAGIC
from cachemgr.core import safefs, state
from cachemgr.core.errors import AlreadyError, CacheMgrError, UnsafeError, UsageError
from cachemgr.core.model import CacheMode, DmCacheTable, Identity, UnassembledDmCache
from cachemgr.core.sysfs import Sysfs

ROLES = ("origin", "cache", "metadata")
# the keys of a device's identity, strongest first
KEYS = ("wwn", "serial", "by_id", "by_path", "sys_path", "dm_uuid", "dm_name")
# keys that say where a device sits or what it is called, not which device it is: a
# same-size disk in that slot (or a dm device given that name) has them too. A role whose
# strongest recorded key is one of these is assembled by the admin only (module docstring)
PLACE_KEYS = ("by_path", "sys_path", "dm_name")
SCHEMA = 1
_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,127}")


class RecordError(UsageError):
    """A record that cannot be written, read or removed (exit 2)."""


def records_dir() -> str:
    return safefs.dmcache_dir()


@dataclass(frozen=True)
class DeviceId:
    """Who one of a dm-cache device's three devices is (the module docstring)."""

    size_bytes: int
    node: str = ""  # its node when recorded (shown only: kernel names change)
    wwn: str | None = None
    serial: str | None = None
    by_id: str | None = None
    by_path: str | None = None
    sys_path: str | None = None
    dm_uuid: str | None = None
    dm_name: str | None = None
    # what blkid found on it at create ("ext4 UUID ...", "gpt PTUUID ...", "no signature"):
    # shown to the admin who decides, never taken as proof (module docstring); None: not
    # probed (a record of an older cachemgr, or the device could not be read)
    signature: str | None = None

    def strongest(self) -> tuple[str, str] | None:
        for k in KEYS:
            v = getattr(self, k)
            if v:
                return k, v
        return None

    @property
    def place_only(self) -> bool:
        """Known by its place (or dm name) at best: a same-size disk there passes for it."""
        s = self.strongest()
        return s is not None and s[0] in PLACE_KEYS

    def words(self) -> str:
        s = self.strongest()
        what = f"{s[0].replace('_', '-')} {s[1]}" if s else "no stable identity"
        return f"{what}, {self.size_bytes} bytes (was {self.node or '?'})"

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_json(cls, data: Any) -> DeviceId:
        if not isinstance(data, dict):
            raise ValueError("a device is not an object")
        size = data.get("size_bytes")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError("size_bytes is not a positive integer")
        kw: dict[str, Any] = {"size_bytes": size}
        for k in ("node", *KEYS, "signature"):
            v = data.get(k)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"{k} is not a string")
            if v is not None:
                kw[k] = v
        return cls(**kw)


@dataclass(frozen=True)
class Record:
    name: str
    origin: DeviceId
    cache: DeviceId
    metadata: DeviceId
    origin_sectors: int
    block_sectors: int
    policy: str = "smq"
    mode: CacheMode = CacheMode.WRITEBACK
    created: float = 0.0
    path: str = field(default="", compare=False)

    @property
    def node(self) -> str:
        return f"/dev/mapper/{self.name}"

    def device(self, role: str) -> DeviceId:
        d: DeviceId = getattr(self, role)
        return d

    def table(self, nodes: Mapping[str, str]) -> DmCacheTable:
        """The recorded table over this boot's nodes of the three devices."""
        return DmCacheTable(0, self.origin_sectors, nodes["metadata"], nodes["cache"],
                            nodes["origin"], self.block_sectors, (self.mode.value,),
                            self.policy, ())

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "name": self.name, "origin": self.origin.to_json(),
                "cache": self.cache.to_json(), "metadata": self.metadata.to_json(),
                "origin_sectors": self.origin_sectors, "block_sectors": self.block_sectors,
                "policy": self.policy, "mode": self.mode.value, "created": self.created}

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Record:
        """A record read back; ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("schema", 1) != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r} (this cachemgr reads {SCHEMA})")
        name = data.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"bad name {name!r}")
        ints = {}
        for k in ("origin_sectors", "block_sectors"):
            v = data.get(k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{k} is not a positive integer")
            ints[k] = v
        policy = data.get("policy", "smq")
        if not isinstance(policy, str) or not re.fullmatch(r"[a-z0-9_-]{1,15}", policy):
            raise ValueError(f"bad policy {policy!r}")
        try:
            mode = CacheMode(str(data.get("mode")))
        except ValueError:
            raise ValueError(f"bad mode {data.get('mode')!r}") from None
        if mode not in (CacheMode.WRITEBACK, CacheMode.WRITETHROUGH, CacheMode.PASSTHROUGH):
            raise ValueError(f"bad mode {mode.value!r}")
        created = data.get("created", 0.0)
        devs = {r: DeviceId.from_json(data.get(r)) for r in ROLES}
        return cls(name, devs["origin"], devs["cache"], devs["metadata"],
                   ints["origin_sectors"], ints["block_sectors"], policy, mode,
                   float(created) if isinstance(created, int | float) else 0.0, path)


# ---------------------------------------------------------------------------------------
# identities


_NVME_PLACE = re.compile(r"(devices/(?!virtual/).+?)/nvme/nvme\d+/nvme\d+(?:c\d+)?n\d+(?:/|$)")


def sys_path(sysfs: Sysfs, name: str, rel: str | None = None) -> str | None:
    """The device's place under /sys/devices without the kernel's name (module docstring);
    None for a virtual device (loop, dm, md: no place of their own)."""
    rel = rel or block_dirs(sysfs).get(name)
    if rel is None:
        return None
    real = sysfs.resolve(rel)
    if not real or not real.startswith("devices/") or real.startswith("devices/virtual/"):
        return None
    head, sep, _ = real.rpartition("/block/")
    if not sep:
        # NVMe: devices/PCI.../nvme/nvmeX/nvmeXnY[/nvmeXnYpZ]; nvmeX and nvmeXnY are the
        # kernel's probe order, the PCI place and the namespace id are not
        m = _NVME_PLACE.match(real)
        disk_rel = rel.rsplit("/", 1)[0] if rel.count("/") > 1 else rel
        nsid = (sysfs.read_opt(f"{disk_rel}/nsid") or "").strip()
        if m is None or not nsid.isdigit():
            return None
        head = f"{m.group(1)}:ns{nsid}"
    part = sysfs.read_opt(f"{rel}/partition")
    return f"{head}:part{part.strip()}" if part and "/" in rel.removeprefix("block/") \
        else head


def device_id(sysfs: Sysfs, ident: Identity, rel: str | None = None,
              parents: Mapping[str, Identity] | None = None) -> DeviceId:
    """What a record keeps of a device (module docstring). A partition's WWN and serial are
    its disk's with ``-partN`` (as udev's by-id links name it): NVMe namespaces under the
    kernel's native multipath sit under /sys/devices/virtual (no sysfs place), and without
    udevd they have no by-id link either. ``parents``: identities known already."""
    wwn, serial = identity_mod.normalize_wwn(ident.wwn) if ident.wwn else None, ident.serial
    if ident.partition_of is not None:
        number = (sysfs.read_opt(f"{rel}/partition") or "").strip() if rel else ""
        disk = (parents or {}).get(ident.partition_of)
        if disk is None and number:
            try:
                disk = identity_mod.identify(sysfs, ident.partition_of, probe=None)
            except CacheMgrError:
                disk = None
        wwn = f"{identity_mod.normalize_wwn(disk.wwn)}-part{number}" \
            if disk is not None and disk.wwn and number else None
        serial = f"{disk.serial}-part{number}" if disk is not None and disk.serial \
            and number else None
    dm_uuid = dm_name = None
    if ident.name.startswith("dm-"):
        dm_uuid = (sysfs.read_opt(f"block/{ident.name}/dm/uuid") or "").strip() or None
        dm_name = (sysfs.read_opt(f"block/{ident.name}/dm/name") or "").strip() or None
    return DeviceId(
        size_bytes=ident.size_bytes or 0, node=ident.node, wwn=wwn, serial=serial,
        by_id=ident.by_id[0] if ident.by_id else None, by_path=ident.by_path,
        sys_path=sys_path(sysfs, ident.name, rel), dm_uuid=dm_uuid, dm_name=dm_name)


def matches(rec: DeviceId, now: DeviceId, key: str) -> bool:
    return getattr(now, key) is not None and getattr(now, key) == getattr(rec, key)


# ---------------------------------------------------------------------------------------
# the metadata superblock (struct cache_disk_superblock, dm-cache-metadata.c): magic le64 at
# 32, data_block_size le32 at 232, cache_blocks le32 at 240


@dataclass(frozen=True)
class Superblock:
    block_sectors: int
    cache_blocks: int


def read_superblock(node: str) -> Superblock | None:
    """The dm-cache metadata superblock of ``node``, None when it carries none (or cannot be
    read)."""
    try:
        with open(node, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    return parse_superblock(head)


def parse_superblock(head: bytes) -> Superblock | None:
    if len(head) < 244 or int.from_bytes(head[32:40], "little") != CACHE_SUPERBLOCK_MAGIC:
        return None
    return Superblock(int.from_bytes(head[232:236], "little"),
                      int.from_bytes(head[240:244], "little"))


# ---------------------------------------------------------------------------------------
# which device fills each role now


@dataclass(frozen=True)
class Resolution:
    """The three devices of a record as found now: ``nodes`` (role -> /dev node) when every
    one is there and is the recorded one; else ``problems`` (role -> why) and ``missing``
    (True when every problem is a device that is not there: wait for it). ``unproven``
    (role -> why): a role found by its place (or dm name) only, which a same-size disk in
    that place would pass: assembled by the admin only (module docstring)."""

    nodes: Mapping[str, str]
    problems: tuple[tuple[str, str], ...] = ()
    missing: bool = False
    unproven: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        """Every device there and proven: the boot pass and the udev worker assemble it."""
        return not self.problems and not self.unproven

    @property
    def found(self) -> bool:
        """Every device there as recorded, some maybe by their place only: the admin's
        command (``cachemgr assemble NAME``) may assemble it once the admin has checked."""
        return not self.problems


def resolve(rec: Record, devices: Mapping[str, DeviceId],
            superblock: Callable[[str], Superblock | None] = read_superblock) -> Resolution:
    """Find ``rec``'s three devices among ``devices`` (kernel name -> identity now)."""
    nodes: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    unproven: list[tuple[str, str]] = []
    absent = 0
    for role in ROLES:
        want = rec.device(role)
        s = want.strongest()
        if s is None:
            problems.append((role, "recorded without a stable identity (WWN, serial, by-id "
                                   "or by-path link, sysfs place); cachemgr does not guess "
                                   f"it by size ({want.words()})"))
            continue
        key, value = s
        found = [n for n, d in devices.items() if matches(want, d, key)]
        if len(found) > 1:
            problems.append((role, f"{', '.join('/dev/' + n for n in sorted(found))} all have "
                                   f"{key.replace('_', '-')} {value}; ambiguous"))
            continue
        if not found:
            # a disk in its place (by-path, sysfs) that is not the recorded one
            there = [n for n, d in devices.items() for k in ("by_path", "sys_path")
                     if KEYS.index(k) > KEYS.index(key) and matches(want, d, k)]
            if there:
                other = devices[there[0]]
                problems.append((role, f"/dev/{there[0]} sits where it was but is another "
                                       f"device ({other.words().split(' (was')[0]}; "
                                       f"recorded: {want.words()})"))
            else:
                absent += 1
                problems.append((role, f"missing ({want.words()})"))
            continue
        name = found[0]
        now = devices[name]
        if now.size_bytes != want.size_bytes:
            problems.append((role, f"/dev/{name} has {key.replace('_', '-')} {value} but "
                                   f"{now.size_bytes} bytes, not the recorded "
                                   f"{want.size_bytes}: not the recorded device"))
            continue
        nodes[role] = now.node or f"/dev/{name}"
        if key in PLACE_KEYS:
            unproven.append((role, f"{nodes[role]} is known by its "
                                   f"{'name' if key == 'dm_name' else 'place'} only "
                                   f"({key.replace('_', '-')} {value}): a disk of the same "
                                   "size there would pass for it"))
    if "metadata" in nodes:
        sb = superblock(nodes["metadata"])
        if sb is None:
            problems.append(("metadata", f"{nodes['metadata']} carries no dm-cache "
                                         "superblock: assembling would format fresh metadata "
                                         "and lose the cache's blocks"))
        elif sb.block_sectors != rec.block_sectors:
            problems.append(("metadata", f"{nodes['metadata']} holds the metadata of a cache "
                                         f"with {sb.block_sectors}-sector blocks, not the "
                                         f"recorded {rec.block_sectors}"))
        elif "cache" in nodes and sb.cache_blocks and \
                sb.cache_blocks != rec.cache.size_bytes // (rec.block_sectors * 512):
            problems.append(("metadata", f"{nodes['metadata']} holds the metadata of a cache "
                                         f"of {sb.cache_blocks} blocks, not of this one's "
                                         f"{rec.cache.size_bytes // (rec.block_sectors * 512)}"))
    if len({*nodes.values()}) != len(nodes):
        problems.append(("origin", "two roles resolve to one device"))
    return Resolution(nodes, tuple(problems), missing=bool(problems) and absent ==
                      len(problems), unproven=tuple(unproven))


def identities(sysfs: Sysfs, idents: Mapping[str, Identity] | None = None
               ) -> dict[str, DeviceId]:
    """Every block device's :class:`DeviceId` now (``idents``: identity.identify_all's)."""
    dirs = block_dirs(sysfs)
    if idents is None:
        idents = identity_mod.identify_all(sysfs, probe=None)
    return {n: device_id(sysfs, i, dirs.get(n), idents) for n, i in idents.items()
            if not n.startswith(("loop", "ram", "zram", "sr", "bcache"))}


# ---------------------------------------------------------------------------------------
# files


def _path(name: str) -> str:
    return os.path.join(records_dir(), f"{name}.json")


@contextlib.contextmanager
def _dir(create: bool) -> Any:
    try:
        fd = safefs.open_trusted_dir(records_dir(), create=create)
    except safefs.UnsafePathError as exc:
        raise RecordError(exc.message, hint=exc.fix) from None
    except OSError as exc:
        raise RecordError(f"{records_dir()}: {exc.strerror}") from None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def save(rec: Record) -> str:
    """Write ``rec`` atomically (root's, mode 0600); its path."""
    if not _NAME.fullmatch(rec.name):
        raise RecordError(f"dm name {rec.name!r} cannot name a record file")
    data = (json.dumps(rec.to_json(), indent=2, sort_keys=True) + "\n").encode()
    with _dir(create=True) as fd:
        try:
            safefs.write_at(fd, f"{rec.name}.json", data, mode=0o600)
        except OSError as exc:
            raise RecordError(f"{_path(rec.name)}: {exc.strerror}") from None
    return _path(rec.name)


def delete(name: str) -> bool:
    """Remove the record of ``name``; False when there was none."""
    if not _NAME.fullmatch(name):
        return False
    with _dir(create=False) as fd:
        if fd is None:
            return False
        try:
            os.unlink(f"{name}.json", dir_fd=fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise RecordError(f"{_path(name)}: {exc.strerror}") from None
        with contextlib.suppress(OSError):
            os.fsync(fd)
    return True


def load_all(kept: state.Kept | None = None) -> tuple[list[Record], list[str]]:
    """Every record, and one line for each file that is not one (never raises for a file).
    ``kept``: a poller's (core/state.py ``Kept``): the directory is opened and checked as
    always, its listing and files read again only when they changed since its last poll."""
    out: list[Record] = []
    bad: list[str] = []
    try:
        ctx = _dir(create=False)
        fd = ctx.__enter__()
    except RecordError as exc:
        return [], [exc.message]
    try:
        if fd is None:
            return [], []
        key = ("dmcache-records", records_dir())
        names = sorted(os.listdir(fd)) if kept is None else kept.listing(key, fd, ".json")[0]
        for n in names:
            if not n.endswith(".json") or n.startswith("."):
                continue
            shown = os.path.join(records_dir(), n)
            raw = _read(fd, n, shown) if kept is None else kept.file(
                key, fd, n, functools.partial(_read, fd, n, shown, transient=True))
            if isinstance(raw, str):
                bad.append(raw)
                continue
            try:
                rec = Record.from_json(json.loads(raw.decode("utf-8")), shown)
                if rec.name != n[:-5]:
                    raise ValueError(f"it names {rec.name!r}")
            except (ValueError, RecursionError) as exc:
                bad.append(f"{shown}: not a dm-cache record cachemgr can read: {exc}")
                continue
            out.append(rec)
    finally:
        ctx.__exit__(None, None, None)
    return out, bad


def _read(fd: int, name: str, shown: str, *, transient: bool = False) -> bytes | str:
    """The bytes of the record file ``name`` in ``fd``, or the line that says why not
    (``transient``: an OSError's line raised as state.Transient, for a poller not to keep
    it)."""
    try:
        f = safefs.open_file(fd, name, shown, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(f, "rb") as fh:
            why = untrusted(os.fstat(fh.fileno()), shown)
            return why if why is not None else fh.read(1 << 20)
    except safefs.UnsafePathError as exc:
        return exc.message
    except OSError as exc:
        why = f"{shown}: not a dm-cache record cachemgr can read: {exc}"
        if transient:
            raise state.Transient(why) from None
        return why


def untrusted(st: os.stat_result, shown: str) -> str | None:
    """Run as root, the line that refuses a record file another user could have written
    (owned by another user, or writable by group or others), as a policy file is refused
    (procedures/policy.py ``check_trusted``): whoever writes it chooses the disks the boot
    pass would assemble a writeback cache over. None when only root can change it (or when
    not run as root: nothing is assembled then)."""
    if os.geteuid() != 0:
        return None
    why = safefs.loose(st)
    if why is None:
        return None
    return (f"{shown}: {why}; cachemgr does not use this dm-cache record (whoever can "
            "change it chooses the disks a cache is assembled over); fix: check what it "
            f"says, then chown root:root {shown} && chmod 0600 {shown}")


def load(name: str) -> Record | None:
    return next((r for r in load_all()[0] if r.name == name), None)


# ---------------------------------------------------------------------------------------
# record at create, assemble at boot, what is not assembled


def make(sysfs: Sysfs, name: str, nodes: Mapping[str, str], table: DmCacheTable,
         now: float, *, probe: identity_mod.ProbeArg = identity_mod.AUTO) -> Record:
    """The record of a device just created over ``nodes`` (role -> /dev node). ``probe``
    (default: blkid on the live system, none on a capture) gives each device's signature,
    shown to the admin at a later ``cachemgr assemble``."""
    dirs = block_dirs(sysfs)
    prober = (identity_mod.probe_signature if sysfs.live else None) \
        if probe is identity_mod.AUTO else probe
    ids: dict[str, DeviceId] = {}
    for role in ROLES:
        k = sysfs.block_name_of(nodes[role])
        if k is None or k not in dirs:
            raise RecordError(f"{nodes[role]} ({role}): no such block device")
        ident = identity_mod.identify(sysfs, k, probe=None)
        ids[role] = device_id(sysfs, ident, dirs[k])
        sig = prober(nodes[role]) if prober is not None else None
        if sig is not None:
            ids[role] = replace(ids[role], signature=sig.words())
    return Record(name, ids["origin"], ids["cache"], ids["metadata"], table.length,
                  table.block_sectors, table.policy, table.mode, round(now, 3))


def moved(sysfs: Sysfs, rec: Record, nodes: Mapping[str, str]) -> Record:
    """``rec`` with the roles in ``nodes`` (role -> /dev node) identified as the devices
    there now: a replace-ssd run moved the cache and metadata onto another SSD, and the boot
    pass must look for those, not the pulled ones."""
    dirs = block_dirs(sysfs)
    ids: dict[str, DeviceId] = {}
    for role, node in nodes.items():
        k = sysfs.block_name_of(node)
        if k is None or k not in dirs:
            raise RecordError(f"{node} ({role}): no such block device")
        ids[role] = device_id(sysfs, identity_mod.identify(sysfs, k, probe=None), dirs[k])
    return replace(rec, origin=ids.get("origin", rec.origin), cache=ids.get("cache", rec.cache),
                   metadata=ids.get("metadata", rec.metadata))


def assemble(sysfs: Sysfs, rec: Record,
             devices: Mapping[str, DeviceId] | None = None, *, admin: bool = False) -> str:
    """``dmsetup create`` ``rec``'s device with the recorded table over its devices as
    found now. AlreadyError when it is there; UnsafeError (nothing done) when a device is
    missing, another one, or busy, or (unless ``admin``: the admin checked and confirmed,
    ``cachemgr assemble``) known by its place only. Its description."""
    devs = discover.dm_devices(sysfs)
    if rec.name in devs:
        raise AlreadyError(f"{rec.node} is assembled already")
    res = resolve(rec, devices if devices is not None else identities(sysfs))
    if not res.found:
        raise UnsafeError(f"{rec.node} not assembled: " + "; ".join(
            f"{role}: {why}" for role, why in res.problems),
            hint=f"its record: {rec.path or _path(rec.name)}")
    if res.unproven and not admin:
        raise UnsafeError(f"{rec.node} not assembled: " + "; ".join(
            f"{role}: {why}" for role, why in res.unproven), hint=admin_hint(rec, res))
    for role in ROLES:
        why = in_use(sysfs, res.nodes[role])
        if why:
            raise UnsafeError(f"{rec.node} not assembled: its {role} {res.nodes[role]} is "
                              f"busy: {why}")
    table = rec.table(res.nodes)
    command.dmsetup("create", rec.name, "--table", table.line())
    return (f"{rec.node}: dm-cache {rec.mode.value} over {res.nodes['origin']} (cache "
            f"{res.nodes['cache']}, metadata {res.nodes['metadata']})")


def admin_checks(rec: Record, res: Resolution) -> str:
    """What the admin checks before assembling a record whose devices are known by their
    place only (:func:`admin_hint` adds the command)."""
    which = ", ".join(f"{res.nodes[r]} is its {r} (recorded: {rec.device(r).words()}"
                      + (f"; blkid at create: {rec.device(r).signature}"
                         if rec.device(r).signature else "") + ")"
                      for r, _ in res.unproven)
    return (f"check that {which}: blkid -p DEV shows a disk's signature now, and a disk "
            "swapped or moved sits in another slot")


def admin_hint(rec: Record, res: Resolution) -> str:
    """:func:`admin_checks`, then the one command that assembles it."""
    return f"{admin_checks(rec, res)}; then: cachemgr assemble {rec.name}"


def unassembled(sysfs: Sysfs, assembled: Iterable[str],
                devices: Mapping[str, DeviceId] | None = None, *,
                kept: state.Kept | None = None) -> list[UnassembledDmCache]:
    """The records whose device is not among ``assembled`` (dm names), each with why
    (``kept``: a poller's, :func:`load_all`)."""
    recs, _ = load_all(kept)
    names = set(assembled)
    todo = [r for r in recs if r.name not in names]
    if not todo:
        return []
    if devices is None:
        try:
            devices = identities(sysfs)
        except CacheMgrError:
            devices = {}
    out = []
    for r in todo:
        res = resolve(r, devices)
        out.append(UnassembledDmCache(r.name, r.path, r.mode, res.problems, res.unproven,
                                      admin_checks(r, res) if res.found and res.unproven
                                      else None))
    return out
