"""Parsers for what dmsetup prints: one ``cache`` line of ``dmsetup table`` and of ``dmsetup
status``, the all-devices listings, and ``dmsetup info``; raise KernelFormatError naming the
line (see the package docstring for what the lab kernels printed)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from cachemgr.core.errors import KernelFormatError
from cachemgr.core.model import DmCacheStatus, DmCacheTable

DEFAULT_MIGRATION_THRESHOLD = 2048  # sectors (cache.rst)
FailWord = Literal["Fail", "Error"]

# at most 20 digits (a u64): int() refuses a run of more than 4300 with a ValueError
INT = re.compile(r"[0-9]{1,20}")
_FRACTION = re.compile(r"([0-9]{1,20})/([0-9]{1,20})")
DEVNO = re.compile(r"^[0-9]+:[0-9]+$")
_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def number(tok: str, what: str, line: str, *, target: str = "dm-cache") -> int:
    """``tok`` as a number (at most 20 digits), or KernelFormatError naming ``target``'s
    ``what`` and the line."""
    if not INT.fullmatch(tok):
        raise KernelFormatError(f"{target} {what}", line)
    return int(tok)


def split_target_line(line: str) -> tuple[int, int, str, list[str]]:
    """``<start> <length> <target> <params...>`` (one line of dmsetup table/status)."""
    toks = line.split()
    if len(toks) < 3:
        raise KernelFormatError("device-mapper target line", line)
    return (number(toks[0], "start sector", line), number(toks[1], "length", line), toks[2],
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
        if not (DEVNO.match(dev) or dev.startswith("/dev/")):
            raise KernelFormatError("dm-cache table line (device)", line)
    bs = number(p[3], "block size", line)
    nf = number(p[4], "feature count", line)
    i = 5 + nf
    if len(p) < i + 2:
        raise KernelFormatError("dm-cache table line (features)", line)
    features = tuple(p[5:i])
    policy = p[i]
    npa = number(p[i + 1], "policy argument count", line)
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
    as dirty and concluded the cleaner does not flush). Kernels before 4.2 end after the
    policy arguments, without ``rw|ro`` and ``needs_check|-`` (those come with the fail-io
    mode, dm-cache-target.c cache_status); their ``mq`` policy prints its tunables as
    counted key/value pairs (telegraf's dmcache test data, one line)::

        0 4883791872 cache 8 1018/1501122 512 7/464962 139 352643 15 46 0 7 0 1 writeback
            2 migration_threshold 2048 mq 10 random_threshold 4 sequential_threshold 512
            discard_promote_adjustment 1 read_promote_adjustment 4 write_promote_adjustment 8

    Such a line reads with ``metadata_mode`` and ``needs_check`` None (not reported). A
    failed cache prints ``Fail`` (dm-cache-target.c cache_status, CM_FAIL) and a metadata
    read error ``Error``: those are returned as the word. Anything else (kernels before
    3.14 printed neither block size nor policy name) raises KernelFormatError naming the
    line (docs/kernel-notes.md, "dm-cache status by kernel version").
    """
    _, _, target, p = split_target_line(line)
    if target != "cache":
        raise KernelFormatError("dm-cache status line (not a cache target)", line)
    if p in (["Fail"], ["Error"]):
        return "Fail" if p[0] == "Fail" else "Error"
    if len(p) < 12:
        raise KernelFormatError("dm-cache status line (too short)", line)

    def frac(tok: str, what: str) -> tuple[int, int]:
        m = _FRACTION.fullmatch(tok)
        if not m:
            raise KernelFormatError(f"dm-cache status line ({what})", line)
        return int(m.group(1)), int(m.group(2))

    md_bs = number(p[0], "metadata block size", line)
    md_used, md_total = frac(p[1], "metadata blocks")
    bs = number(p[2], "cache block size", line)
    used, total = frac(p[3], "cache blocks")
    nums = [number(t, "counter", line) for t in p[4:11]]
    nf = number(p[11], "feature count", line)
    i = 12 + nf
    features = tuple(p[12:i])
    if len(p) < i + 1:
        raise KernelFormatError("dm-cache status line (features)", line)
    nc = number(p[i], "core argument count", line)
    core = p[i + 1:i + 1 + nc]
    if nc % 2 or len(core) != nc:
        raise KernelFormatError("dm-cache status line (core arguments)", line)
    i += 1 + nc
    if len(p) < i + 2:
        raise KernelFormatError("dm-cache status line (policy)", line)
    policy = p[i]
    npa = number(p[i + 1], "policy argument count", line)
    pargs = tuple(p[i + 2:i + 2 + npa])
    i += 2 + npa
    tail = p[i:]
    # 4.2 and later end in <rw|ro> <needs_check|->; before 4.2 the line ends here
    if (len(pargs) != npa or len(tail) not in (0, 2)
            or (tail and (tail[0] not in ("rw", "ro")
                          or tail[1] not in ("needs_check", "-")))):
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
        policy=policy, policy_args=pargs, metadata_mode=tail[0] if tail else None,
        needs_check=tail[1] == "needs_check" if tail else None,
    )


def parse_listing(text: str, names: set[str]) -> dict[str, list[str]]:
    """``dmsetup table`` / ``dmsetup status`` for all devices: name -> its target lines.

    Every line carries its device's name (``multi: 0 1024 linear 98:0 0`` and
    ``multi: 1024 1024 linear 98:0 4096`` for a two-target device). Names may contain ": ",
    so the longest known name (from sysfs) that prefixes the line wins. "No devices found"
    means none.
    """
    out: dict[str, list[str]] = {}
    known = set(names)
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.strip() == "No devices found":
            continue
        # a known name prefixes the line iff ": " follows it there: the longest is the last
        # such ": " (one look per ": " in the line, not one per known name)
        name = None
        i = line.find(": ")
        while i >= 0:
            if line[:i] in known:
                name = line[:i]
            i = line.find(": ", i + 1)
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
        out[name] = DmInfo(name, fields.get("State"),
                           int(opened) if INT.fullmatch(opened) else None,
                           mm if DEVNO.fullmatch(mm) else None, fields.get("UUID") or None)
    return out
