"""Block traces for cache sizing: record (blktrace + SHARDS sampling), the trace file, reading.

Sampling is SHARDS (Waldspurger, Park, Garthwaite, Ahmad: "Efficient MRC Construction with
SHARDS", FAST '15): a block is kept when a hash of its address falls under a threshold, so a
sampled block is kept on *every* reference and the reuse distances among sampled blocks,
divided by the rate, estimate the full trace's (docs/admin-guide.md, "Sizing a cache from the
host's own IO"). A request is written to the file when at least one of its blocks is sampled,
whole, so a trace at rate 1 can be replayed as recorded; the analysis hashes the blocks again
and counts only the sampled ones. A lower rate can be applied afterwards (the test is
``hash < rate * 2^24``: every block kept at a lower rate is also kept at a higher one).

The file: gzip of
  ``cachemgr-trace 1\\n``, a JSON header line (devices, block size, rate),
  records of :data:`RECORD` (time s, offset B, length B, device index, op),
  an end record (device 255), a JSON trailer line (totals of *all* requests, the devices'
  own counters over the recording, how it ended).
A file cut short (the recorder killed) has no trailer: it can still be read, and says so.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.backends import blktrace
from cachemgr.backends.blockdev import read_stat
from cachemgr.core.defaults import COUNT_TABLE as COUNT_TABLE  # blocks counted at most
from cachemgr.core.errors import UsageError
from cachemgr.core.signals import terminate_as_interrupt
from cachemgr.core.sysfs import Sysfs

MAGIC_LINE = b"cachemgr-trace 1\n"
RECORD = struct.Struct("<dQIBB")  # time (s from start), offset, length (bytes), device, op
END_DEVICE = 255
RATE_BITS = 24
OPS = ("read", "write", "discard")
MAX_DEVICES = 254
REORDER_S = 2.0  # events of different CPUs arrive out of order by less than this

Progress = Callable[[str], None]


def _mix(x: int) -> int:
    """splitmix64's finaliser: a fast hash with every input bit reaching every output bit."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def threshold(rate: float) -> int:
    if not 0 < rate <= 1:
        raise UsageError(f"a sampling rate is in (0, 1], not {rate}", hint="e.g. --rate 0.01")
    return max(1, round(rate * (1 << RATE_BITS)))


def _hash(dev: int, block: int) -> int:
    """A block's 24-bit sampling hash (the recorder's loop computes it inline)."""
    return _mix((dev << 56) ^ block ^ 0x9E3779B97F4A7C15) >> (64 - RATE_BITS)


def sampled(dev: int, block: int, thr: int) -> bool:
    """Whether block ``block`` of device index ``dev`` is in the sample of threshold ``thr``."""
    return _hash(dev, block) < thr


# ----------------------------------------------------------------------------- block counts
#
# Which popular blocks a 1 % sample happens to draw decides most of its curve's error
# (benchmarks/sizing_bench.py oracle). The recorder therefore also counts the references of
# a larger nested sample of blocks (every block at first; when the table is full, the blocks
# of half the threshold, and so on: a block kept is counted from its first reference on) and
# writes, per frequency class, how many blocks and references it holds: the analysis weighs
# each class of the 1 % sample to those totals (two-phase sampling for stratification,
# docs/admin-guide.md "Sizing a cache from the host's own IO").

GROUPS = 10  # the jackknife's groups: the counts are kept per group too
# A counted block's value: reads (bits 0-31), writes (32-71), its jackknife group (72-75) and
# the index of its last reference (76 on), in references of the whole recording. (2^32 reads
# of one block would carry into the writes: 4 days of one block read at 10,000/s.)
_WRITE = 1 << 32
_COUNT_BITS = (1 << 72) - 1
_GROUP = 72
_LAST = 76
_KEEP = (1 << _LAST) - 1  # the value without its last reference
# Reuse times (references between two references to a counted block) are kept in bins of 8
# per octave: times under 16 exactly, then [m << e, (m + 1) << e) for m in 8..15.
RT_EXACT = 16


def key(dev: int, block: int) -> int:
    """A block's key in the analysis and in the counts: device index and block number."""
    return dev << 48 | block


def key_sampled(k: int, thr: int) -> bool:
    return sampled(k >> 48, k & (1 << 48) - 1, thr)


def freq_class(refs: int) -> int:
    """A block's frequency class: floor(log2(its references))."""
    return refs.bit_length() - 1


def group(k: int) -> int:
    """A block's jackknife group: a hash other than the sampling one."""
    return _mix(k ^ 0x2545F4914F6CDD1D) % GROUPS


def value_counts(v: int) -> tuple[int, int]:
    """A counted block's reads and writes, from its value in Counts.table."""
    return v & (_WRITE - 1), (v & _COUNT_BITS) >> 32


def rt_bin(t: int) -> int:
    """The bin of reuse time ``t`` (>= 1): exact under RT_EXACT, then 8 per octave."""
    if t < RT_EXACT:
        return t
    e = t.bit_length() - 4
    return (e << 3) + (t >> e)


def rt_bin_range(b: int) -> tuple[int, int]:
    """The reuse times of bin ``b``: [lo, hi)."""
    if b < RT_EXACT:
        return b, b + 1
    e = (b >> 3) - 1
    m = b - (e << 3)
    return m << e, (m + 1) << e


def band(h: int) -> int:
    """A counted block's hash band (the bit length of its 24-bit hash): a halving of the
    threshold to 2^j forgets exactly the blocks, and their reuse times, of band j + 1."""
    return h.bit_length()


def rt_key(dev: int, bnd: int, g: int, op: int, b: int) -> int:
    """A reuse-time cell: device, band, group, op, bin (bin 1023: first references)."""
    return ((((dev << 5 | bnd) << 4 | g) << 1 | op) << 10) | b


RT_COLD = 1023


@dataclass
class Counts:
    """The counted blocks of a recording: a nested sample at threshold ``thr``, and (with
    ``reuse``) the reuse times of their references, measured in references of everything
    counted from (``n``: the references seen so far, counted blocks or not)."""

    thr: int
    floor: int  # the recorded sample's threshold: never counted below it
    limit: int = COUNT_TABLE
    table: dict[int, int] = field(default_factory=dict)
    reuse: bool = True
    n: int = 0
    rt: dict[int, int] = field(default_factory=dict)

    def add(self, dev: int, block: int, op: int) -> None:
        """Count one reference to a block (the recorder's loop does the same, inline)."""
        if op >= 2:
            return  # discards are not cached: not counted
        self.n += 1
        if not self.thr:
            return
        h = _hash(dev, block)
        if h >= self.thr:
            return
        k = key(dev, block)
        v = self.table.get(k)
        if v is None:
            g = group(k)
            v = g << _GROUP
            if self.reuse:
                c = rt_key(dev, band(h), g, op, RT_COLD)
                self.rt[c] = self.rt.get(c, 0) + 1
        elif self.reuse:
            c = rt_key(dev, band(h), v >> _GROUP & 15, op, rt_bin(self.n - (v >> _LAST)))
            self.rt[c] = self.rt.get(c, 0) + 1
        self.table[k] = ((v & _KEEP) + (_WRITE if op else 1)) | self.n << _LAST
        if len(self.table) > self.limit:
            self.shrink()

    def shrink(self) -> None:
        """Halve the threshold and forget the blocks above it. Down at the recorded rate's the
        counts would be the trace's own: counting stops (threshold 0)."""
        while len(self.table) > self.limit and self.thr:
            thr = self.thr // 2
            if thr <= self.floor:
                self.thr = 0
                self.table = {}
                self.rt = {}
            else:
                table = {k: v for k, v in self.table.items() if key_sampled(k, thr)}
                top = band(thr - 1)
                rt = {c: n for c, n in self.rt.items() if c >> 15 & 31 <= top}
                # Ctrl-C may land anywhere here: the threshold goes first, and to_json()
                # counts only the blocks (and bands) under it, so an interrupted halving is
                # harmless
                self.thr = thr
                self.table = table
                self.rt = rt

    def to_json(self) -> dict[str, Any]:
        """Totals per (device, group, class); threshold 0 and no cells when counting stopped
        (the blocks under the last threshold above the sample's did not fit)."""
        cells: dict[tuple[int, int, int], list[int]] = {}
        for k, v in self.table.items():
            if not key_sampled(k, self.thr):
                continue  # left by a halving that Ctrl-C cut short
            r, w = value_counts(v)
            c = cells.setdefault((k >> 48, v >> _GROUP & 15, freq_class(r + w)), [0, 0, 0])
            c[0] += 1
            c[1] += r
            c[2] += w
        out: dict[str, Any] = {"rate": self.thr / (1 << RATE_BITS), "threshold": self.thr,
                               "groups": GROUPS,
                               "cells": [[*k, *v] for k, v in sorted(cells.items())]}
        if self.reuse and self.thr:
            top = band(self.thr - 1)
            times: dict[tuple[int, int, int, int], int] = {}
            cold: dict[tuple[int, int, int], int] = {}
            for ck, n in self.rt.items():
                b, op, g = ck & 1023, ck >> 10 & 1, ck >> 11 & 15
                bnd, dev = ck >> 15 & 31, ck >> 20
                if bnd > top:
                    continue  # left by a halving that Ctrl-C cut short
                if b == RT_COLD:
                    cold[(dev, g, op)] = cold.get((dev, g, op), 0) + n
                else:
                    times[(dev, g, op, b)] = times.get((dev, g, op, b), 0) + n
            out["reuse"] = {"references": self.n, "bins_per_octave": 8,
                            "exact_below": RT_EXACT,
                            "times": [[*k, v] for k, v in sorted(times.items())],
                            "first": [[*k, v] for k, v in sorted(cold.items())]}
        return out


# ----------------------------------------------------------------------------- the file


@dataclass
class Device:
    index: int
    path: str
    name: str
    devno: str  # "major:minor"
    size: int  # bytes
    start: int = 0  # a partition's first sector on its disk (the kernel's events carry the disk's)


@dataclass
class Header:
    block: int
    rate: float
    devices: list[Device]
    started: float  # epoch seconds
    tool: str = "blktrace -a queue"

    def named(self, name: str) -> list[Device]:
        """The traced devices ``name`` stands for: its path, kernel name or /dev/NAME."""
        return [d for d in self.devices if name in (d.path, d.name, f"/dev/{d.name}")]

    def to_json(self) -> dict[str, Any]:
        return {"schema": 1, "tool": self.tool, "block": self.block, "rate": self.rate,
                "started": self.started, "devices": [vars(d) for d in self.devices]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Header:
        return cls(block=int(doc["block"]), rate=float(doc["rate"]),
                   devices=[Device(**d) for d in doc["devices"]],
                   started=float(doc["started"]), tool=str(doc.get("tool", "")))


@dataclass
class Totals:
    """Counts of every request seen, sampled or not (what the rate is judged against)."""

    requests: list[int] = field(default_factory=lambda: [0, 0, 0])
    blocks: list[int] = field(default_factory=lambda: [0, 0, 0])
    bytes: list[int] = field(default_factory=lambda: [0, 0, 0])
    kept: int = 0  # requests written
    sampled_blocks: list[int] = field(default_factory=lambda: [0, 0, 0])
    device_blocks: list[list[int]] = field(default_factory=list)  # per device index, per op

    def to_json(self) -> dict[str, Any]:
        return {"requests": dict(zip(OPS, self.requests, strict=True)),
                "blocks": dict(zip(OPS, self.blocks, strict=True)),
                "bytes": dict(zip(OPS, self.bytes, strict=True)),
                "sampled_blocks": dict(zip(OPS, self.sampled_blocks, strict=True)),
                "kept_requests": self.kept,
                "device_blocks": [dict(zip(OPS, d, strict=True)) for d in self.device_blocks]}


class Writer:
    def __init__(self, path: str | os.PathLike[str], header: Header) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".part")
        # open across calls (closed by close(), or by the recorder on failure); 0600: which
        # blocks the VMs touch, and when, is the host's business only
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.raw = os.fdopen(fd, "wb")
        self.f = gzip.GzipFile(fileobj=self.raw, mode="wb", compresslevel=6)
        self.f.write(MAGIC_LINE)
        self.f.write(json.dumps(header.to_json()).encode() + b"\n")
        self.pack = RECORD.pack
        self.records = 0
        self.buf = bytearray()  # records are compressed 64 KiB at a time, not one by one

    def add(self, t: float, offset: int, length: int, dev: int, op: int) -> None:
        self.buf += self.pack(t, offset, length, dev, op)
        self.records += 1
        if len(self.buf) >= 1 << 16:
            self.f.write(self.buf)
            self.buf.clear()

    def close(self, trailer: dict[str, Any]) -> None:
        self.f.write(self.buf)
        self.buf.clear()
        self.f.write(RECORD.pack(0.0, 0, 0, END_DEVICE, 0))
        self.f.write(json.dumps(trailer).encode() + b"\n")
        self.abandon()
        os.replace(self.tmp, self.path)

    def abandon(self) -> None:
        """Close the file as it is (close() calls it after the trailer)."""
        self.f.write(self.buf)
        self.buf.clear()
        self.f.close()
        self.raw.close()


@dataclass
class Trace:
    header: Header
    trailer: dict[str, Any] | None
    # columns, to keep a million requests small: times, offsets, lengths, devices, ops
    t: list[float]
    offset: list[int]
    length: list[int]
    dev: list[int]
    op: list[int]

    def __len__(self) -> int:
        return len(self.t)

    @property
    def complete(self) -> bool:
        return self.trailer is not None


class TraceFormatError(UsageError):
    """Not a trace file, or a damaged one (exit 2: bad input)."""


def read(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file (gzip); a file without trailer (cut short) is read as far as it goes."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise UsageError(f"{path}: no such trace file") from None
        if isinstance(exc, EOFError) or "gzip" in str(exc).lower() or "crc" in str(exc).lower():
            raise TraceFormatError(f"{path}: not a cachemgr trace (or damaged): {exc}") from None
        raise
    if not data.startswith(MAGIC_LINE):
        raise TraceFormatError(f"{path}: not a cachemgr trace (no 'cachemgr-trace 1' line)")
    pos = len(MAGIC_LINE)
    nl = data.find(b"\n", pos)
    try:
        header = Header.from_json(json.loads(data[pos:nl]))
    except (ValueError, KeyError, TypeError) as exc:
        raise TraceFormatError(f"{path}: bad trace header: {exc}") from None
    pos = nl + 1
    cols: tuple[list[float], list[int], list[int], list[int], list[int]] = ([], [], [], [], [])
    trailer = None
    size = RECORD.size
    for t, off, ln, dev, op in RECORD.iter_unpack(data[pos:pos + (len(data) - pos) // size * size]):
        if dev == END_DEVICE:
            end = pos + (len(cols[0]) + 1) * size
            try:
                trailer = json.loads(data[end:data.find(b"\n", end)])
            except ValueError:
                trailer = None
            break
        if dev >= len(header.devices) or op >= len(OPS):
            raise TraceFormatError(f"{path}: record {len(cols[0])} names device {dev} / op "
                                   f"{op}, which the header does not have")
        cols[0].append(t)
        cols[1].append(off)
        cols[2].append(ln)
        cols[3].append(dev)
        cols[4].append(op)
    return Trace(header, trailer, *cols)


# ----------------------------------------------------------------------------- recording


def resolve(sysfs: Sysfs, nodes: Sequence[str]) -> list[tuple[Device, str]]:
    """The devices to trace, each with its sysfs directory; refuses what cannot be traced."""
    from cachemgr.backends import bcache

    if not nodes:
        raise UsageError("trace needs at least one DEVICE")
    if len(nodes) > MAX_DEVICES:
        raise UsageError(f"at most {MAX_DEVICES} devices in one trace")
    dirs = bcache.block_dirs(sysfs)
    out: list[tuple[Device, str]] = []
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        name = sysfs.block_name_of(node)
        if name is None:
            raise UsageError(f"{node} is not a block device")
        if name in seen:
            raise UsageError(f"{node} is named twice")
        seen.add(name)
        rel = dirs.get(name)
        if rel is None:
            raise UsageError(f"{node}: {name} is not in sysfs")
        # a partition's trace is its disk's, limited to the partition's sectors, which the
        # events give from the start of the disk (docs/kernel-notes.md, "Block traces")
        start = sysfs.read_int(f"{rel}/start") or 0 if sysfs.exists(f"{rel}/partition") else 0
        dev = (sysfs.read_opt(f"{rel}/dev") or "").strip()
        size = (sysfs.read_int(f"{rel}/size") or 0) * 512
        out.append((Device(i, node, name, dev, size, start), rel))
    return out


Rec = tuple[float, int, int, int, int]  # (t, offset, length, device, op): a written record


class Window:
    """The records not yet written, kept in order as they come (issue #34): blktrace's
    records are time-ordered per CPU, so a chunk is nearly always newer than the window, or
    overlaps only its last few milliseconds. A chunk is sorted (its own size), appended when
    it starts after the window's end, else merged with the window's tail from its first
    time on (one sort of two ordered runs: a merge); the written prefix is skipped by an
    index and dropped when it is half the list. Nothing is sorted again per chunk: the cost
    per record does not grow with the window (at rate 1 and 1 M requests/s it holds two
    million). The order is the full sort's: :meth:`upto` hands out the records with times
    up to a bound in sorted order, as sorting the window and cutting it did before."""

    def __init__(self) -> None:
        self.items: list[Rec] = []
        self.head = 0  # items[:head] are written

    def __len__(self) -> int:
        return len(self.items) - self.head

    def extend(self, new: list[Rec]) -> None:
        if not new:
            return
        new.sort()
        items = self.items
        if len(items) == self.head or new[0] >= items[-1]:
            items.extend(new)
            return
        i = bisect.bisect_right(items, new[0], lo=self.head)
        tail = items[i:]
        del items[i:]
        tail.extend(new)
        tail.sort()  # two ordered runs: timsort merges them in one pass
        items.extend(tail)

    def upto(self, t: float | None) -> list[Rec]:
        """The records with times up to ``t`` (all when None), in order, taken out."""
        items, head = self.items, self.head
        n = len(items) if t is None else bisect.bisect_right(items, t, lo=head,
                                                             key=lambda r: r[0])
        out = items[head:n]
        if n >= len(items):
            items.clear()
            self.head = 0
        elif n > len(items) // 2:
            del items[:n]
            self.head = 0
        else:
            self.head = n
        return out


@dataclass
class Recording:
    path: str
    header: Header
    trailer: dict[str, Any]
    records: int


def record(sysfs: Sysfs, nodes: Sequence[str], out: str | os.PathLike[str], *,
           seconds: float | None, rate: float = 0.01, block: int = 4096,
           progress: Progress | None = None, every: float = 2.0,
           source: Callable[[Sequence[str]], Any] | None = None, stop_wait: float = 15.0,
           count_table: int = COUNT_TABLE) -> Recording:
    """Record the block requests of ``nodes`` for ``seconds`` (None: until Ctrl-C/SIGTERM)
    into ``out``. Ctrl-C and SIGTERM end the recording cleanly: the file is complete.

    ``source`` makes the event stream from the device nodes (tests give one); by default
    blktrace, after its preflight. A blktrace that does not end within ``stop_wait`` seconds
    of being asked is killed (the trailer says so). At most ``count_table`` blocks are
    counted for the trailer's ``block_counts`` (:class:`Counts`)."""
    thr = threshold(rate)
    if block < 512 or block & (block - 1):
        raise UsageError(f"the block size is a power of two of at least 512, not {block}")
    devs = resolve(sysfs, nodes)
    starts = [d.start for d, _ in devs]
    by_raw: dict[int, int] = {}  # the kernel's dev_t (major << 20 | minor) -> device index
    for d, _ in devs:
        major, _, minor = d.devno.partition(":")
        if major.isdigit() and minor.isdigit():
            by_raw[int(major) << 20 | int(minor)] = d.index
    header = Header(block=block, rate=rate, devices=[d for d, _ in devs], started=time.time())
    if source is None:
        blktrace.preflight(sysfs, [d.name for d, _ in devs])
        source = blktrace.Blktrace
    times0 = {d.name: read_stat(sysfs, rel) for d, rel in devs}
    cpu0 = time.process_time()
    w = Writer(out, header)
    tot = Totals(device_blocks=[[0, 0, 0] for _ in devs])
    try:
        bt = source([d.path for d, _ in devs])
    except BaseException:
        w.abandon()
        w.tmp.unlink(missing_ok=True)
        raise
    parser = blktrace.Parser()
    t0_ns: int | None = None
    pending = Window()
    shift = block.bit_length() - 1
    started = time.monotonic()
    last_report = started
    how = "time"
    killed = False

    def flush(upto: float | None) -> None:
        add = w.add
        for rec in pending.upto(upto):
            add(*rec)

    mask = 0xFFFFFFFFFFFFFFFF
    everything = thr >= 1 << RATE_BITS
    counts = Counts(thr=1 << RATE_BITS, floor=thr, limit=count_table)

    def take(chunk: bytes) -> float:
        """Count and sample the Q events in ``chunk``; the newest kept time. The recorder's
        per-event cost is this loop's (benchmarks/sizing_bench.py): sampled() is written out
        here, the same arithmetic, and a rate of 1 skips it."""
        nonlocal t0_ns
        newest = 0.0
        requests, blocks, nbytes_, sampled_blocks = (tot.requests, tot.blocks, tot.bytes,
                                                     tot.sampled_blocks)
        table = counts.table
        rt = counts.rt
        n = counts.n
        dblocks = tot.device_blocks
        kept: list[Rec] = []  # this chunk's, into the window at the end however it ends
        # the clock goes back to counts.n however the loop ends: a Ctrl-C in the middle of a
        # request leaves last-reference indexes up to n in the table, and the events read
        # after the stop must be timed from there (never a reuse time of 0 or below)
        try:
            for t_ns, sector, nbytes, op, dev in parser.feed_raw(chunk):
                di = by_raw.get(dev)
                if di is None:
                    continue
                if t0_ns is None:
                    t0_ns = t_ns
                off = (sector - starts[di]) * 512
                if off < 0:
                    continue
                first = off >> shift
                last = (off + nbytes - 1) >> shift
                requests[op] += 1
                blocks[op] += last - first + 1
                dblocks[di][op] += last - first + 1
                nbytes_[op] += nbytes
                if everything:
                    hit = last - first + 1
                else:
                    hit = 0
                    salt = (di << 56) ^ 0x9E3779B97F4A7C15
                    counted = op < 2  # discards are not cached: not counted
                    one = _WRITE if op else 1
                    base = di << 48
                    cthr = counts.thr
                    for b in range(first, last + 1):
                        x = salt ^ b  # _mix, as sampled() does it
                        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & mask
                        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & mask
                        x = (x ^ (x >> 31)) >> (64 - RATE_BITS)
                        if x < thr:
                            hit += 1
                        if counted:  # Counts.add, written out
                            n += 1
                            if x < cthr:
                                k = base | b
                                v = table.get(k)
                                if v is None:
                                    g = group(k)
                                    v = g << _GROUP
                                    c = rt_key(di, x.bit_length(), g, op, RT_COLD)
                                else:
                                    rb = n - (v >> _LAST)  # the reuse time, then its bin
                                    if rb >= RT_EXACT:
                                        e = rb.bit_length() - 4
                                        rb = (e << 3) + (rb >> e)
                                    c = ((((di << 5 | x.bit_length()) << 4 | v >> _GROUP & 15)
                                          << 1 | op) << 10) | rb
                                rt[c] = rt.get(c, 0) + 1
                                table[k] = ((v & _KEEP) + one) | n << _LAST
                    if len(table) > counts.limit:
                        counts.shrink()
                        table = counts.table
                        rt = counts.rt
                if hit:
                    sampled_blocks[op] += hit
                    tot.kept += 1
                    t = (t_ns - t0_ns) / 1e9
                    if t > newest:
                        newest = t
                    kept.append((t, off, nbytes, di, op))
        finally:
            counts.n = n
            pending.extend(kept)
        return newest

    try:
        with terminate_as_interrupt():
            try:
                while True:
                    now = time.monotonic()
                    if seconds is not None and now - started >= seconds:
                        break
                    if progress and now - last_report >= every:
                        last_report = now
                        left = f", {seconds - (now - started):.0f} s left" if seconds else ""
                        progress(f"{sum(tot.requests):,} requests, {tot.kept:,} kept "
                                 f"({w.records * RECORD.size / 1e6:.1f} MB before gzip)"
                                 f"{left}")
                    chunk = bt.read()
                    if chunk is None:
                        continue
                    if not chunk:
                        how = "blktrace ended"
                        break
                    newest = take(chunk)
                    if len(pending) > 4096:
                        flush(newest - REORDER_S)
            except KeyboardInterrupt as exc:
                how = getattr(exc, "name", None) or "SIGINT"
            bt.stop()
            deadline = time.monotonic() + stop_wait
            while (chunk := bt.read()) != b"":  # what blktrace still held at the stop
                if chunk:
                    take(chunk)
                if time.monotonic() > deadline:
                    bt.kill()
                    killed = True
                    break
            bt.finish()
    except BaseException:
        bt.kill()
        w.abandon()
        w.tmp.unlink(missing_ok=True)
        raise
    flush(None)
    elapsed = time.monotonic() - started
    disks: dict[str, Any] = {}
    for d, rel in devs:
        a, b = times0.get(d.name), read_stat(sysfs, rel)
        if a is not None and b is not None:
            disks[d.name] = vars(b.minus(a))
    trailer = {"seconds": round(elapsed, 3), "ended_by": how, "blktrace_killed": killed,
               **tot.to_json(),
               "diskstats": disks, "recorder_cpu_seconds": round(time.process_time() - cpu0, 3),
               "unparsed_events": parser.skipped, "bad_records": parser.bad_magic}
    if not everything:  # at rate 1 the trace holds every reference
        trailer["block_counts"] = counts.to_json()
    w.close(trailer)
    return Recording(str(out), header, trailer, w.records)


def requests(tr: Trace) -> Iterator[tuple[float, int, int, int, int]]:
    return zip(tr.t, tr.offset, tr.length, tr.dev, tr.op, strict=True)


@dataclass(frozen=True)
class Iolog:
    path: str
    requests: int
    reads: int
    writes: int
    end: int  # the highest byte addressed + 1


def write_iolog(trace: Trace, dev: int, path: str | os.PathLike[str]) -> Iolog:
    """The requests of device ``dev`` as a fio iolog (version 2: ``NAME read OFFSET LENGTH``,
    replayed in order; fio's replay_redirect sends them to the target). The file name in it is
    a fixed word, never the recorded device's name."""
    words = ("read", "write", "trim")
    n = [0, 0, 0]
    end = 0
    with open(path, "w") as f:
        f.write("fio version 2 iolog\ntraced add\ntraced open\n")
        for _t, off, ln, d, op in requests(trace):
            if d != dev:
                continue
            f.write(f"traced {words[op]} {off} {ln}\n")
            n[op] += 1
            end = max(end, off + ln)
        f.write("traced close\n")
    return Iolog(str(path), sum(n), n[0], n[1], end)
