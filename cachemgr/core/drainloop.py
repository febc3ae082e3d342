"""One loop for "wait until clean": the bcache drain and the dm-cache flush poll through it.

The kind reads its device (``sample``: dirty bytes, state, certainly clean or not, and the raw
reading for its own checks and messages); the loop does the rest the same way for both:

* progress (:class:`cachemgr.core.model.DrainProgress`) after every reading: start, rate, ETA. The
  rate is an EWMA (0.7 old, 0.3 new) of the instantaneous rates for bcache, and the mean since
  the start for dm-cache, whose cleaner works in bursts (:class:`Meter`);
* clean = a clean reading, and still clean ``confirm`` seconds later;
* a stall = no new minimum of dirty bytes for ``stall_timeout`` seconds; a timeout after
  ``timeout`` seconds. The kind builds those errors (its words), and may add a ``check`` of
  its own after the clean test (bcache: IO errors on the backing device).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from cachemgr.core import checks, state
from cachemgr.core.model import CacheState, DrainProgress

T = TypeVar("T")
RateKind = Literal["ewma", "mean"]
SAY_PROGRESS_EVERY = 5.0  # seconds between two progress notes in the lock files


@dataclass(frozen=True)
class Sample(Generic[T]):
    """One reading of the device."""

    raw: T  # what the kind read: its check and its error messages use it
    dirty_bytes: int | None  # None: unknown
    state: CacheState
    clean: bool  # certainly clean in this reading
    dirty_blocks: int | None = None


@dataclass(frozen=True)
class LoopResult:
    start_bytes: int | None
    elapsed_s: float  # from t0 to the confirming reading
    zero_s: float | None  # when dirty bytes first read 0 (before the confirmation)


class Meter:
    """Progress reports from successive readings: start, rate, ETA, elapsed since ``t0``.
    The start is the first reading's dirty bytes unless :meth:`set_start` said otherwise
    (``set_start(None)``: unknown, and it stays so)."""

    def __init__(self, action: str, device: str, t0: float, *,
                 rate: RateKind = "ewma") -> None:
        self.action, self.device, self.t0, self.kind = action, device, t0, rate
        self.start: int | None = None
        self._started = False
        self.rate: float | None = None
        self._last: tuple[float, int] | None = None

    def set_start(self, dirty: int | None) -> None:
        self.start, self._started = dirty, True

    def update(self, now: float, dirty: int | None, state: CacheState,
               dirty_blocks: int | None = None) -> DrainProgress:
        if not self._started:
            self.start, self._started = dirty, True
        elapsed = now - self.t0
        if self.kind == "ewma":
            if dirty is not None:
                if self._last is not None and now > self._last[0]:
                    inst = max(0.0, (self._last[1] - dirty) / (now - self._last[0]))
                    self.rate = inst if self.rate is None else 0.7 * self.rate + 0.3 * inst
                self._last = (now, dirty)
        else:
            start = self.start
            self.rate = (start - dirty) / elapsed if elapsed > 0 and start is not None \
                and dirty is not None and start > dirty else None
        # no ETA for a device that reads 0 B but is not clean: a writer keeps dirtying it
        eta = dirty / self.rate if self.rate and dirty and dirty > 0 else None
        if dirty == 0 and state in (CacheState.CLEAN, CacheState.NO_CACHE):
            eta = 0.0
        return DrainProgress(self.action, self.device, dirty, self.start, self.rate, eta,
                             elapsed, state, dirty_blocks)


def wait_clean(
    sample: Callable[[], Sample[T]],
    *,
    action: str,
    device: str,
    timeout: float,
    stall_timeout: float,
    confirm: float,
    interval: float,
    progress: Callable[[DrainProgress], None] | None,
    stall_error: Callable[[T, bool], Exception],
    timeout_error: Callable[[T], Exception],
    check: Callable[[T], None] | None = None,
    explain: Callable[[T, float, bool], str | None] | None = None,
    rate: RateKind = "ewma",
    first: Sample[T] | None = None,
    t0: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    moving: Callable[[], bool] | None = None,
) -> LoopResult:
    """Poll ``sample`` every ``interval`` s until it reads clean twice ``confirm`` s apart.

    ``first``: a reading taken just before (its dirty bytes are the start, and the first
    minimum, as of ``t0``); without it the first reading in the loop is. ``t0`` (default: now)
    is where elapsed time, the rate's mean and the timeout count from; the stall clock starts
    at ``t0`` with ``first``, else at the loop's start. Raises ``stall_error(raw, progressed)``
    (``progressed``: a new minimum was seen after ``t0``) and ``timeout_error(raw)``; whatever
    ``sample`` or ``check`` raise goes through. ``explain(raw, elapsed, progressed)``: the
    kind's words for what the numbers alone do not say (a wait the kernel imposes, writes
    arriving), put in the progress report's ``note``. ``moving()``: the kind's sign that the
    drain is writing back although its dirty count stands still (a paced dm-cache drain:
    kcopyd ends its copies in batches), which holds the stall off while true.
    """
    # the last guard: a nan timeout never expires, a nan or 0 interval busy-loops
    checks.seconds(timeout, "timeout")
    checks.seconds(stall_timeout, "stall timeout")
    checks.seconds(interval, "poll interval")
    checks.seconds_or_zero(confirm, "confirm time")
    entered = clock()
    t0 = entered if t0 is None else t0
    meter = Meter(action, device, t0, rate=rate)
    best: int | None = None
    best_at = entered
    moved_at = entered  # when moving() last said so
    if first is not None:
        meter.set_start(first.dirty_bytes)
        best, best_at = first.dirty_bytes, t0
    clean_since: float | None = None
    zero_at: float | None = None
    said_at: float | None = None  # when the lock files last heard of progress
    while True:
        now = clock()
        s = sample()
        dirty = s.dirty_bytes
        if dirty is not None and (best is None or dirty < best):
            best, best_at = dirty, now
        if said_at is None or (best_at > said_at and now - said_at >= SAY_PROGRESS_EVERY):
            # what status and check read of a drain under way (a stalled one is a WARNING):
            # when it started or last lowered the dirty data, in the locks it holds (a new
            # minimum is noted at most SAY_PROGRESS_EVERY seconds late)
            said_at = now
            state.update_holder(progress_at=round(time.time() - (now - best_at), 1),
                                progress_dirty=best)
        p = meter.update(now, dirty, s.state, s.dirty_blocks)
        if explain is not None:
            note = explain(s.raw, now - t0, best_at > t0)
            if note:
                p = dataclasses.replace(p, note=note)
        if progress:
            progress(p)
        if s.clean:
            if clean_since is None:
                clean_since = now
            elif now - clean_since >= confirm:
                return LoopResult(meter.start, now - t0, zero_at)
        else:
            clean_since = None
        if zero_at is None and dirty == 0:
            zero_at = now - t0
        if check is not None:
            check(s.raw)
        if moving is not None and moving():
            moved_at = now
        if now - max(best_at, moved_at) > stall_timeout:
            raise stall_error(s.raw, best_at > t0)
        if now - t0 > timeout:
            raise timeout_error(s.raw)
        sleep(interval)
