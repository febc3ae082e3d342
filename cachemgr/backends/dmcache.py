"""dm-cache backend: reads device-mapper ``cache`` targets into the model and changes them.

Sources (Documentation/admin-guide/device-mapper/cache.rst, drivers/md/dm-cache-target.c):
``dmsetup table`` / ``dmsetup status`` / ``dmsetup info`` through the one command runner, and
``/sys/block/dm-*/dm/{name,uuid,suspended}`` through :class:`~cachemgr.core.sysfs.Sysfs`.

What the lab kernels showed (7.2 UML and Debian 12's 6.1; captures in tests/fixtures/):

* ``dmsetup table`` prints the constructor arguments as loaded, devices as ``major:minor``::

      vmcache: 0 2097152 cache 98:32 98:16 253:0 64 1 writeback smq 0

  The status line reports the *live* features: 7.2 adds ``no_discard_passdown`` by itself
  when the origin cannot discard a whole block (the table does not show it), so a reload is
  always built from the table, never from the status.
* ``dmsetup message NAME 0 migration_threshold N`` changes the live value (status core
  args) but not the table; a reload resets it to the table's value. Every reload here
  carries the live value forward.
* Switching to ``passthrough`` while blocks are dirty: ``dmsetup load`` succeeds, ``dmsetup
  resume`` fails with EBUSY ("cannot enter passthrough mode unless all blocks are clean") and
  leaves the device **suspended with the new table live**. The only way out is loading the
  old table and resuming; :func:`_switch` does that.
* suspend -> load -> resume keeps the hit/miss counters (the new instance reads them from
  the metadata the old one saved at suspend); load -> suspend -> resume resets them.
* The flush trap: smq writes dirty blocks back only after a second of idleness; the
  ``cleaner`` policy (with upstream fix 1e4ab7b4c881, present in 6.1 and 7.2) cleans under
  IO too, but only blocks not touched in the last writeback period (10 s, the sentinels of
  dm-cache-policy-smq.c). In writeback mode a hot block a VM keeps writing is dirtied again
  faster than that, so ``writeback`` + ``cleaner`` never reaches 0 under continuous writes
  (lab: 87 -> 736 dirty blocks in 5 s of QD1 Zipf writes). In ``writethrough`` a write
  cannot dirty a clean block, so the dirty count only goes down: under the same load it went
  689 -> 234 at once, then in steps every ~10 s to 0 (154 -> 28 -> 0 in 29 s). So a flush
  runs in writethrough + cleaner and puts the original mode and policy back at the end.

LVM owns devices whose dm UUID starts with ``LVM-``: they are shown, and every change is
refused with the lvchange/lvconvert command that does it through LVM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from cachemgr.backends import signatures
from cachemgr.backends.bcache import Change, block_dirs, identity, in_use
from cachemgr.core import drainloop, runner, state
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    CommandError,
    KernelFormatError,
    StallError,
    TimeoutExpired,
    UnsafeError,
    UsageError,
)
from cachemgr.core.model import (
    DM_CACHE_MODES,
    CacheMode,
    CacheState,
    DmCacheDevice,
    DmCacheStatus,
    DmCacheTable,
    DrainProgress,
    Identity,
    human,
)
from cachemgr.core.model import parse_size as _parse_size
from cachemgr.core.sysfs import Sysfs

log = logging.getLogger(__name__)

DEFAULT_MIGRATION_THRESHOLD = 2048  # sectors (cache.rst)
MIN_BLOCK_SECTORS = 64  # 32 KiB
MAX_BLOCK_SECTORS = 2 * 1024 * 1024  # 1 GiB
DEFAULT_BLOCK_BYTES = 64 * 1024  # lvm2's default cache chunk size
# The kernel warns above a million cache blocks (memory, metadata time): the default block
# size doubles until the cache has at most this many.
MAX_DEFAULT_BLOCKS = 1_000_000
# The on-disk superblock: magic 06142003 (octal in dm-cache-metadata.c) = 0x18c403, le64 at
# byte 32 (struct cache_disk_superblock: csum, flags, blocknr, uuid[16], magic). Seen in the
# lab as "03 c4 18 00 00 00 00 00" at offset 32 of a used metadata device.
CACHE_SUPERBLOCK_MAGIC = 0o6142003
FailWord = Literal["Fail", "Error"]

_INT = re.compile(r"^[0-9]+$")
_FRACTION = re.compile(r"^([0-9]+)/([0-9]+)$")
_DEVNO = re.compile(r"^[0-9]+:[0-9]+$")
_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


# ---------------------------------------------------------------------------------------
# parsers


def _int(tok: str, what: str, line: str) -> int:
    if not _INT.match(tok):
        raise KernelFormatError(f"dm-cache {what}", line)
    return int(tok)


def split_target_line(line: str) -> tuple[int, int, str, list[str]]:
    """``<start> <length> <target> <params...>`` (one line of dmsetup table/status)."""
    toks = line.split()
    if len(toks) < 3:
        raise KernelFormatError("device-mapper target line", line)
    return (_int(toks[0], "start sector", line), _int(toks[1], "length", line), toks[2],
            toks[3:])


def parse_table(line: str) -> DmCacheTable:
    """One ``cache`` line of ``dmsetup table`` (without the ``NAME:`` prefix)::

        0 2097152 cache 98:32 98:16 253:0 64 1 writeback smq 0
        0 1048576 cache 98:32 98:16 253:0 128 2 writeback no_discard_passdown smq 2
            migration_threshold 4096                         (one line)

    ``<metadata dev> <cache dev> <origin dev> <block size> <#features> <features>*
    <policy> <#policy args> <policy args>*``; raises KernelFormatError naming the line.
    """
    start, length, target, p = split_target_line(line)
    if target != "cache" or len(p) < 6:
        raise KernelFormatError("dm-cache table line", line)
    meta, cache, origin = p[0], p[1], p[2]
    for dev in (meta, cache, origin):
        if not (_DEVNO.match(dev) or dev.startswith("/dev/")):
            raise KernelFormatError("dm-cache table line (device)", line)
    bs = _int(p[3], "block size", line)
    nf = _int(p[4], "feature count", line)
    i = 5 + nf
    if len(p) < i + 2:
        raise KernelFormatError("dm-cache table line (features)", line)
    features = tuple(p[5:i])
    policy = p[i]
    npa = _int(p[i + 1], "policy argument count", line)
    args = tuple(p[i + 2:])
    if len(args) != npa or not _WORD.match(policy) or not all(_WORD.match(f) for f in features):
        raise KernelFormatError("dm-cache table line (policy)", line)
    return DmCacheTable(start, length, meta, cache, origin, bs, features, policy, args)


def parse_status(line: str) -> DmCacheStatus | FailWord:
    """One ``cache`` line of ``dmsetup status`` (without the ``NAME:`` prefix), by position.

    Healthy (7.2, tests/fixtures/dmcache-writeback-uml)::

        0 2097152 cache 8 23/4096 64 420/8192 0 0 1521 527 0 420 145 1 writeback
            2 migration_threshold 2048 smq 0 rw -            (one line)

    here 420 blocks are *used* and 145 are *dirty* (a CSI driver once read the used count
    as dirty and concluded the cleaner does not flush). A failed cache prints ``Fail``
    (dm-cache-target.c cache_status, CM_FAIL) and a metadata read error ``Error``: those are
    returned as the word. Anything else raises KernelFormatError naming the line.
    """
    _, _, target, p = split_target_line(line)
    if target != "cache":
        raise KernelFormatError("dm-cache status line (not a cache target)", line)
    if p in (["Fail"], ["Error"]):
        return "Fail" if p[0] == "Fail" else "Error"
    if len(p) < 12:
        raise KernelFormatError("dm-cache status line (too short)", line)

    def frac(tok: str, what: str) -> tuple[int, int]:
        m = _FRACTION.match(tok)
        if not m:
            raise KernelFormatError(f"dm-cache status line ({what})", line)
        return int(m.group(1)), int(m.group(2))

    md_bs = _int(p[0], "metadata block size", line)
    md_used, md_total = frac(p[1], "metadata blocks")
    bs = _int(p[2], "cache block size", line)
    used, total = frac(p[3], "cache blocks")
    nums = [_int(t, "counter", line) for t in p[4:11]]
    nf = _int(p[11], "feature count", line)
    i = 12 + nf
    features = tuple(p[12:i])
    if len(p) < i + 1:
        raise KernelFormatError("dm-cache status line (features)", line)
    nc = _int(p[i], "core argument count", line)
    core = p[i + 1:i + 1 + nc]
    if nc % 2 or len(core) != nc:
        raise KernelFormatError("dm-cache status line (core arguments)", line)
    i += 1 + nc
    if len(p) < i + 2:
        raise KernelFormatError("dm-cache status line (policy)", line)
    policy = p[i]
    npa = _int(p[i + 1], "policy argument count", line)
    pargs = tuple(p[i + 2:i + 2 + npa])
    i += 2 + npa
    tail = p[i:]
    if (len(pargs) != npa or len(tail) != 2 or tail[0] not in ("rw", "ro")
            or tail[1] not in ("needs_check", "-")):
        raise KernelFormatError("dm-cache status line (policy, ro/rw, needs_check)", line)
    if not _WORD.match(policy) or not all(_WORD.match(f) for f in features) \
            or not all(_WORD.match(k) for k in core[0::2]):
        raise KernelFormatError("dm-cache status line (words)", line)
    return DmCacheStatus(
        metadata_block_sectors=md_bs, metadata_used=md_used, metadata_total=md_total,
        block_sectors=bs, used=used, total=total,
        read_hits=nums[0], read_misses=nums[1], write_hits=nums[2], write_misses=nums[3],
        demotions=nums[4], promotions=nums[5], dirty=nums[6],
        features=features, core_args=tuple(zip(core[0::2], core[1::2], strict=True)),
        policy=policy, policy_args=pargs, metadata_mode=tail[0],
        needs_check=tail[1] == "needs_check",
    )


def parse_listing(text: str, names: set[str]) -> dict[str, list[str]]:
    """``dmsetup table`` / ``dmsetup status`` for all devices: name -> its target lines.

    Every line carries its device's name (``multi: 0 1024 linear 98:0 0`` and
    ``multi: 1024 1024 linear 98:0 4096`` for a two-target device). Names may contain ": ",
    so the longest known name (from sysfs) that prefixes the line wins. "No devices found"
    means none.
    """
    out: dict[str, list[str]] = {}
    by_len = sorted(names, key=len, reverse=True)
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.strip() == "No devices found":
            continue
        name = next((n for n in by_len if line.startswith(n + ": ")), None)
        if name is None:
            head, sep, _ = line.partition(": ")
            if not sep:
                raise KernelFormatError("dmsetup listing line", raw)
            name = head
        out.setdefault(name, []).append(line[len(name) + 2:])
    return out


@dataclass(frozen=True)
class DmInfo:
    name: str
    state: str | None
    open_count: int | None
    devno: str | None
    uuid: str | None


def parse_info(text: str) -> dict[str, DmInfo]:
    """``dmsetup info`` (long form), blocks separated by blank lines::

        Name:              vmcache
        State:             ACTIVE
        Open count:        0
        Major, minor:      253, 1
        UUID:              LVM-...          (only when the device has one)
    """
    out: dict[str, DmInfo] = {}
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        name = fields.get("Name")
        if not name:
            continue
        opened = fields.get("Open count", "")
        mm = fields.get("Major, minor", "").replace(" ", "").replace(",", ":")
        out[name] = DmInfo(name, fields.get("State"), int(opened) if opened.isdigit() else None,
                           mm if _DEVNO.match(mm) else None, fields.get("UUID") or None)
    return out


# ---------------------------------------------------------------------------------------
# where dmsetup's answers come from: the live system, or a capture beside a fixture tree


class DmsetupSource(Protocol):
    def output(self, what: str) -> str:
        """The text of ``dmsetup <what>`` for all devices (table, status, info)."""


def _env() -> dict[str, str]:
    # Without udevd libdevmapper waits for udev to make /dev/mapper nodes (forever):
    # DM_DISABLE_UDEV=1 makes it create them itself
    # (docs/kernel-notes.md, "device-mapper without udev").
    return {} if os.path.exists("/run/udev/control") else {"DM_DISABLE_UDEV": "1"}


def dmsetup(*args: str, timeout: float = 60, check: bool = True) -> runner.Completed:
    return runner.run(["dmsetup", *args], timeout=timeout, check=check, env=_env())


class LiveDmsetup:
    def output(self, what: str) -> str:
        return dmsetup(what, timeout=30).stdout


class CapturedDmsetup:
    """``dmsetup-<what>.txt`` files written by ``cachemgr capture`` next to ``sys/``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def output(self, what: str) -> str:
        p = self.dir / f"dmsetup-{what}.txt"
        try:
            text = p.read_text()
        except OSError:
            return ""
        if text.startswith("# dmsetup"):  # the capture recorded a failure
            raise CacheMgrError(text.strip().lstrip("# "))
        return text


def default_source(sysfs: Sysfs) -> DmsetupSource:
    """dmsetup itself on the live system; the capture's files beside a captured tree."""
    return LiveDmsetup() if sysfs.live else CapturedDmsetup(sysfs.root.parent)


# ---------------------------------------------------------------------------------------
# discovery


@dataclass(frozen=True)
class DmSys:
    kernel_name: str
    name: str
    uuid: str | None
    suspended: bool | None
    devno: str | None
    holders: tuple[str, ...]


def dm_devices(sysfs: Sysfs) -> dict[str, DmSys]:
    """dm name -> what /sys/block/dm-*/dm/ says of it."""
    out = {}
    for kname in sysfs.block_names():
        d = f"block/{kname}"
        if not kname.startswith("dm-") or not sysfs.is_dir(f"{d}/dm"):
            continue
        name = (sysfs.read_opt(f"{d}/dm/name") or "").strip()
        if not name:
            continue
        susp = (sysfs.read_opt(f"{d}/dm/suspended") or "").strip()
        out[name] = DmSys(
            kernel_name=kname, name=name,
            uuid=(sysfs.read_opt(f"{d}/dm/uuid") or "").strip() or None,
            suspended=None if susp not in ("0", "1") else susp == "1",
            devno=(sysfs.read_opt(f"{d}/dev") or "").strip() or None,
            holders=tuple(sysfs.listdir(f"{d}/holders")),
        )
    return out


def _identity(sysfs: Sysfs, devno: str, dirs: dict[str, str]) -> Identity | None:
    if devno.startswith("/dev/"):
        name = sysfs.block_name_of(devno)
    else:
        target = sysfs.readlink(f"dev/block/{devno}")
        name = os.path.basename(target.rstrip("/")) if target else None
    if name is None or name not in dirs:
        return None
    return identity(sysfs, name, dirs[name])


@dataclass(frozen=True)
class DmCacheScan:
    devices: tuple[DmCacheDevice, ...]
    warnings: tuple[str, ...]


def scan(sysfs: Sysfs, source: DmsetupSource | None = None) -> DmCacheScan:
    """Every dm device whose one target is ``cache``. Runs no command when there is no dm
    device at all; a dmsetup failure (not installed, not root) becomes a warning."""
    devs = dm_devices(sysfs)
    if not devs:
        return DmCacheScan((), ())
    src = source or default_source(sysfs)
    warnings: list[str] = []
    try:
        tables = parse_listing(src.output("table"), set(devs))
        cache_names = [n for n, lines in tables.items()
                       if any(split_target_line(x)[2] == "cache" for x in lines)]
        if not cache_names:
            return DmCacheScan((), ())
        statuses = parse_listing(src.output("status"), set(devs))
        infos = parse_info(src.output("info"))
    except CommandError as exc:
        why = "dmsetup needs root" if "ermission" in exc.stderr else str(exc)
        return DmCacheScan((), (f"dm-cache devices not read: {why}",))
    except CacheMgrError as exc:
        return DmCacheScan((), (f"dm-cache devices not read: {exc}",))
    dirs = block_dirs(sysfs)
    out = []
    for name in sorted(cache_names):
        if len(tables[name]) != 1 or len(statuses.get(name, [])) != 1:
            warnings.append(f"{name}: {len(tables[name])} targets including a cache target; "
                            "cachemgr manages single-target dm-cache devices only")
            continue
        try:
            table = parse_table(tables[name][0])
            st = parse_status(statuses[name][0])
        except KernelFormatError as exc:
            warnings.append(f"{name}: {exc}")
            continue
        sysd = devs.get(name)
        info = infos.get(name)
        dev = DmCacheDevice(
            name=name,
            kernel_name=sysd.kernel_name if sysd else "?",
            devno=sysd.devno if sysd else (info.devno if info else None),
            uuid=sysd.uuid if sysd else (info.uuid if info else None),
            table=table,
            status=None if isinstance(st, str) else st,
            failure=st if isinstance(st, str) else None,
            metadata=_identity(sysfs, table.metadata_dev, dirs),
            cache=_identity(sysfs, table.cache_dev, dirs),
            origin=_identity(sysfs, table.origin_dev, dirs),
            open_count=info.open_count if info else None,
            suspended=sysd.suspended if sysd else None,
            holders=sysd.holders if sysd else (),
        )
        warnings.extend(device_warnings(dev))
        out.append(dev)
    return DmCacheScan(tuple(out), tuple(warnings))


def device_warnings(d: DmCacheDevice) -> list[str]:
    w = []
    if d.failure:
        w.append(f"{d.node}: the kernel reports the cache as {d.failure}: its dirty blocks "
                 "cannot be written back; do not remove or reuse its cache device "
                 f"({d.cache.node if d.cache else d.table.cache_dev}); see dmesg")
    if d.status and d.status.needs_check:
        w.append(f"{d.node}: the cache metadata needs a check (cache_check from "
                 "thin-provisioning-tools, with the device stopped)")
    if d.status and d.status.metadata_mode == "ro":
        w.append(f"{d.node}: the cache metadata is read-only (errors): no new cache blocks "
                 "are recorded")
    if d.suspended:
        w.append(f"{d.node} is suspended: IO to it blocks until it is resumed "
                 f"(an interrupted cachemgr run: cachemgr drain {d.name} --resume)")
    return w


def find(sysfs: Sysfs, name: str) -> DmCacheDevice:
    """The dm-cache device called ``name``, read now."""
    sc = scan(sysfs)
    for d in sc.devices:
        if d.name == name:
            return d
    raise UsageError(f"/dev/mapper/{name} is not a dm-cache device (any more)",
                     hint="cachemgr status lists the dm-cache devices on this host")


def read_status(name: str) -> DmCacheStatus | FailWord:
    """``dmsetup status NAME``: one line without the name prefix."""
    lines = [x for x in dmsetup("status", name, timeout=30).stdout.splitlines() if x.strip()]
    if len(lines) != 1:
        raise KernelFormatError(f"dmsetup status {name} (one target expected)", "\n".join(lines))
    return parse_status(lines[0])


def read_table(name: str) -> str:
    lines = [x for x in dmsetup("table", name, timeout=30).stdout.splitlines() if x.strip()]
    if len(lines) != 1:
        raise KernelFormatError(f"dmsetup table {name} (one target expected)", "\n".join(lines))
    return lines[0].strip()


# ---------------------------------------------------------------------------------------
# refusals


def lvm_name(dm_name: str) -> str:
    """``VG/LV`` from LVM's dm name ``VG-LV`` (a '-' inside either name is doubled)."""
    parts: list[str] = []
    cur = ""
    i = 0
    while i < len(dm_name):
        c = dm_name[i]
        if c == "-" and dm_name[i + 1:i + 2] == "-":
            cur += "-"
            i += 2
            continue
        if c == "-":
            parts.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    parts.append(cur)
    return f"{parts[0]}/{parts[1]}" if len(parts) >= 2 else dm_name


def _check_changeable(d: DmCacheDevice, what: str, lvm_command: str) -> None:
    """Refuse changes to LVM-owned, failed, unchecked or suspended devices (exit 3)."""
    if d.lvm_owned:
        raise UnsafeError(
            f"{d.node} belongs to LVM (dm UUID {d.uuid}); changing its {what} with dmsetup "
            "behind LVM's back would leave LVM's metadata wrong; nothing was changed",
            hint=f"use LVM: {lvm_command.replace('VG/LV', lvm_name(d.name))}")
    if d.failure or d.status is None:
        raise UnsafeError(
            f"{d.node}: the kernel reports the cache as {d.failure}; its dirty blocks cannot "
            f"be written back, so its {what} is not changed",
            hint="see dmesg; check the cache and metadata devices; keep the cache device")
    if d.status.needs_check or d.status.metadata_mode == "ro":
        how = "read-only" if d.status.metadata_mode == "ro" else "flagged needs_check"
        raise UnsafeError(
            f"{d.node}: the cache metadata is {how}; "
            f"dm-cache cannot record changes, so its {what} is not changed",
            hint="stop the device and run cache_check (thin-provisioning-tools) on the "
                 "metadata device")
    if d.suspended:
        raise UnsafeError(
            f"{d.node} is suspended (another tool, or an interrupted cachemgr run, is in the "
            f"middle of changing it); its {what} is not changed",
            hint=f"cachemgr drain {d.name} --resume puts back what cachemgr changed")


def _root(what: str) -> None:
    if os.geteuid() != 0:
        raise UsageError(f"{what} needs root", hint="run it as root (sudo)")


# ---------------------------------------------------------------------------------------
# table switches


@contextlib.contextmanager
def _critical() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP while a table switch runs.

    A Ctrl-C between ``suspend`` and ``resume`` would leave the VMs' disk suspended (all IO
    hangs). The blocked mask is inherited by the dmsetup children (the terminal sends
    SIGINT to the whole process group), and the signal is delivered once the switch is
    complete, where the flush's handler restores the table.
    """
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _switch(name: str, old: str, new: str, *, require_clean: bool = False) -> None:
    """suspend -> load ``new`` -> resume; on any failure the ``old`` table runs again.

    ``require_clean``: refuse (UnsafeError) unless the status reads 0 dirty blocks while the
    device is suspended (no IO can dirty a block then).
    """
    with _critical():
        dmsetup("suspend", name)
        try:
            if require_clean:
                st = read_status(name)
                if isinstance(st, str) or st.dirty:
                    dirty = "?" if isinstance(st, str) else str(st.dirty)
                    raise UnsafeError(f"/dev/mapper/{name}: {dirty} dirty blocks appeared "
                                      "again; not switching the table")
            dmsetup("load", name, "--table", new)
        except BaseException:
            dmsetup("resume", name, check=False)  # the old table is still the live one
            raise
        try:
            dmsetup("resume", name)
        except CommandError:
            # The kernel refused the new table at resume (preresume): passthrough with dirty
            # blocks gives EBUSY. The device is now suspended with the new table live.
            with contextlib.suppress(CommandError):
                dmsetup("clear", name)
            dmsetup("load", name, "--table", old)
            dmsetup("resume", name)
            raise


def _with_threshold(t: DmCacheTable, threshold: int | None) -> DmCacheTable:
    """The table with ``migration_threshold`` set to the live value (a reload resets it to
    the table's). Unchanged when the table already says so (or says nothing and the value is
    the default)."""
    if threshold is None:
        return t
    args = t.policy_args
    pairs = list(zip(args[0::2], args[1::2], strict=False))
    current = next((int(v) for k, v in pairs if k == "migration_threshold" and v.isdigit()),
                   DEFAULT_MIGRATION_THRESHOLD)
    if threshold == current:
        return t
    pairs = [(k, v) for k, v in pairs if k != "migration_threshold"]
    pairs.append(("migration_threshold", str(threshold)))
    return t.with_policy(t.policy, tuple(x for kv in pairs for x in kv))


# ---------------------------------------------------------------------------------------
# flush


@dataclass
class FlushResult:
    device: str
    start_bytes: int
    elapsed_s: float
    restored: dict[str, str] = field(default_factory=dict)
    final_table: str = ""


def _key(d: DmCacheDevice) -> str:
    return f"dmcache-{d.name}"


def _journal(d: DmCacheDevice) -> Path:
    return state.journal_path("dmcache-flush", d.name)


def restore_saved(sysfs: Sysfs, d: DmCacheDevice) -> dict[str, str]:
    """Put back the table a crashed or killed flush left (cleaner policy, writethrough), and
    resume a device it left suspended. Returns what was restored ({} if nothing)."""
    path = _journal(d)
    saved = state.read_json(path)
    if saved is None:
        return {}
    original = str(saved["original"])
    live = read_table(d.name)
    try:
        ours = parse_table(live).policy == "cleaner" and live != original
    except KernelFormatError:
        ours = False
    restored: dict[str, str] = {}
    if d.suspended or ours:
        with _critical():
            if d.suspended:
                # a switch cut short: drop its inactive table, if any
                with contextlib.suppress(CommandError):
                    dmsetup("clear", d.name)
            else:
                dmsetup("suspend", d.name)
            try:
                dmsetup("load", d.name, "--table", original)
            finally:
                dmsetup("resume", d.name)
        restored = {"table": original}
        log.info("%s: restored the table saved by an interrupted flush: %s", d.node, original)
    path.unlink(missing_ok=True)
    return restored


@contextlib.contextmanager
def _term_as_interrupt() -> Iterator[None]:
    """SIGTERM (systemd stop, kill) restores like Ctrl-C does, in the CLI's main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def flush(sysfs: Sysfs, d: DmCacheDevice, *, timeout: float = 24 * 3600,
          stall_timeout: float = 60.0, confirm: float = 1.0, interval: float = 0.5,
          progress: Callable[[DrainProgress], None] | None = None,
          final_mode: CacheMode | None = None) -> FlushResult:
    """Write every dirty block back to the origin, then put the table back.

    Runs writethrough + the ``cleaner`` policy (see the module docstring for why not
    writeback), polls ``#dirty`` down to 0 (read ``confirm`` seconds apart) with progress
    and ETA, then loads the original table again, or the same with ``final_mode`` (how
    ``mode --drain`` gets to passthrough without passing through writeback). On an error,
    a stall, a timeout, Ctrl-C or SIGTERM the original table is restored; after a crash,
    the journal lets the next run (or ``drain --resume``) restore it.

    Raises AlreadyError when the device is clean and already has the final table.
    """
    mode_cmd = f"lvchange --cachemode {final_mode.value} VG/LV" if final_mode else \
        "lvchange --cachepolicy cleaner VG/LV (and back: lvchange --cachepolicy smq VG/LV)"
    _check_changeable(d, "cache contents" if not final_mode else "mode", mode_cmd)
    if final_mode is not None and final_mode not in DM_CACHE_MODES:
        raise _bad_mode(final_mode)
    _root("flushing a dm-cache device")
    with state.locked(_key(d), d.node), _term_as_interrupt():
        d = _recover(sysfs, d)
        final = d.table.with_mode(final_mode) if final_mode else d.table
        return _flush_locked(d, final, require_clean=final.mode == CacheMode.PASSTHROUGH,
                             timeout=timeout, stall_timeout=stall_timeout, confirm=confirm,
                             interval=interval, progress=progress)


def _recover(sysfs: Sysfs, d: DmCacheDevice) -> DmCacheDevice:
    if state.read_json(_journal(d)) is not None and restore_saved(sysfs, d):
        return find(sysfs, d.name)
    return d


def _flush_locked(d: DmCacheDevice, final: DmCacheTable | str, *, require_clean: bool,
                  timeout: float, stall_timeout: float, confirm: float, interval: float,
                  progress: Callable[[DrainProgress], None] | None) -> FlushResult:
    assert d.status is not None
    original = d.table
    live_line = original.line()
    thr = d.status.migration_threshold
    final_line = final if isinstance(final, str) else _with_threshold(final, thr).line()
    t0 = time.monotonic()
    if d.status.dirty == 0:
        time.sleep(min(confirm, 0.2))
        st = read_status(d.name)
        if not isinstance(st, str) and st.dirty == 0:
            if final_line == live_line:
                raise AlreadyError(f"{d.node} is already clean (0 dirty blocks)")
            _switch(d.name, live_line, final_line, require_clean=require_clean)
            return FlushResult(d.node, 0, time.monotonic() - t0, {}, final_line)
    keep_mode = CacheMode.WRITETHROUGH if original.mode == CacheMode.WRITEBACK else original.mode
    # migration_threshold decides whether the policy is told "idle": no IO for a second and
    # (migrations in flight + 1) x block <= threshold (spare_migration_bandwidth in
    # dm-cache-target.c). Below one block it never is, and the cleaner then only gets the
    # blocks past its writeback sentinels, a batch every 10 s. The flush uses at least two
    # blocks; the live value comes back with the restored table.
    flush_thr = max(thr or DEFAULT_MIGRATION_THRESHOLD, 2 * original.block_sectors)
    flush_args = ("migration_threshold", str(flush_thr)) \
        if flush_thr != DEFAULT_MIGRATION_THRESHOLD else ()
    flush_t = original.with_mode(keep_mode).with_policy("cleaner", flush_args)
    flush_line = flush_t.line()
    restore_line = _with_threshold(original, thr).line()
    path = _journal(d)
    state.write_json(path, {"device": d.node, "name": d.name, "uuid": d.uuid,
                            "original": restore_line, "flush": flush_line,
                            "started": time.time()})
    switched = done = False
    try:
        _switch(d.name, live_line, flush_line)  # on failure the live table runs on
        switched = True
        start = _poll_clean(d, timeout=timeout, stall_timeout=stall_timeout, confirm=confirm,
                            interval=interval, progress=progress, t0=t0)
        _switch(d.name, flush_line, final_line, require_clean=require_clean)
        done = True
        return FlushResult(d.node, start, time.monotonic() - t0,
                           {"mode": original.mode.value, "policy": original.policy},
                           final_line)
    finally:
        if switched and not done:
            try:
                _switch(d.name, flush_line, restore_line)
                log.info("%s: original table restored: %s", d.node, restore_line)
            except CacheMgrError as exc:
                log.error("%s: could not restore the table (%s); the journal %s keeps it: "
                          "cachemgr drain %s --resume", d.node, exc, path, d.name)
                raise
        path.unlink(missing_ok=True)


def _poll_clean(d: DmCacheDevice, *, timeout: float, stall_timeout: float, confirm: float,
                interval: float, progress: Callable[[DrainProgress], None] | None,
                t0: float) -> int:
    """Poll ``#dirty`` to 0 (twice, ``confirm`` s apart); returns the starting dirty bytes."""

    def sample() -> drainloop.Sample[DmCacheStatus]:
        st = read_status(d.name)
        if isinstance(st, str):
            raise CacheMgrError(f"{d.node}: the cache failed ({st}) while flushing; see dmesg",
                                hint="keep the cache device: the dirty blocks are on it")
        return drainloop.Sample(st, st.dirty_bytes,
                                CacheState.DIRTY if st.dirty else CacheState.CLEAN,
                                st.dirty == 0, st.dirty)

    def stalled(st: DmCacheStatus, progressed: bool) -> StallError:
        return StallError(
            f"{d.node}: no progress for {stall_timeout:g} s ({st.dirty} dirty blocks, "
            f"{human(st.dirty_bytes)}); the original table is put back, the dirty data stays "
            "safe in the cache",
            hint="check the origin device for errors (dmesg); a longer --stall-timeout "
                 "gives the cleaner more writeback periods")

    def timed_out(st: DmCacheStatus) -> TimeoutExpired:
        return TimeoutExpired(f"{d.node}: still {st.dirty} dirty blocks after {timeout:g} s "
                              "of flushing; the original table is put back")

    r = drainloop.wait_clean(sample, action="flush", device=d.node, timeout=timeout,
                             stall_timeout=stall_timeout, confirm=confirm, interval=interval,
                             progress=progress, stall_error=stalled, timeout_error=timed_out,
                             rate="mean", t0=t0)
    return r.start_bytes or 0


# ---------------------------------------------------------------------------------------
# mode, remove, tunables


def _bad_mode(mode: CacheMode | str) -> UsageError:
    word = mode.value if isinstance(mode, CacheMode) else mode
    hint = "dm-cache modes: writeback, writethrough, passthrough"
    if word == "none":
        hint += " (passthrough is dm-cache's none)"
    return UsageError(f"dm-cache has no cache mode {word!r}", hint=hint)


def set_mode(sysfs: Sysfs, d: DmCacheDevice, mode: CacheMode) -> Change:
    """Switch the mode by suspend / reload / resume. passthrough needs a clean cache: refused
    (exit 3) while dirty, with the advice to drain; writeback -> passthrough goes through
    writethrough so that no write can dirty a block between the check and the switch."""
    if mode not in DM_CACHE_MODES:
        raise _bad_mode(mode)
    _check_changeable(d, "mode", f"lvchange --cachemode {mode.value} VG/LV")
    if d.table.mode == mode and d.mode == mode:
        raise AlreadyError(f"{d.node} is already in {mode.value} mode")
    _root("changing a dm-cache mode")
    with state.locked(_key(d), d.node):
        d = _recover(sysfs, d)
        assert d.status is not None
        before = d.mode
        thr = d.status.migration_threshold
        live = d.table.line()
        via_wt = False
        if mode == CacheMode.PASSTHROUGH:
            _refuse_dirty(d)
            if d.table.mode == CacheMode.WRITEBACK:
                # no write can dirty a clean block in writethrough: the check below holds
                wt = _with_threshold(d.table.with_mode(CacheMode.WRITETHROUGH), thr).line()
                _switch(d.name, live, wt)
                live, via_wt = wt, True
        new = _with_threshold(d.table.with_mode(mode), thr).line()
        try:
            _switch(d.name, live, new, require_clean=mode == CacheMode.PASSTHROUGH)
        except (UnsafeError, CommandError) as exc:
            # _switch left ``live`` running; undo the step through writethrough too
            if via_wt:
                _switch(d.name, live, _with_threshold(d.table, thr).line())
            if mode != CacheMode.PASSTHROUGH or (isinstance(exc, CommandError)
                                                 and "resume" not in exc.argv):
                raise
            raise _dirty_refusal(find(sysfs, d.name), "dirty blocks appeared") from exc
    now = find(sysfs, d.name)
    if now.mode != mode:
        raise CacheMgrError(f"{d.node}: loaded {mode.value} but the kernel reports {now.mode}")
    return Change(d.node, "cache_mode", before.value, now.mode.value)


def _dirty_refusal(d: DmCacheDevice, detail: str = "") -> UnsafeError:
    n = d.status.dirty if d.status else "?"
    size = human(d.dirty_bytes) if d.dirty_bytes is not None else "?"
    msg = (f"{d.node} has {n} dirty blocks ({size}) in its cache; dm-cache accepts "
           "passthrough only when every block is clean; nothing was changed")
    if detail:
        msg += f" ({detail})"
    return UnsafeError(msg, hint=f"flush first: cachemgr mode {d.name} passthrough --drain")


def _refuse_dirty(d: DmCacheDevice) -> None:
    if d.status is None or d.status.dirty:
        raise _dirty_refusal(d)


def in_use_reason(d: DmCacheDevice) -> str | None:
    if d.holders:
        return f"held by {', '.join(d.holders)}"
    if d.open_count:
        return f"open {d.open_count} time(s) (a VM, a mount or another program uses it)"
    return None


def remove(sysfs: Sysfs, d: DmCacheDevice, *, keep_device: bool = False,
           timeout: float = 24 * 3600, stall_timeout: float = 60.0, confirm: float = 1.0,
           progress: Callable[[DrainProgress], None] | None = None) -> list[Change]:
    """Safe decommission: flush, then replace the table by a ``linear`` mapping of the
    origin (checked clean while suspended), then ``dmsetup remove``. The origin then holds
    every byte written. Refused while the device is in use unless ``keep_device`` (the
    device stays, now linear over the origin, and its users keep running)."""
    _check_changeable(d, "cache", "lvconvert --uncache VG/LV")
    if d.table.start != 0:
        raise UsageError(f"{d.node}: the cache target starts at sector {d.table.start}; "
                         "cachemgr removes whole-device caches only")
    why = in_use_reason(d)
    if why and not keep_device:
        raise UnsafeError(
            f"{d.node} is in use ({why}); removing it would pull the disk from under its "
            "users; nothing was changed",
            hint=f"stop its users first, or keep the device as a plain mapping of the "
                 f"origin: cachemgr remove {d.name} --keep-device")
    _root("removing a dm-cache device")
    linear = f"0 {d.table.length} linear {d.table.origin_dev} 0"
    changes: list[Change] = []
    with state.locked(_key(d), d.node), _term_as_interrupt():
        d = _recover(sysfs, d)
        assert d.status is not None
        dirty = d.status.dirty
        res = _flush_locked(d, linear, require_clean=True, timeout=timeout,
                            stall_timeout=stall_timeout, confirm=confirm, interval=0.5,
                            progress=progress)
        if dirty:
            changes.append(Change(d.node, "flush", f"{dirty} dirty blocks", "0 dirty blocks"))
        changes.append(Change(d.node, "table", "cache", f"linear {d.table.origin_dev}"))
        if not keep_device:
            dmsetup("remove", "--retry", d.name, timeout=60)
            changes.append(Change(d.node, "remove", "linear", None))
    log.info("%s: removed after %.1f s of flushing", d.node, res.elapsed_s)
    return changes


def set_migration_threshold(sysfs: Sysfs, d: DmCacheDevice, sectors: int) -> Change:
    """``dmsetup message NAME 0 migration_threshold N``: how many sectors of migration
    (promotion, demotion, writeback) may be in flight; read back from the status. A table
    reload resets it to the table's value: cachemgr's own reloads carry it forward."""
    _check_changeable(d, "migration_threshold",
                      f"lvchange --cachesettings migration_threshold={sectors} VG/LV")
    assert d.status is not None
    if not d.table.block_sectors <= sectors <= 2**32 - 1:
        raise UsageError(
            f"migration_threshold must be at least one cache block ({d.table.block_sectors} "
            f"sectors) and at most {2**32 - 1}, not {sectors}",
            hint="below one block the policy never sees the device idle: smq never writes "
                 "dirty blocks back and a flush crawls")
    before = d.status.migration_threshold
    if before == sectors:
        raise AlreadyError(f"{d.node}: migration_threshold is already {sectors}")
    _root("tuning a dm-cache device")
    dmsetup("message", d.name, "0", "migration_threshold", str(sectors))
    st = read_status(d.name)
    after = None if isinstance(st, str) else st.migration_threshold
    if after != sectors:
        raise CacheMgrError(f"{d.node}: wrote migration_threshold={sectors}, the kernel "
                            f"keeps {after}")
    return Change(d.node, "migration_threshold", str(before), str(after))


# ---------------------------------------------------------------------------------------
# create


def parse_size(text: str) -> int:
    """``64k``, ``512K``, ``1M``, ``65536`` (bytes) -> bytes
    (:func:`cachemgr.core.model.parse_size`)."""
    return _parse_size(text, hint="e.g. 64k, 256k, 1M")


def default_block_bytes(cache_bytes: int) -> int:
    """64 KiB (lvm2's default), doubled until the cache has at most a million blocks."""
    bs = DEFAULT_BLOCK_BYTES
    while cache_bytes // bs > MAX_DEFAULT_BLOCKS and bs < MAX_BLOCK_SECTORS * 512:
        bs *= 2
    return bs


def metadata_bytes_needed(cache_bytes: int, block_bytes: int) -> int:
    """4 MiB + 16 bytes per cache block: the sizing rule of thumb from the dm-cache
    documentation and thin-provisioning-tools' cache_metadata_size (generous: the lab's
    4096-block cache used 23 metadata blocks of 4 KiB)."""
    return 4 * 1024 * 1024 + 16 * (cache_bytes // block_bytes)


def _size_bytes(sysfs: Sysfs, kname: str, dirs: dict[str, str]) -> int:
    n = sysfs.read_int(f"{dirs[kname]}/size")
    if not n:
        raise UsageError(f"/dev/{kname} has no size (empty or gone)")
    return n * 512


def has_cache_metadata(node: str) -> bool:
    """Does the device start with a dm-cache metadata superblock (magic at byte 32)?"""
    try:
        with open(node, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return len(head) >= 40 and int.from_bytes(head[32:40], "little") == CACHE_SUPERBLOCK_MAGIC


def _signature(node: str) -> str | None:
    return ", ".join(signatures.found(node)) or None


def _zero_superblock(node: str) -> None:
    """Zero the first 4 KiB: dm-cache then formats fresh metadata (cache.rst). O_EXCL makes
    the open fail if anything holds the device exclusively (a mount, dm, bcache, md)."""
    fd = os.open(node, os.O_WRONLY | os.O_EXCL)
    try:
        os.write(fd, b"\0" * 4096)
        os.fsync(fd)
    finally:
        os.close(fd)


def create(sysfs: Sysfs, name: str, *, origin: str, cache: str, metadata: str,
           mode: CacheMode = CacheMode.WRITEBACK, block_bytes: int | None = None,
           policy: str = "smq", force: bool = False) -> list[Change]:
    """Create dm-cache device ``name`` over ``origin`` with ``cache`` and ``metadata``.

    The origin's data is kept (it is what the new device shows); the cache device's and the
    metadata's contents are overwritten: refused if either carries a signature or the
    metadata already holds dm-cache metadata (possibly another cache's dirty blocks), unless
    ``force``. Busy devices are always refused.
    """
    if mode not in DM_CACHE_MODES:
        raise _bad_mode(mode)
    if not name or "/" in name or name.startswith("-") or len(name) > 127 \
            or any(c.isspace() for c in name):
        raise UsageError(f"bad dm name {name!r}", hint="letters, digits, '_', '-', '.'")
    _root("creating a dm-cache device")
    devs = dm_devices(sysfs)
    nodes = {"origin": origin, "cache": cache, "metadata": metadata}
    knames: dict[str, str] = {}
    for role, node in nodes.items():
        if not os.path.exists(node):
            raise UsageError(f"{node} ({role}): no such device")
        k = sysfs.block_name_of(node)
        if k is None:
            raise UsageError(f"{node} ({role}) is not a block device")
        knames[role] = k
    if len(set(knames.values())) != 3:
        raise UsageError("origin, cache and metadata must be three different devices")
    if name in devs:
        try:
            cur = find(sysfs, name)
        except UsageError:
            raise UsageError(f"/dev/mapper/{name} exists already (not a dm-cache device)"
                             ) from None
        same = {cur.origin.name if cur.origin else None, cur.cache.name if cur.cache else None,
                cur.metadata.name if cur.metadata else None} == set(knames.values())
        if same:
            raise AlreadyError(f"/dev/mapper/{name} already caches {origin} with {cache}")
        raise UsageError(f"/dev/mapper/{name} exists already (another dm-cache device)")
    for role, node in nodes.items():
        why = in_use(sysfs, node)
        if why:
            for x in devs.values():  # "in use by dm-1" -> "... dm-1 (/dev/mapper/vc)"
                why = re.sub(rf"\b{x.kernel_name}\b", f"{x.kernel_name} (/dev/mapper/{x.name})",
                             why)
            raise UnsafeError(f"{node} ({role}) is busy: {why}; nothing was changed")
    if not force:
        if has_cache_metadata(metadata):
            raise UnsafeError(
                f"{metadata} holds dm-cache metadata already: it may belong to another cache "
                "whose dirty blocks are still on its cache device; nothing was changed",
                hint="if that cache is gone for good, repeat with --force (zeroes it)")
        for role in ("cache", "metadata"):
            sig = _signature(nodes[role])
            if sig:
                raise UnsafeError(
                    f"{nodes[role]} ({role}) carries a {sig} signature; its contents would "
                    "be overwritten; nothing was changed",
                    hint="wipe it (wipefs -a) if it is unused, or repeat with --force")
    dirs = block_dirs(sysfs)
    origin_bytes = _size_bytes(sysfs, knames["origin"], dirs)
    cache_bytes = _size_bytes(sysfs, knames["cache"], dirs)
    meta_bytes = _size_bytes(sysfs, knames["metadata"], dirs)
    bs = block_bytes if block_bytes is not None else default_block_bytes(cache_bytes)
    if bs % (MIN_BLOCK_SECTORS * 512) or not MIN_BLOCK_SECTORS * 512 <= bs <= \
            MAX_BLOCK_SECTORS * 512:
        raise UsageError(f"block size {human(bs)} is not a multiple of 32 KiB between 32 KiB "
                         "and 1 GiB (cache.rst)")
    if cache_bytes < bs:
        raise UsageError(f"{cache} ({human(cache_bytes)}) is smaller than one cache block")
    need = metadata_bytes_needed(cache_bytes, bs)
    if meta_bytes < need and not force:
        raise UsageError(
            f"{metadata} ({human(meta_bytes)}) is too small for the metadata of "
            f"{cache_bytes // bs} cache blocks: needs about {human(need)}",
            hint="a larger metadata device, or a larger --block-size")
    if origin_bytes % 512:
        raise UsageError(f"{origin}: size is not a whole number of sectors")
    _zero_superblock(metadata)
    table = DmCacheTable(0, origin_bytes // 512, metadata, cache, origin, bs // 512,
                         (mode.value,), policy, ())
    dmsetup("create", name, "--table", table.line())
    d = find(sysfs, name)
    return [Change(d.node, "create", None,
                   f"dm-cache {mode.value} over {origin} (cache {cache}, metadata {metadata}, "
                   f"block {human(bs)}, {d.status.total if d.status else '?'} blocks)")]
