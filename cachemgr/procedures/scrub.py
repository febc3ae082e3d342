"""``cachemgr scrub``: compare what a cache serves with what its origin holds, block by block,
paced so that the VMs' IO keeps its p99 latency (issue #42 item 4).

A write-through (or clean) cache holds copies of its origin's blocks; nothing in Linux checks
that a copy still is one (a bit flip on the SSD, a kernel bug, a write that reached the origin
around the cache: lvm2#26, flashcache#193). This reads each block twice, O_DIRECT (past every
page cache):

* what the cache serves: the cached device the VMs use (``/dev/bcacheN``,
  ``/dev/mapper/NAME``), at the block's offset;
* what the origin holds: the origin device itself, never through the cache (a dm-cache's
  origin device; a bcache backing device past its data offset, ``bcache-super-show``'s
  ``dev.data.first_sector``).

Which blocks: the kind says (:class:`Source`). A dm-cache device (and an LVM cache) lists the
origin blocks its cache holds in its metadata (backends/dmcache/mappings.py): only those are
read, and each read through the cache is a hit. bcache keeps no list of the blocks it holds
that userspace can read: the whole device is read, as one sequential stream (bcache's
``sequential_cutoff`` bypasses a stream past 4 MiB by default: what it does not hold is read
from the backing device without being admitted; docs/admin-guide.md, "Scrubbing a cache").

A block that differs is read again, both sides, up to :data:`RECHECKS` times: a VM's write
between the two reads (in write-through the cache and the origin are written side by side)
changes one side between two reads, and a block counts as a mismatch only when both sides
read the same twice in a row and still differ. One that never holds still is counted apart
(``unsettled``), never as a mismatch.

Pacing: the drain's controller (core/pace.py ``Pacer``, ``LatencyMeter``, ``Sampler``): the
VMs' latency from the cached device's block-layer counters, its IOs less the scrub's own
reads of it and all its milliseconds (so it reads high while the scrub reads much: the
bound errs on the VMs' side; :class:`Paced`); the pace is the scrub's bytes per
second read from the cached device (the origin is read as much again), lowered above the
bound and raised under half of it, unpaced when no other IO comes.

The results are kept per device (``scrub/KEY.json`` in the state directory): status, check (a
WARNING while the last scrub of a device found mismatches) and the metrics read them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachemgr.core import pace, state
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.model import human

RECORD = "scrub"  # the state directory's records, one per device
RECHECKS = 4  # reads again of a block that differed, before it is "unsettled"
RECHECK_S = 0.05  # between two of them (a VM's write-through write completes meanwhile)
CHUNK = 1 << 20  # the most read at once on a device without a list of its blocks
PAGE = 4096  # the unit a mismatch is reported in within a larger block
START_PACE = 8192  # sectors per second (4 MiB/s) until the VMs' IO is measured
FLOOR_PACE = 256  # sectors per second (128 KiB/s): slower, a scrub of a large cache never ends

Progress = Callable[[object], None]


@dataclass(frozen=True)
class Source:
    """What a kind gives a scrub of one device (Kind.scrub_source)."""

    served: str  # the node read for what the cache serves (the device the VMs use)
    origin: str  # the node read for what the origin holds
    origin_offset: int  # bytes: where the served device's byte 0 sits on ``origin``
    unit: int  # bytes compared at a time (a dm-cache block; CHUNK for a whole device)
    size: int  # bytes of the served device
    # the units to compare, by number; None: all of them (read CHUNK at a time, a mismatch
    # told per 4 KiB page)
    blocks: tuple[int, ...] | None
    how: str  # which blocks, in words
    meter: str | None = None  # the served device's kernel name (its stat counters)
    # per compared unit, the cache's own place for it (a dm-cache's cache block), to drop
    # exactly the mismatched ones
    places: dict[int, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.blocks) if self.blocks is not None else -(-self.size // self.unit)

    @property
    def total_bytes(self) -> int:
        if self.blocks is None:
            return self.size
        return sum(min(self.unit, self.size - b * self.unit) for b in self.blocks
                   if b * self.unit < self.size)


@dataclass(frozen=True)
class Mismatch:
    """One unit the cache served unlike the origin: its number, its byte range on the served
    device, and the 4 KiB pages within it that differ."""

    block: int
    offset: int
    length: int
    pages: tuple[int, ...]  # byte offsets on the served device of the 4 KiB pages differing

    def to_json(self) -> dict[str, Any]:
        return {"block": self.block, "offset": self.offset, "length": self.length,
                "pages": list(self.pages)}


@dataclass
class Scrubbed:
    """What a scrub compared and found."""

    device: str
    blocks: int = 0  # units compared
    bytes: int = 0  # of the served device compared
    mismatches: list[Mismatch] = field(default_factory=list)
    unsettled: list[int] = field(default_factory=list)  # changed under every re-read
    rechecked: int = 0  # units that differed once and then agreed (a write in between)
    seconds: float = 0.0
    pacing: dict[str, Any] | None = None
    ended_by: str = "done"

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "blocks": self.blocks, "bytes": self.bytes,
                "mismatches": [m.to_json() for m in self.mismatches],
                "unsettled": self.unsettled, "rechecked": self.rechecked,
                "seconds": round(self.seconds, 3), "pacing": self.pacing,
                "ended_by": self.ended_by}


@dataclass(frozen=True)
class ScrubProgress:
    """One progress report (every face shows it from these fields)."""

    device: str
    done_bytes: int
    total_bytes: int
    mismatches: int
    elapsed_s: float
    pace: str
    action: str = "scrub"

    @property
    def fraction(self) -> float:
        return min(1.0, self.done_bytes / self.total_bytes) if self.total_bytes else 1.0

    @property
    def eta_s(self) -> float | None:
        if not self.done_bytes or self.elapsed_s <= 0:
            return None
        return (self.total_bytes - self.done_bytes) * self.elapsed_s / self.done_bytes

    def __str__(self) -> str:
        return (f"scrub {self.device}: {human(self.done_bytes)} of {human(self.total_bytes)} "
                f"compared ({100 * self.fraction:.0f}%), {self.mismatches} mismatched; "
                f"{self.pace}")


# ------------------------------------------------------------------------------- reading


class _Reader:
    """O_DIRECT reads of one device into one aligned buffer, their count and time kept
    (the scrub's own share of the device's counters)."""

    def __init__(self, node: str, size: int) -> None:
        self.fd = os.open(node, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
        self.buf = mmap.mmap(-1, max(size, PAGE))
        self.ios = 0
        self.ms = 0.0
        self.sectors = 0

    def read(self, off: int, ln: int) -> bytes:
        view = memoryview(self.buf)
        try:
            t0 = time.monotonic()
            got = os.preadv(self.fd, [view[:ln]], off)
            self.ms += (time.monotonic() - t0) * 1000
            self.ios += 1
            self.sectors += max(got, 0) // 512
            return bytes(view[:max(got, 0)])
        finally:
            view.release()

    def close(self) -> None:
        self.buf.close()
        os.close(self.fd)


@contextlib.contextmanager
def _readers(src: Source, unit: int) -> Iterator[tuple[_Reader, _Reader]]:
    served = _Reader(src.served, unit)
    try:
        origin = _Reader(src.origin, unit)
    except BaseException:
        served.close()
        raise
    try:
        yield served, origin
    finally:
        served.close()
        origin.close()


def pages_differing(a: bytes, b: bytes) -> list[int]:
    """The offsets within the block of the 4 KiB pages where ``a`` and ``b`` differ."""
    return [i for i in range(0, max(len(a), len(b)), PAGE) if a[i:i + PAGE] != b[i:i + PAGE]]


def units(src: Source) -> Iterator[tuple[int, int, int]]:
    """(unit number, offset, length) of every unit to compare, in address order."""
    numbers: Sequence[int] = sorted(src.blocks) if src.blocks is not None else range(src.count)
    for b in numbers:
        off = b * src.unit
        if off >= src.size:
            continue
        yield b, off, min(src.unit, src.size - off)


# ------------------------------------------------------------------------------- pacing


class Paced:
    """The drain's pacer over the scrub's reads (module docstring): ``wait(nbytes)`` after
    each read sleeps as long as the pace asks, reading the counters meanwhile."""

    def __init__(self, bound_ms: float | None, counters: Callable[[], pace.Counters | None],
                 served: _Reader, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.clock = clock
        self.pacer = (pace.Pacer(bound_ms, floor=FLOOR_PACE, start=START_PACE)
                      if bound_ms is not None else None)
        self.meter = pace.LatencyMeter()
        self.served = served
        self.slowest: int | None = None

        last: list[tuple[pace.Counters, int, float]] = []  # the device's, ours (ios, ms)
        total = [0, 0]  # the VMs' IOs and milliseconds so far, as the meter reads them

        def vm() -> pace.Counters | None:
            c = counters()
            if c is None:
                return None
            # the VMs' IO: the IOs the device counted since the last reading less the
            # scrub's own reads of it, and all the milliseconds it counted, the scrub's
            # included: the VMs' latency reads high while the scrub reads much, which slows
            # it down (the bound errs on the VMs' side). Taking away the scrub's time as it
            # measures it (its wall time around each read, more than the kernel counts in
            # its 10 ms jiffies) read a QD1 reader's p99 as 2-3 ms where fio saw 21-34 ms
            # (lab), and taking it from the counts since boot made the difference fall: the
            # meter started again at every reading and saw no other IO at all
            if last:
                c0, ios0, _ = last[-1]
                d_ios = (c.ios - c0.ios) - (served.ios - ios0)
                if d_ios > 0:
                    total[0] += d_ios
                    total[1] += max(0, c.ms - c0.ms)
            last[:] = [(c, served.ios, served.ms)]
            return pace.Counters(total[0], total[1], 0)

        self.sampler = pace.Sampler(vm, lambda: served.sectors, self.meter, clock=clock,
                                    sleep=sleep)
        self.due = clock()
        self.note = "unpaced" if self.pacer is None else self.pacer.note

    def wait(self, nbytes: int) -> None:
        if self.pacer is None:
            return
        self.sampler.read()
        now = self.clock()
        p99, ios = self.meter.p99(since=self.pacer.changed_at or -1e18)
        d = self.pacer.decide(now, p99, ios, self.sampler.drain_rate())
        self.note = d.note
        if d.pace is None:
            self.due = now
            return
        self.slowest = d.pace if self.slowest is None else min(self.slowest, d.pace)
        self.due = max(self.due, now - 1.0) + nbytes / (d.pace * 512)
        if self.due > now:
            self.sampler.sleep(self.due - now)

    def summary(self) -> dict[str, Any] | None:
        if self.pacer is None:
            return None
        s = self.pacer.summary(pace.kib_per_s(self.pacer.pace) if self.pacer.pace else
                               "unpaced")
        s["slowest_sectors_per_s"] = self.slowest
        return s


# ------------------------------------------------------------------------------- comparing


def compare(src: Source, *, counters: Callable[[], pace.Counters | None] | None = None,
            max_latency_ms: float | None = None, progress: Progress | None = None,
            every: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> Scrubbed:
    """Compare every unit of ``src`` (module docstring); ``counters``: the served device's
    (the VMs') counters for the pacer, with ``max_latency_ms``. A progress report (where a
    cancel stops it) at the start and every ``every`` seconds."""
    out = Scrubbed(src.served)
    total = src.total_bytes
    t0 = time.monotonic()
    with _readers(src, src.unit) as (served, origin):
        paced = Paced(max_latency_ms, counters or (lambda: None), served, sleep=sleep)
        last = 0.0

        def report() -> None:
            if progress is not None:
                progress(ScrubProgress(src.served, out.bytes, total, len(out.mismatches),
                                       time.monotonic() - t0, paced.note))

        report()
        try:
            for b, off, ln in units(src):
                want = origin.read(src.origin_offset + off, ln)
                got = served.read(off, ln)
                if len(got) != ln or len(want) != ln:
                    raise CacheMgrError(f"{src.served}: a read of {ln} bytes at {off} gave "
                                        f"{len(got)} (cache) and {len(want)} (origin {src.origin})")
                if got != want:
                    _settle(out, src, b, off, ln, got, want, served, origin, sleep)
                out.blocks += 1
                out.bytes += ln
                paced.wait(ln)
                now = time.monotonic()
                if now - last >= every:
                    last = now
                    report()
            report()
        except KeyboardInterrupt as exc:
            out.ended_by = getattr(exc, "name", None) or "SIGINT"
            raise
        finally:
            out.seconds = time.monotonic() - t0
            out.pacing = paced.summary()
    return out


def _settle(out: Scrubbed, src: Source, b: int, off: int, ln: int, got: bytes, want: bytes,
            served: _Reader, origin: _Reader, sleep: Callable[[float], None]) -> None:
    """A unit that differed: read again until both sides hold still (module docstring)."""
    for _ in range(RECHECKS):
        sleep(RECHECK_S)
        want2 = origin.read(src.origin_offset + off, ln)
        got2 = served.read(off, ln)
        if got2 == want2:
            out.rechecked += 1
            return
        if got2 == got and want2 == want:
            pages = tuple(off + p for p in pages_differing(got, want))
            if src.blocks is None:  # read in large pieces: told in 4 KiB pages
                out.mismatches += [Mismatch(p // PAGE, p, PAGE, (p,)) for p in pages]
            else:
                out.mismatches.append(Mismatch(b, off, ln, pages))
            return
        got, want = got2, want2
    out.unsettled.append(b)


# ------------------------------------------------------------------------------- records


def record(key: str, device: str, result: Scrubbed, *, how: str, invalidated: bool | None,
           invalidate_how: str = "") -> None:
    """Keep ``result`` as the last scrub of ``device`` (``invalidated``: None while the
    mismatches are being dropped, then True or False)."""
    state.write_json(state.journal_path(RECORD, key), {
        "key": key, "device": device, "at": time.time(), "how": how,
        "blocks": result.blocks, "bytes": result.bytes,
        "mismatches": len(result.mismatches),
        "mismatched": [m.to_json() for m in result.mismatches[:64]],
        "unsettled": len(result.unsettled), "seconds": round(result.seconds, 3),
        "invalidated": invalidated, "invalidate_how": invalidate_how})


@dataclass(frozen=True)
class Last:
    """A device's last scrub, as kept."""

    key: str
    device: str
    at: float | None
    blocks: int
    bytes: int
    mismatches: int
    invalidated: bool | None

    def words(self) -> str:
        when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at))
                if self.at is not None else "an unknown time")
        dropped = ("all dropped from the cache" if self.invalidated else
                   "NOT dropped from the cache yet" if self.invalidated is False else
                   "being dropped from the cache")
        return (f"the scrub of {when} found {self.mismatches} block"
                f"{'s' if self.mismatches != 1 else ''} served by the cache unlike its origin "
                f"in {human(self.bytes)} compared ({dropped})")


def _last(data: dict[str, Any] | None) -> Last | None:
    if not data or not isinstance(data.get("key"), str):
        return None

    def num(k: str) -> int:
        v = data.get(k)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else 0

    at = data.get("at")
    inv = data.get("invalidated")
    return Last(str(data["key"]), str(data.get("device") or data["key"]),
                float(at) if isinstance(at, (int, float)) else None, num("blocks"),
                num("bytes"), num("mismatches"), inv if isinstance(inv, bool) else None)


def lasts(view: state.View | None = None) -> list[Last]:
    """Every device's last scrub (never creating the state directory; an unreadable record
    is skipped). ``view``: a poller's state directory for this poll."""
    out: list[Last] = []
    try:
        if view is not None:
            for name in view.names(RECORD):
                with contextlib.suppress(CacheMgrError, OSError):
                    last = _last(view.read_json(RECORD, name))
                    if last is not None:
                        out.append(last)
            return out
        if not state.state_dir(create=False).is_dir():
            return []
        for name in sorted(state.journal_names(RECORD)):
            with contextlib.suppress(CacheMgrError, OSError):
                last = _last(state.read_json(state.state_dir(create=False) / RECORD / name))
                if last is not None:
                    out.append(last)
    except (CacheMgrError, OSError):
        return out
    return out


def found(view: state.View | None = None) -> tuple[tuple[str, str], ...]:
    """(device, words) of each device whose last scrub found mismatches: the snapshot's
    ``scrub_mismatches`` (the health model's WARNING)."""
    return tuple((s.device, s.words()) for s in lasts(view) if s.mismatches)
