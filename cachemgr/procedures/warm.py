"""``cachemgr warm``: read the blocks a trace found hottest, hottest first, through a cache,
so that a new (or emptied) cache SSD holds them before the VMs ask (issue #35).

After ``replace-ssd`` every VM reads from the HDD until the cache has refilled, which on a
large cache takes days (flashcache#97, open-cas-linux#1693). ``cachemgr trace`` has recorded
which blocks the host reads; this reads them again, through the cache:

* what a kind needs so that such a read is admitted is the kind's (procedures/kinds: a
  bcache device sets ``sequential_cutoff`` 0 and its set's ``congested_read_threshold_us``
  0 for the run; dm-cache's smq promotes a block after hits in several of its one-second
  periods, so the blocks are read in passes a second apart until three in a row promote
  nothing: docs/kernel-notes.md, "Warming a cache");
* the end says how much of what it read is in the cache, from the cache's own counters
  (dm-cache: the hits of the last pass, :class:`Admitted`), and whether the passes ran out
  while the cache still admitted; a warm that admitted nothing fails (exit 1);
* every setting changed is recorded in the undo journal (core/undo.py) before it is written
  and put back at the end, on an error, Ctrl-C, SIGTERM and SIGHUP (bench's hygiene does it);
* the VMs' IO goes first: the reads run in the idle IO priority class (honoured by BFQ and
  mq-deadline), one request in flight, and none is sent while the slow device has a request
  of someone else's in flight (up to :data:`BUSY_WAIT_S`, after which one goes anyway so
  that a warm under a constant load still ends);
* at most the cache's capacity is read (``--bytes`` over it is refused).

The trace names the device it was recorded on (its kernel name, devno and size). It is
taken when its offsets map onto the cached device (:func:`trace_source`): the cached device
itself (what the VMs use); a dm-cache's or an LVM cache's origin, or the LV traced before it
was cached (the same offsets); a bcache device's backing device, traced before bcache or
under it, its offsets less bcache's data offset (said in the output; its blocks in the data
offset, bcache's superblock, are not the bcache device's and are left out). This is sizing's
order: trace the disk, size the SSD, make the cache, warm it. Any other trace is refused,
saying why it cannot map.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachemgr.core import cancel
from cachemgr.core.errors import UsageError
from cachemgr.core.model import human
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import trace as tr
from cachemgr.procedures.kinds import Kind

Progress = Callable[[object], None]  # given WarmProgress reports

BUSY_WAIT_S = 0.5  # longest wait for the slow device to be idle before one read goes anyway
POLL_S = 0.01  # how often the slow device's in-flight requests are looked at while waiting
MAX_REQUEST = 1 << 20  # adjacent hot blocks are read as one request up to this size
BATCH = 256  # hot blocks taken at a time (read in address order within a batch)
# passes read at least (when a kind reads in passes): smq promotes little in its first ones
MIN_PASSES = 3
# passes in a row that admitted nothing more, after which the passes end: smq pauses for
# up to two passes before it admits more (lab, under load: docs/kernel-notes.md, "Warming
# a cache"), and two ended a warm with a tenth of the set still to come
IDLE_PASSES = 3


# --------------------------------------------------------------------------------- the trace


@dataclass(frozen=True)
class Hot:
    """The blocks of one traced device, hottest first."""

    device: tr.Device
    block: int  # bytes
    blocks: list[int]  # block numbers, hottest first
    reads: int  # the read references they had
    rate: float  # the trace's sampling rate (below 1 it knows the hot blocks of its sample)
    shift: int = 0  # bytes the traced device's offsets are ahead of the cached device's


def traced_device(trace: tr.Trace, names: set[str], size: int | None) -> tr.Device:
    """The trace's device that is one of ``names`` (kernel names, nodes), with ``size`` bytes
    when known; a UsageError naming what the trace has otherwise."""
    for d in trace.header.devices:
        if {d.name, d.path, f"/dev/{d.name}"} & names and (
                not size or not d.size or d.size == size):
            return d
    has = ", ".join(f"{d.path} ({d.name}, {human(d.size)})" for d in trace.header.devices)
    want = ", ".join(sorted(n for n in names if n.startswith("/dev/")))
    raise UsageError(f"the trace is of another device: it has {has or 'no device'}, not "
                     f"{want or ', '.join(sorted(names))}"
                     + (f" of {human(size)}" if size else ""),
                     hint="record the cached device the VMs use: cachemgr trace "
                          f"{want.split(', ')[0] if want else 'DEVICE'} --rate 1 -o FILE")


def trace_source(sysfs: Sysfs, kind: Kind, trace: tr.Trace) -> tuple[tr.Device, int]:
    """The trace's device whose offsets map onto ``kind``'s cached device and the bytes they
    are ahead of its own (0: the same offsets; bcache's data offset for a trace of its
    backing device). A UsageError saying why when none maps: another device, another size
    (not the same blocks), or a shift that is not a whole number of the trace's blocks."""
    size = device_size(sysfs, kind.node)
    try:
        return traced_device(trace, kind.warm_trace_names(), size), 0
    except UsageError as own:
        below = kind.warm_trace_below(sysfs)
        if below is None:
            raise
        names, shift = below
        try:
            dev = traced_device(trace, names, size + shift if size else None)
        except UsageError:
            disk = sorted(n for n in names if n.startswith("/dev/"))[0]
            raise UsageError(own.message + f", nor of its backing device {disk}"
                             + (f" of {human(size + shift)}" if size else "")
                             + f" (whose offsets are {kind.node}'s plus bcache's data "
                             f"offset, {human(shift)}): it cannot map onto {kind.node}",
                             hint=own.hint) from None
    if shift % trace.header.block:
        raise UsageError(f"the trace of {dev.path} cannot map onto {kind.node}: bcache's "
                         f"data offset ({shift} bytes) is not a whole number of the "
                         f"trace's {human(trace.header.block)} blocks",
                         hint=f"record {kind.node} itself: cachemgr trace {kind.node} "
                              "--rate 1 -o FILE")
    return dev, shift


def hot_blocks(trace: tr.Trace, dev: tr.Device, *, shift: int = 0,
               size: int | None = None) -> Hot:
    """The blocks of ``dev`` the trace referenced, hottest first: by read references, then
    write references, then the first referenced first (a tie keeps the trace's order).
    ``shift``: bytes ``dev``'s offsets are ahead of the cached device's (a whole number of
    blocks): its blocks are numbered as the cached device's, those before it (bcache's
    superblock and data offset) and past ``size`` (its bytes, when known) left out."""
    bits = trace.header.block.bit_length() - 1
    reads: dict[int, int] = {}
    writes: dict[int, int] = {}
    for _t, off, ln, d, op in tr.requests(trace):
        if d != dev.index or op >= 2 or ln <= 0:
            continue
        into = writes if op else reads
        for b in range(off >> bits, ((off + ln - 1) >> bits) + 1):
            into[b] = into.get(b, 0) + 1
            if op == 0:
                writes.setdefault(b, 0)
            else:
                reads.setdefault(b, 0)
    if shift or size:
        first, end = shift // trace.header.block, None
        if size:
            end = first + size // trace.header.block
        reads = {b - first: n for b, n in reads.items()
                 if b >= first and (end is None or b < end)}
        writes = {b - first: n for b, n in writes.items()
                  if b >= first and (end is None or b < end)}
    order = {b: i for i, b in enumerate(reads)}
    blocks = sorted(reads, key=lambda b: (-reads[b], -writes[b], order[b]))
    return Hot(dev, trace.header.block, blocks, sum(reads.values()), trace.header.rate,
               shift)


# --------------------------------------------------------------------------------- pacing


def _ioprio_syscalls() -> tuple[int, int] | None:
    """(ioprio_set, ioprio_get) syscall numbers of this machine; None: not known here."""
    return {"x86_64": (251, 252), "aarch64": (30, 31), "i686": (289, 290),
            "armv7l": (314, 315), "ppc64le": (273, 274), "s390x": (282, 283),
            "riscv64": (30, 31)}.get(platform.machine())


IOPRIO_WHO_PROCESS = 1
IOPRIO_CLASS_IDLE = 3
IOPRIO_CLASS_SHIFT = 13


@contextlib.contextmanager
def idle_priority() -> Iterator[bool]:
    """The calling thread in the idle IO class for the block (ionice -c3), and back as it
    was; yields whether that was possible."""
    nums = _ioprio_syscalls()
    if nums is None:
        yield False
        return
    libc = ctypes.CDLL(None, use_errno=True)
    before = libc.syscall(nums[1], IOPRIO_WHO_PROCESS, 0)
    ok = before >= 0 and libc.syscall(nums[0], IOPRIO_WHO_PROCESS, 0,
                                      IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) == 0
    try:
        yield ok
    finally:
        if ok:
            libc.syscall(nums[0], IOPRIO_WHO_PROCESS, 0, before)


def in_flight(sysfs: Sysfs, rels: Sequence[str]) -> int:
    """Requests in flight on the devices ``rels`` (their ``inflight`` files; 0 unreadable)."""
    n = 0
    for rel in rels:
        text = sysfs.read_opt(f"{rel}/inflight")
        if text:
            with contextlib.suppress(ValueError):
                n += sum(int(x) for x in text.split())
    return n


@dataclass
class Pacer:
    """Before each read: wait while the slow devices have someone else's requests in flight
    (ours is done: one in flight), at most ``busy_wait`` seconds."""

    sysfs: Sysfs
    slow: list[str]  # sysfs dirs of the slow devices
    busy_wait: float = BUSY_WAIT_S
    waited_s: float = 0.0
    forced: int = 0  # reads sent while the device was still busy (after busy_wait)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def wait(self) -> None:
        if not self.slow or in_flight(self.sysfs, self.slow) == 0:
            return
        t0 = self.clock()
        while in_flight(self.sysfs, self.slow) > 0:
            if self.clock() - t0 >= self.busy_wait:
                self.forced += 1
                break
            self.sleep(POLL_S)
        self.waited_s += self.clock() - t0


# --------------------------------------------------------------------------------- reading


def requests_of(blocks: Sequence[int], block: int, *, cache_block: int = 0,
                limit: int = MAX_REQUEST, batch: int = BATCH) -> Iterator[tuple[int, int]]:
    """(offset, length) reads covering ``blocks`` (hottest first) in batches of ``batch``:
    within a batch in address order, adjacent blocks merged up to ``limit`` bytes. With
    ``cache_block`` (a dm-cache block, larger than the trace's) a read is aligned to the cache
    block holding it and a cache block is read once."""
    unit = max(block, cache_block)
    seen: set[int] = set()
    for i in range(0, len(blocks), batch):
        units = sorted({b * block // unit for b in blocks[i:i + batch]} - seen)
        seen.update(units)
        start = prev = None
        for u in units:
            if start is not None and prev is not None and u == prev + 1 and \
                    (u - start + 1) * unit <= limit:
                prev = u
                continue
            if start is not None and prev is not None:
                yield start * unit, (prev - start + 1) * unit
            start = prev = u
        if start is not None and prev is not None:
            yield start * unit, (prev - start + 1) * unit


@dataclass(frozen=True)
class Admitted:
    """How many of the cache blocks a warm read are in the cache at its end, from the cache's
    own counters: the hits of its last pass (the blocks it found there) and what was promoted
    after (less what was demoted: a full cache demotes a block for each it promotes, maybe
    one of these). A promotion that completed during the last pass may have been counted as
    one of its hits too, so ``blocks`` counts only those after it and ``at_most`` those
    during it as well. ``exact``: the two agree (nothing promoted during or after the last
    pass) and nothing but the warm read the device during it (its hits and misses add up to
    the warm's reads), nothing demoted; otherwise other IO moved the counters too and the
    figures are estimates."""

    blocks: int
    at_most: int
    of: int
    exact: bool

    @property
    def fraction(self) -> float:
        return self.blocks / self.of if self.of else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "at_most": self.at_most, "of": self.of,
                "fraction": round(self.fraction, 4), "exact": self.exact}


@dataclass
class PassRecord:
    """One pass over the hot blocks: its reads (in cache blocks) and what the cache's
    counters (Kind.warm_counters) did meanwhile."""

    no: int
    reads: int
    before: tuple[int, int, int, int] | None
    after: tuple[int, int, int, int] | None = None
    seconds: float = 0.0

    def end(self, after: tuple[int, int, int, int] | None, seconds: float) -> None:
        self.after, self.seconds = after, seconds

    def delta(self, i: int) -> int | None:
        if self.before is None or self.after is None:
            return None
        return self.after[i] - self.before[i]

    @property
    def exact(self) -> bool:
        """Nothing but this pass read the device while it ran."""
        h, m = self.delta(0), self.delta(1)
        return h is not None and m is not None and h + m == self.reads

    @property
    def all_hit(self) -> bool:
        """Every block the pass read was in the cache (counted exactly)."""
        return self.exact and self.reads > 0 and self.delta(0) == self.reads

    def admitted(self, now: tuple[int, int, int, int] | None) -> Admitted | None:
        """The pass's blocks in the cache ``now`` (counters read after the promotions
        settled)."""
        h = self.delta(0)
        if h is None or now is None or self.before is None or self.after is None:
            return None
        h = min(h, self.reads)
        demoted = now[3] - self.before[3]
        after, since = now[2] - self.after[2], now[2] - self.before[2]

        def clamp(n: int) -> int:
            return max(0, min(self.reads, n))

        low, high = clamp(h + after - demoted), clamp(h + since)
        return Admitted(low, high, self.reads, self.exact and demoted == 0 and low == high)

    def to_json(self) -> dict[str, Any]:
        return {"pass": self.no, "reads": self.reads, "seconds": round(self.seconds, 3),
                "hits": self.delta(0), "misses": self.delta(1), "promotions": self.delta(2),
                "demotions": self.delta(3)}


@dataclass
class Warmed:
    """What a warm did."""

    device: str
    bytes_read: int = 0
    requests: int = 0
    blocks: int = 0  # hot blocks covered
    passes: int = 0  # over the hot blocks
    seconds: float = 0.0
    waited_s: float = 0.0
    forced: int = 0
    idle_class: bool = False
    hits_before: tuple[int, int] | None = None
    hits_after: tuple[int, int] | None = None
    settings: list[str] = field(default_factory=list)
    ended_by: str = "done"
    # what ended the passes (a kind that reads in passes): "all admitted" (a pass found
    # every block in the cache), "no more admitted" (IDLE_PASSES in a row promoted nothing),
    # "pass limit" (the cache was still admitting: warming again admits more); "" one pass
    passes_ended_by: str = ""
    pass_log: list[PassRecord] = field(default_factory=list)
    admitted: Admitted | None = None  # how much of the hot set is in the cache at the end

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "bytes_read": self.bytes_read, "requests": self.requests,
                "blocks": self.blocks, "passes": self.passes, "seconds": round(self.seconds, 3),
                "waited_for_vms_s": round(self.waited_s, 3), "sent_while_busy": self.forced,
                "idle_io_class": self.idle_class, "settings": self.settings,
                "ended_by": self.ended_by, "passes_ended_by": self.passes_ended_by or None,
                "admitted": self.admitted.to_json() if self.admitted else None,
                "pass_log": [p.to_json() for p in self.pass_log]}


@dataclass(frozen=True)
class WarmProgress:
    """One progress report of a warm: every face shows it from these fields (``str``: the
    line; ``fraction`` and ``eta_s``: the current pass's, for a progress bar)."""

    device: str
    bytes_read: int  # in all passes so far
    pass_bytes: int  # read in this pass
    pass_total: int  # what a pass reads
    pass_no: int = 1
    passes: int = 1  # at most (a kind that reads in passes stops when one admits nothing)
    waited_s: float = 0.0
    elapsed_s: float = 0.0  # in this pass
    action: str = "warm"

    @property
    def fraction(self) -> float:
        return min(1.0, self.pass_bytes / self.pass_total) if self.pass_total else 1.0

    @property
    def eta_s(self) -> float | None:
        """The seconds left, known only for a single pass (more passes may follow)."""
        if self.passes != 1 or not self.pass_bytes or self.elapsed_s <= 0:
            return None
        return (self.pass_total - self.pass_bytes) * self.elapsed_s / self.pass_bytes

    def __str__(self) -> str:
        of = (f"{human(self.pass_bytes)} of {human(self.pass_total)} read "
              f"({100 * self.fraction:.0f}%)")
        if self.passes != 1:
            of = (f"pass {self.pass_no} (at most {self.passes}, until {IDLE_PASSES} in a row "
                  f"promote nothing): {of}, {human(self.bytes_read)} in all")
        return (f"warm {self.device}: {of}, waited {self.waited_s:.1f} s for the VMs' IO")


def read_hot(node: str, reqs: Sequence[tuple[int, int]], *, pacer: Pacer,
             progress: Progress | None, every: float = 2.0, out: Warmed,
             total: int, pass_no: int = 1, passes: int = 1) -> None:
    """Read every request once, O_DIRECT, one in flight, paced; a progress report (which
    is where a cancel stops it) at the start and every ``every`` seconds."""
    start, t0 = out.bytes_read, time.monotonic()

    def report() -> None:
        if progress is not None:
            progress(WarmProgress(node, out.bytes_read, out.bytes_read - start, total,
                                  pass_no, passes, pacer.waited_s, time.monotonic() - t0))

    report()
    fd = os.open(node, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    buf = mmap.mmap(-1, MAX_REQUEST)
    view = memoryview(buf)
    last = time.monotonic()
    try:
        for off, ln in reqs:
            pacer.wait()
            if os.preadv(fd, [view[:ln]], off) <= 0:
                break  # past the device's end
            out.requests += 1
            out.bytes_read += ln
            now = time.monotonic()
            if now - last >= every:
                last = now
                report()
        report()
    finally:
        view.release()
        buf.close()
        os.close(fd)


def plan_requests(hot: Hot, nbytes: int, cache_block: int) -> tuple[list[tuple[int, int]],
                                                                   int]:
    """The reads of the hottest blocks up to ``nbytes`` (in cache blocks: a dm-cache block
    is read whole), and how many hot blocks they cover."""
    unit = max(hot.block, cache_block)
    take: list[int] = []
    units: set[int] = set()
    for b in hot.blocks:
        u = b * hot.block // unit
        if u not in units:
            if (len(units) + 1) * unit > nbytes:
                break
            units.add(u)
        take.append(b)
    return list(requests_of(take, hot.block, cache_block=cache_block)), len(take)


def warm(sysfs: Sysfs, kind: Kind, hot: Hot, nbytes: int, *,
         progress: Progress | None = None, busy_wait: float = BUSY_WAIT_S) -> Warmed:
    """Read the hottest blocks of ``hot`` through ``kind``'s device, up to ``nbytes``, with
    its admission settings set (recorded in the current undo journal) and put back."""
    from cachemgr.procedures.bench.hygiene import Hygiene

    out = Warmed(kind.node)
    reqs, out.blocks = plan_requests(hot, nbytes, kind.warm_cache_block())
    unit = max(hot.block, kind.warm_cache_block())
    total = sum(ln for _, ln in reqs)
    hyg = Hygiene(sysfs)
    t0 = time.monotonic()
    out.hits_before = kind.reread(sysfs).hit_counters()
    try:
        for what, path, value in kind.warm_settings(sysfs):
            hyg.set(what, path, value)
        out.settings = list(hyg.notes)
        pacer = Pacer(sysfs, kind.warm_slow_devices(sysfs), busy_wait=busy_wait)
        with idle_priority() as out.idle_class:
            admitted = kind.warm_admitted(sysfs)
            idle = 0  # passes in a row that admitted nothing more
            for n in range(1, max(kind.warm_passes, 1) + 1):
                started = time.monotonic()
                c0, b0 = kind.warm_counters(sysfs), out.bytes_read
                read_hot(kind.node, reqs, pacer=pacer, progress=progress, out=out,
                         total=total, pass_no=n,
                         passes=kind.warm_passes if admitted is not None else 1)
                out.passes = n
                rec = PassRecord(n, (out.bytes_read - b0) // unit, c0)
                out.pass_log.append(rec)
                rec.end(kind.warm_counters(sysfs), time.monotonic() - started)
                if rec.all_hit:
                    out.passes_ended_by = "all admitted"
                    break  # every block of the pass was in the cache already: all are in
                if admitted is None:
                    break
                if n == kind.warm_passes:
                    out.passes_ended_by = "pass limit"
                    break
                rest = kind.warm_pass_s - (time.monotonic() - started)
                if rest > 0:
                    cancel.sleep(rest, "warm")  # the TUI's Cancel cuts it short
                now = kind.warm_admitted(sysfs)
                if now is None:
                    break
                idle = idle + 1 if now <= admitted else 0
                if n >= MIN_PASSES and idle >= IDLE_PASSES:
                    out.passes_ended_by = "no more admitted"
                    break  # passes that admitted nothing more: the rest would not either
                admitted = now
        out.waited_s, out.forced = pacer.waited_s, pacer.forced
        kind.warm_settle(sysfs)
        if out.pass_log:
            out.admitted = out.pass_log[-1].admitted(kind.warm_counters(sysfs))
    except KeyboardInterrupt as exc:
        out.ended_by = getattr(exc, "name", None) or "SIGINT"
        raise
    finally:
        hyg.restore()
        out.seconds = time.monotonic() - t0
    out.hits_after = kind.reread(sysfs).hit_counters()
    return out


def read_header(path: str | os.PathLike[str]) -> tr.Header | None:
    """A trace file's header alone (its first two lines: cheap on a large trace); None when
    the file is no cachemgr trace."""
    import gzip
    import json

    try:
        with gzip.open(path, "rb") as f:
            if f.readline(64) != tr.MAGIC_LINE:
                return None
            return tr.Header.from_json(json.loads(f.readline(1 << 20)))
    except (OSError, EOFError, ValueError, KeyError, TypeError):
        return None


def find_trace(sysfs: Sysfs, kind: Kind, directory: str) -> tuple[str | None, list[str]]:
    """The trace in ``directory`` (``*.trace``, as ``cachemgr trace -o`` writes them) that
    warms ``kind``'s device: of those whose offsets map onto it (:func:`trace_source`: a
    trace of the device, of its origin, of a bcache backing disk before bcache), the one
    recorded last. (its path or None, why each other file was passed over, in words)."""
    from pathlib import Path

    why: list[str] = []
    best: tuple[float, str] | None = None
    try:
        files = sorted(Path(directory).glob("*.trace"))
    except OSError as exc:
        return None, [f"{directory}: {exc.strerror or exc}"]
    if not files:
        why.append(f"no *.trace file in {directory}")
    for f in files:
        header = read_header(f)
        if header is None:
            why.append(f"{f.name}: not a cachemgr trace")
            continue
        try:
            trace_source(sysfs, kind, tr.Trace(header, None, [], [], [], [], []))
        except UsageError as exc:
            why.append(f"{f.name}: {exc.message}")
            continue
        if best is None or header.started > best[0]:
            best = (header.started, str(f))
    return (best[1] if best else None), why


# --------------------------------------------------------------------------------- a run


@dataclass(frozen=True)
class Prepared:
    """A warm checked and planned, nothing changed yet."""

    kind: Kind
    hot: Hot
    nbytes: int
    capacity: int
    notes: tuple[str, ...] = ()


def device_size(sysfs: Sysfs, node: str) -> int | None:
    """A block device's size in bytes from sysfs (None: not found)."""
    from cachemgr.backends.blockdev import block_dirs

    name = sysfs.block_name_of(node) if node.startswith("/dev/") else None
    rel = block_dirs(sysfs).get(name) if name else None
    n = sysfs.read_int(f"{rel}/size") if rel else None
    return n * 512 if n else None


def prepare(sysfs: Sysfs, kind: Kind, trace: tr.Trace | str, nbytes: int | None = None,
            *, share: int = 1) -> Prepared:
    """Check a warm of ``kind`` from ``trace`` (a path or a trace read) and plan it: the
    refusals (exit 2, nothing changed) of a cache that admits no read, a trace of another
    device or without reads, ``nbytes`` over the cache's capacity. Without ``nbytes`` it
    reads the capacity, divided by ``share`` (the devices one cache set warms at once)."""
    err = kind.refusal("warm") or kind.warm_refusal()
    if err is not None:
        raise err
    t = tr.read(trace) if isinstance(trace, str) else trace
    dev, shift = trace_source(sysfs, kind, t)
    hot = hot_blocks(t, dev, shift=shift,
                     size=device_size(sysfs, kind.node) if shift else None)
    if not hot.blocks:
        raise UsageError(f"the trace has no reads or writes of {dev.path}: nothing to warm")
    cap = kind.warm_capacity(sysfs)
    if not cap:
        raise UsageError(f"{kind.node}: the size of its cache is not known: nothing warmed",
                         hint="cachemgr status shows the cache; is it running?")
    if nbytes is not None and nbytes > cap:
        raise UsageError(f"--bytes {human(nbytes)} is more than {kind.node}'s cache holds "
                         f"({human(cap)}): a warm never reads past the cache's capacity",
                         hint=f"--bytes {human(cap)} or less (the default is the capacity)")
    if nbytes is not None and nbytes <= 0:
        raise UsageError(f"--bytes is more than 0, not {nbytes}")
    notes = []
    if hot.rate < 1:
        notes.append(f"the trace is sampled at rate {hot.rate:g}: it knows the hot blocks of "
                     "its sample only (record at --rate 1 to warm every hot block)")
    return Prepared(kind, hot, nbytes if nbytes is not None else cap // max(share, 1), cap,
                    tuple(notes))


def run(sysfs: Sysfs, p: Prepared, *, progress: Progress | None = None,
        busy_wait: float = BUSY_WAIT_S) -> Warmed:
    """Warm as planned, its settings recorded in an undo journal (core/undo.py) under the
    kind's locks, which the caller holds (the gate, or the replace-ssd run's)."""
    from cachemgr.core import signals, undo

    with signals.terminate_as_interrupt(), undo.recording(
            "warm", p.kind.node, [k for k, _ in p.kind.locks], sysfs):
        return warm(sysfs, p.kind, p.hot, p.nbytes, progress=progress, busy_wait=busy_wait)


def summary(p: Prepared, w: Warmed) -> list[str]:
    """What a warm did, in lines."""
    lines = [f"warm {w.device}: {human(w.bytes_read)} of its hottest blocks read "
             f"({w.blocks:,} of the {len(p.hot.blocks):,} the trace of {p.hot.device.path} "
             f"referenced; cache {human(p.capacity)}) in {w.seconds:.1f} s, {w.requests:,} "
             f"reads in {w.passes} pass{'es' if w.passes != 1 else ''}, one in flight"
             + (", idle IO class" if w.idle_class else ""),
             f"  waited {w.waited_s:.1f} s for other IO on the slow device"
             + (f" ({w.forced:,} reads sent while it stayed busy)" if w.forced else "")]
    a, b = w.hits_before, w.hits_after
    if a is not None and b is not None:
        hits, misses = b[0] - a[0], b[1] - a[1]
        lines.append(f"  the cache counted {hits:,} hits and {misses:,} misses meanwhile")
    if p.hot.shift:
        lines.append(f"  the trace is of {p.hot.device.path}, {w.device}'s backing device: "
                     f"its offsets read less bcache's data offset, {human(p.hot.shift)} "
                     f"({p.hot.shift // 512} sectors)")
    lines += admitted_lines(w, p.kind.warm_passes)
    lines += [f"  {s}" for s in w.settings]
    return lines


def admitted_lines(w: Warmed, limit: int) -> list[str]:
    """What of the hot set is in the cache at the end, and why the passes ended, plainly
    (nothing where the kind counts no admission)."""
    ad = w.admitted
    if ad is None:
        return []
    count = f"{ad.blocks:,}" if ad.blocks == ad.at_most else f"{ad.blocks:,} to {ad.at_most:,}"
    line = (f"  in the cache at the end: {count} of the {ad.of:,} cache blocks it read "
            f"({100 * ad.fraction:.0f}%), by the cache's read counters over the last pass")
    if not ad.exact:
        line += " (other IO or a copy still running moved them too: an estimate)"
    why = {"all admitted": "  the last pass found every block in the cache: all admitted",
           "no more admitted": f"  {IDLE_PASSES} passes in a row admitted no more: the "
                               "cache's policy keeps the rest out (smq: "
                               "docs/kernel-notes.md, 'Warming a cache')",
           "pass limit": f"  NOT all admitted: the cache was still admitting blocks when the "
                         f"passes ran out ({limit}); warm again to admit more"}
    out = [line]
    if ad.at_most == 0:
        out.append(f"  NONE admitted: the cache kept none of the blocks read ("
                   f"cachemgr status shows {w.device}'s mode and policy)")
    elif w.passes_ended_by in why:
        out.append(why[w.passes_ended_by])
    return out
