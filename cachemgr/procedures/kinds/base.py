"""What every cache kind declares and answers (one subclass per kind, one module each).

A :class:`Kind` instance wraps one object of the snapshot (a bcache backing device, a cache
set, a dm-cache device, an LVM cache...). Its class declares what the kind is: its ``name``
(the word in JSON and logs), its ``title`` (the words people see), its ``modes``, the
``actions`` it can take, and how an admin may name one of its objects (``names`` and
``kernel_names``). Its methods do the kind's operations through its backend. The command
layer, the TUI, the metrics and the udev worker ask the kind; none of them branches on a
kind class.

"Unknown" has one meaning everywhere: ``dirty_bytes`` is ``None`` when the kernel's figure
cannot be trusted (a bcache backing device whose cache set is missing reads 0 while its state
says dirty; a failed dm-cache has no status), never 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from cachemgr.core.change import Change
from cachemgr.core.errors import CacheMgrError, UsageError
from cachemgr.core.model import (
    AcceptDataLoss,
    CacheMode,
    Identity,
    Size,
    Snapshot,
    Stats,
    human,
    short,
)
from cachemgr.core.sysfs import Sysfs

ProgressFn = Callable[[Any], None]

# Every action a kind may declare (the commands and faces use these words; the gate's
# capability table, cachemgr/ops/gate.py NEEDS, maps each command to one of them). "create",
# "register" and "assemble" make an object of the kind where there is none yet: the gate
# asks the class (Kind.declines).
ACTIONS = frozenset({"mode", "drain", "detach", "attach", "remove", "tune", "replace",
                     "bench", "force-run", "stop-set", "warm", "invalidate", "scrub",
                     "create", "register", "assemble", "snapshot"})


def pacing_words(p: dict[str, Any]) -> str:
    """What a paced drain did, in words (its DrainResult.pacing)."""
    n = p.get("lowered") or 0
    slowest = p.get("slowest_sectors_per_s")
    words = p.get("slowest_words") or (
        f"{int(slowest) * 512 // 1024} KiB/s" if slowest else None)  # dm-cache: its own
    floor = p.get("over_at_floor") or 0
    return (f"paced under p99 {p.get('max_latency_ms'):g} ms of the other IO: slowed down "
            f"{n} time{'s' if n != 1 else ''}"
            + (f"; slowest pace {words}" if words else "")
            + (f"; over the bound {floor} time{'s' if floor != 1 else ''} at the slowest "
               "pace: not held" if floor else ""))


@dataclass(frozen=True)
class Drained:
    """What a drain did: the same fields for every kind."""

    device: str
    start_bytes: int | None
    elapsed_s: float
    restored: dict[str, Any]  # what was put back (tunables, or the table's mode and policy)
    restored_what: str = "tunables"  # how to say it
    pacing: dict[str, Any] | None = None  # a paced drain (--max-latency): what it did
    # dirty blocks the status read after the drain's last table change (a dm-cache put back
    # in writeback: the VMs' writes since); "clean" is said only when 0
    dirty_after: int = 0

    def summary(self) -> str:
        done = f"clean after {self.elapsed_s:.1f} s" if not self.dirty_after else \
            f"written back in {self.elapsed_s:.1f} s"
        return (f"{self.device}: {done} ({human(self.start_bytes)} written back); "
                f"{self.restored_words()}"
                + (f"; {self.dirty_after} blocks dirty again since (writeback: new writes)"
                   if self.dirty_after else "")
                + (f"; {pacing_words(self.pacing)}" if self.pacing else ""))

    def restored_words(self) -> str:
        if "cleaner" in self.restored:  # lvm writecache: its cleaner setting
            return f"writecache cleaner={self.restored['cleaner']} restored"
        if "policy" in self.restored:  # dm-cache: its table; lvmcache: its policy
            mode, policy = self.restored.get("mode"), self.restored.get("policy")
            return (f"mode {mode or 'as it was'} and policy {policy or 'as it was'} "
                    "restored")
        return "tunables restored"


@dataclass
class Switched:
    """What a mode switch did: the changes, notes for the operator, and the drain it ran
    (``as_drain``: the mode was already so and the command was only a drain)."""

    changes: list[Change]
    notes: list[str]
    drained: Drained | None = None
    as_drain: bool = False


# what Cancel does once a drain (a mode switch's too) or a removal runs
DRAIN_CANCEL_NOTE = ("Cancel stops the drain at its next poll; the tunables it changed are "
                     "restored and the dirty data stays safe in the cache.")
REMOVE_CANCEL_NOTE = ("Cancel stops at the next progress report; a flush puts the original "
                      "table back.")


def size_words(x: Size, unit: str = "") -> str:
    """A size the kernel printed lossily, in words: exact ("512 B"), or the range it stands
    for, said as one ("58.5 MiB to 58.6 MiB, as bcache rounds it"). ``unit``: after each
    figure ("/s" for a rate)."""
    if x.is_exact:
        return f"{human(x.low)}{unit}"
    return f"{human(x.low)}{unit} to {human(x.high)}{unit}, as bcache rounds it"


def dirty_words(n: int | None) -> str:
    """A device's dirty data in a sentence: "its 1.2 MiB of dirty data", "its dirty data
    (none now)", or "its dirty data (how much is not known)" when the kernel's figure
    cannot be trusted."""
    if n is None:
        return "its dirty data (how much is not known)"
    return "its dirty data (none now)" if n == 0 else f"its {human(n)} of dirty data"


@dataclass(frozen=True)
class Asked:
    """A confirmation a face shows before an action: its body, its buttons (id, label,
    weight: "primary", "warning" or "error") and what Cancel does once it runs."""

    body: str
    buttons: tuple[tuple[str, str, str], ...]
    cancel_note: str = ""


@dataclass(frozen=True)
class Section:
    """One part of a detail view, as data: a title and (name, value) lines, or a table
    (``columns`` and ``rows``; ``numbers``: the columns after the first are figures), or a
    remark (``note``). Values are the model's (Size, enums, bools, None: unknown); the face
    words them."""

    title: str
    pairs: tuple[tuple[str, object], ...] = ()
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[object, ...], ...] = ()
    numbers: bool = False
    note: str = ""


class Kind:
    """One object of one cache kind (see the module docstring)."""

    name: ClassVar[str]  # "bcache", "bcache-set", "dm-cache", "lvmcache", "lvm-writecache"...
    title: ClassVar[str]  # "bcache device", "LVM cache"...
    modes: ClassVar[tuple[CacheMode, ...]] = ()
    actions: ClassVar[frozenset[str]] = frozenset()
    # a cached device (a disk VMs use, with a mode) or a cache (a set of them)
    cached_device: ClassVar[bool] = True
    # its backend checks root itself, after its own refusals (dm-cache's passthrough while
    # dirty, an LV's health), so that those say what is wrong first
    root_in_backend: ClassVar[bool] = False
    # what the faces say a drain of this kind does (its confirmation text), and its word
    drain_how: ClassVar[str] = ""
    drain_word: ClassVar[str] = "drain"

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Kind) and type(other) is type(self) and other.obj == self.obj

    def __hash__(self) -> int:
        return hash((type(self), self.obj))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.node})"

    # ---------------------------------------------------------------- recognition

    @classmethod
    def objects(cls, snap: Snapshot) -> Iterable[Any]:
        """This kind's objects in ``snap``."""
        return [o for o in cls.candidates(snap) if cls.owns(o)]

    @classmethod
    def candidates(cls, snap: Snapshot) -> Iterable[Any]:
        """Where in ``snap`` its objects are (filtered by :meth:`owns`)."""
        return snap.others

    @classmethod
    def owns(cls, obj: object) -> bool:
        """Whether the snapshot object ``obj`` is one of this kind's."""
        return False

    @classmethod
    def scan(cls, sysfs: Sysfs) -> Iterable[Any]:
        """A kind the snapshot does not read (one registered beyond the built-in ones)
        reads its objects here; they go to ``Snapshot.others``."""
        return ()

    def names(self) -> set[str]:
        """What an admin may type for this object, exactly (nodes, names, UUIDs)."""
        return {self.node}

    def kernel_names(self) -> set[str]:
        """The kernel names (``sdb``, ``dm-3``) a path an admin typed may resolve to."""
        return set()

    # ---------------------------------------------------------------- what it is

    @property
    def node(self) -> str:
        """The device VMs use (/dev/bcache0, /dev/mapper/NAME), or the cache's name."""
        raise NotImplementedError

    @property
    def target(self) -> str:
        """How commands name it (what the faces pass as TARGET)."""
        return self.node

    @property
    def mode(self) -> CacheMode | None:
        return getattr(self.obj, "mode", None)

    @property
    def dirty_bytes(self) -> int | None:
        return getattr(self.obj, "dirty_bytes", None)

    @property
    def locks(self) -> tuple[tuple[str, str], ...]:
        """(lock key, words): its own and its cache's (procedures/owners.py)."""
        raise NotImplementedError

    @property
    def state_word(self) -> str:
        """Its state in the kernel's words (bcache's clean/dirty/no cache...)."""
        st = getattr(self.obj, "state", None)
        return "?" if st is None else str(getattr(st, "value", st))

    @property
    def cache(self) -> str | None:
        """The cache it is attached to, as status --json's ``cache`` names it."""
        return None

    def to_json(self) -> dict[str, Any]:
        """Its entry in ``status --json``'s devices (docs/json.md): the fields every kind
        has. The built-in kinds' entries are richer (backends/snapshot.py); a new kind
        overrides this to add its own."""
        return {"kind": self.name, "device": self.node,
                "mode": self.mode.value if self.mode else None, "state": self.state_word,
                "dirty_bytes": self.dirty_bytes, "cache": self.cache}

    def status_row(self) -> tuple[str, str, str, str, str]:
        """Its status line's columns: device, what it caches, mode, state, dirty data (as
        the table's other rows write sizes: 4.0K)."""
        return (self.node, "-", self.mode.value if self.mode else "?", self.state_word,
                short(self.dirty_bytes))

    def can(self, action: str) -> bool:
        """Whether the faces offer ``action`` on it now (declared, and its state allows)."""
        return action in self.actions

    def refusal(self, action: str) -> CacheMgrError | None:
        """Why ``action`` is refused on this kind (None: it can do it). The gate raises it,
        exit 2 (UsageError), before any lock is taken."""
        if action in self.actions:
            return None
        return UsageError(f"{self.node} is a {self.title}: cachemgr cannot {action} it; "
                           "nothing was changed",
                           hint=self.can_words())

    @classmethod
    def declines(cls, action: str, what: str) -> CacheMgrError | None:
        """Why ``action`` is refused for an object of this kind that is not there yet (a
        create, a register, an assembly of ``what``); None: the kind declares it. The gate
        raises it, exit 2 (UsageError), before any lock is taken."""
        if action in cls.actions:
            return None
        return UsageError(f"{what}: cachemgr cannot {action} a {cls.title}; nothing was "
                          "changed",
                          hint=cls.can_words())

    @classmethod
    def can_words(cls) -> str:
        """The hint of a refusal: what this kind can do."""
        return f"a {cls.title} can: " + (", ".join(sorted(cls.actions))
                                         or "nothing (it is only shown)")

    # ---------------------------------------------------------------- making its objects
    # (cachemgr register and create, the udev worker's and the boot pass's register, attach
    # and format: ops/autoattach.py asks the registry, kinds.registering, never a backend)

    # the role an unregistered disk of this kind has on its superblock (bcache-super-show's
    # sb.version: "backing", "cache"), by which register finds the kind that brings it back
    disk_role: ClassVar[str | None] = None

    @classmethod
    def register_disk(cls, sysfs: Sysfs, node: str) -> Change:
        """Register ``node``, a disk carrying this kind's superblock that the kernel does
        not know, so that its object appears (AlreadyError: registered already)."""
        raise cls._declined("register", node)

    @classmethod
    def register_refusal(cls, snap: Snapshot, named: str, disk: Any,
                         batch: Sequence[Any]) -> CacheMgrError | None:
        """Why registering ``disk`` (an entry of ``Snapshot.unregistered`` whose role is this
        kind's, ``named`` as the admin typed it) would be unsafe now, ``batch`` being every
        disk the same command registers (``disk`` too); None: nothing against it."""
        return None

    @classmethod
    def wait_registered(cls, sysfs: Sysfs, disk: Any) -> None:
        """Return once the object :meth:`register_disk` made of ``disk`` (an entry of
        ``Snapshot.unregistered``) shows where a snapshot reads it. Default: at once."""

    @classmethod
    def format_disk(cls, sysfs: Sysfs, node: str, *, bucket: str | None = None
                    ) -> list[Change]:
        """Make the blank disk ``node`` an object of this kind, ready to use (the policy's
        ``format_blank_ssd``): formatted and registered."""
        raise cls._declined("create", node)

    @classmethod
    def _declined(cls, action: str, what: str) -> CacheMgrError:
        err = cls.declines(action, what)
        return err if err is not None else CacheMgrError(
            f"{what}: {action} of a {cls.title} is not built")

    def attach_to(self, sysfs: Sysfs, cache: Kind) -> Change:
        """Attach this device to ``cache`` (an object of a kind that takes it)."""
        raise self._cannot("attach")

    # ---------------------------------------------------------------- what loses data
    # (cachemgr force-run and stop-set: the command has refused them unless the admin said
    # --i-accept-data-loss and asked its question; the kind does them only when handed
    # AcceptDataLoss)

    def force_run(self, sysfs: Sysfs, accept: AcceptDataLoss) -> Change:
        """Start it without its cache: what its cache held dirty is lost."""
        raise self._cannot("force-run")

    def stop_set(self, sysfs: Sysfs, accept: AcceptDataLoss) -> Change:
        """Stop this cache without writing its dirty data back: every device on it stops."""
        raise self._cannot("stop-set")

    # ---------------------------------------------------------------- operations

    def set_mode(self, sysfs: Sysfs, mode: CacheMode) -> Change:
        raise self._cannot("mode")

    def drain(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
              progress: ProgressFn | None, final_mode: CacheMode | None = None,
              max_latency_ms: float | None = None) -> Drained:
        raise self._cannot("drain")

    def switch_mode(self, sysfs: Sysfs, new: CacheMode, *, drain: bool, timeout: float,
                    stall_timeout: float, progress: ProgressFn | None,
                    max_latency_ms: float | None = None) -> Switched:
        """``cachemgr mode``: switch; with ``drain``, drain and end in ``new`` (the kinds
        whose kernel refuses some modes while dirty drain first, then switch)."""
        if not drain:
            return Switched([self.set_mode(sysfs, new)], [])
        d = self.drain(sysfs, timeout=timeout, stall_timeout=stall_timeout,
                       progress=progress, final_mode=new, max_latency_ms=max_latency_ms)
        before = self.mode.value if self.mode else "?"
        return Switched([Change(self.node, "cache_mode", before, new.value)]
                        if d.restored.get("switched") else [], [], d)

    def restore_interrupted(self, sysfs: Sysfs) -> dict[str, Any]:
        return {}

    def restored_note(self, restored: dict[str, Any]) -> str:
        """What ``drain --resume`` says it put back (``writeback_percent=10, ...``)."""
        return f"{self.node}: restored tunables " + ", ".join(
            f"{k}={v}" for k, v in restored.items())

    def reread(self, sysfs: Sysfs) -> Kind:
        return self

    def detach(self, sysfs: Sysfs, *, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        raise self._cannot("detach")

    def remove(self, sysfs: Sysfs, *, keep_device: bool, timeout: float, stall_timeout: float,
               progress: ProgressFn | None) -> list[Change]:
        raise self._cannot("remove")

    def forget(self) -> list[str]:
        """Once :meth:`remove` is done: drop what cachemgr keeps of the object to bring it
        back later (none by default); the notes that say so."""
        return []

    # what dropping its cached copies costs and how long it holds the device (cachemgr
    # invalidate's question; docs/admin-guide.md, "Live migration over shared storage")
    invalidate_how: ClassVar[str] = ""

    def invalidate(self, sysfs: Sysfs, *, final_mode: CacheMode | None = None,
                   cache: str | None = None) -> list[Change]:
        """Drop every copy its cache holds of this device (the other devices on the same
        cache keep theirs), ending in its mode and on its cache (``final_mode``, ``cache``:
        what an interrupted invalidation recorded, to finish it). Refused (exit 3) in
        writeback or while dirty; AlreadyError when it holds no copies."""
        raise self._cannot("invalidate")

    # how a scrub finds the blocks to compare and drops a mismatch, in words (cachemgr
    # scrub's result; docs/admin-guide.md, "Scrubbing a cache")
    scrub_drop_how: ClassVar[str] = ""

    def scrub_source(self, sysfs: Sysfs) -> Any:
        """What a scrub compares (procedures/scrub.py ``Source``): the node that serves the
        cache's copies, the origin read directly and where, the blocks the cache holds."""
        raise self._cannot("scrub")

    def scrub_drop(self, sysfs: Sysfs, source: Any, blocks: list[int], *,
                   final_mode: CacheMode | None = None) -> list[Change]:
        """Drop the cache's copies of the mismatched ``blocks`` of ``source`` (at least those:
        a kind that cannot drop one block drops every copy of the device), ending in its
        mode (``final_mode``: what an interrupted drop recorded)."""
        raise self._cannot("scrub")

    # ---------------------------------------------------------------- cachemgr snapshot

    def snapshot_cache(self, sysfs: Sysfs, *, max_latency_ms: float | None, timeout: float,
                       stall_timeout: float) -> Any:
        """The cache's part of a consistent snapshot of its origin (procedures/snapshot.py
        ``CacheSteps``: its drain paced under ``max_latency_ms``, its dirty bytes and mode
        read fresh, its mode switched, the drain unthrottled from inside it)."""
        raise self._cannot("snapshot")

    @property
    def origin_node(self) -> str | None:
        """The device under the cache that holds its data (what a snapshot of the origin
        copies); None: not known."""
        return None

    def origin_offset(self) -> int | None:
        """Where its byte 0 sits on :attr:`origin_node` (None: not known)."""
        return None

    def tunables(self) -> dict[str, tuple[int, int]]:
        """What can be tuned on it and the bounds."""
        return {}

    def tunable(self, name: str) -> str:
        """The current value of tunable ``name`` in words ("?" when unknown)."""
        return "?"

    def check_tunable(self, name: str, value: int) -> None:
        """A usage error for an unknown name or a value out of bounds; writes nothing."""
        raise self._cannot("tune")

    def set_tunable(self, sysfs: Sysfs, name: str, value: int) -> Change:
        raise self._cannot("tune")

    def dirty_consequence(self, mode: CacheMode) -> str:
        """What happens to the dirty data when switching to ``mode`` (a confirmation)."""
        return ""

    def _cannot(self, action: str) -> CacheMgrError:
        err = self.refusal(action)
        return err if err is not None else CacheMgrError(f"{self.node}: {action} not built")

    # ---------------------------------------------------------------- warming (cachemgr warm)
    # what a read needs to be admitted into the cache, and how big the cache is: the kind's
    # (procedures/warm.py reads the blocks; docs/kernel-notes.md, "Warming a cache")

    # at most how many passes over the hot blocks (dm-cache's smq promotes a block after
    # hits in several of its one-second periods): a pass that admits nothing more ends it
    warm_passes: ClassVar[int] = 1
    # the least time between the starts of two passes (smq: its hotspot period, 1 s)
    warm_pass_s: ClassVar[float] = 0.0

    def warm_refusal(self) -> CacheMgrError | None:
        """Why its cache cannot be warmed as it stands (a mode that admits no read)."""
        return None

    def warm_capacity(self, sysfs: Sysfs) -> int | None:
        """The bytes its cache holds (None: unknown)."""
        return None

    def warm_cache_block(self) -> int:
        """Its cache's block in bytes when a read admits a block that large (0: the trace's
        block is read as it is)."""
        return 0

    def warm_trace_names(self) -> set[str]:
        """The traced devices whose offsets are its own (a trace of one of these warms it)."""
        return {self.node, *self.kernel_names()}

    def warm_trace_below(self, sysfs: Sysfs) -> tuple[set[str], int] | None:
        """A device below it whose offsets are its own shifted: (that device's names, the
        bytes its offsets are ahead of this device's); None where there is none."""
        return None

    def warm_settings(self, sysfs: Sysfs) -> list[tuple[str, str, str]]:
        """(what, sysfs path, value): the settings that let a warm's reads in, set for the
        run and put back (recorded in the undo journal first)."""
        return []

    def warm_slow_devices(self, sysfs: Sysfs) -> list[str]:
        """The sysfs dirs of the slow devices behind it (a warm waits while they are busy)."""
        return []

    def warm_settle(self, sysfs: Sysfs) -> None:
        """After the reads: wait for what the kernel admits in the background."""

    def warm_admitted(self, sysfs: Sysfs) -> int | None:
        """A counter of what the cache has admitted so far (dm-cache: its promotions), read
        after each pass (None: not counted; one pass is all)."""
        return None

    def warm_counters(self, sysfs: Sysfs) -> tuple[int, int, int, int] | None:
        """The cache's (read hits, read misses, promotions, demotions) counters, the reads
        counted once per cache block read, so that a pass's hits are the blocks it found in
        the cache (None: the kernel counts none that way; no admitted fraction then)."""
        return None

    # ---------------------------------------------------------------- words the faces show
    # (the TUI asks these and never branches on a kind: what a row offers, the confirmations
    # of its actions in the words of the row, the detail view's sections as data)

    # bench: whether the bench compares the cache's modes on it (its hygiene switches them)
    bench_hygiene: ClassVar[bool] = False

    def offers(self, action: str) -> bool:
        """Whether a face offers ``action`` on it now: what it :meth:`can` do (a mode
        switch only where there is more than one mode), its detail always, a benchmark on
        every cached device whose kind declares it (the gate refuses it on the others)."""
        if action == "detail":
            return True
        if action == "bench":
            return self.cached_device and self.can("bench")
        if action == "mode" and len(self.modes) < 2:
            return False
        return self.can(action)

    @property
    def key(self) -> str:
        """A stable key for it across polls (a face's row key, the trends' history)."""
        return self.node

    @property
    def block_name(self) -> str | None:
        """The kernel block device whose IO counters measure its IOPS (None: none)."""
        return None

    @property
    def bench_target(self) -> str:
        """The device a benchmark of it runs on."""
        return self.node

    @property
    def cache_name(self) -> str | None:
        """The cache replace-ssd takes for it (a cache set UUID, a dm name, VG/LV); None:
        none (replace-ssd cannot replace its SSD)."""
        return None

    @property
    def vm_node(self) -> str | None:
        """The device VMs use (what libvirt's disks name), None when there is none."""
        return None

    @property
    def health_cache(self) -> str | None:
        """What the cache SSD health lookup lists this cache as (smart.Ssd.caches)."""
        return None

    def hit_counters(self) -> tuple[int, int] | None:
        """(hits, misses) since the start, where the kernel counts them (None: it does not,
        or its counters are no read hit ratio)."""
        stats = getattr(self.obj, "stats", None)
        s = stats.get("total") if isinstance(stats, dict) else None
        if s is None or s.hits is None or s.misses is None:
            return None
        return s.hits, s.misses

    def drain_words(self, target: str, dirty: str, disk: str) -> Asked:
        """The drain's confirmation, in the words of the row (target, dirty data, disk)."""
        return Asked(f"Drain {target}: write its {dirty} of dirty data back to {disk} as fast "
                     f"as that device allows, with progress and ETA.\n\n{self.drain_how}",
                     (("go", "Drain", "primary"),), DRAIN_CANCEL_NOTE)

    def mode_words(self, target: str, current: str, mode: CacheMode) -> Asked:
        """The mode switch's confirmation."""
        return Asked(f"Switch {target} from {current} to {mode.value}.\n\n"
                     f"{self.dirty_consequence(mode)}\n\n"
                     "Switch + drain also writes every dirty block back now (cachemgr mode "
                     "--drain), with progress.",
                     (("switch", f"Switch to {mode.value}", "primary"),
                      ("drain", "Switch + drain", "warning")), DRAIN_CANCEL_NOTE)

    def detach_words(self, target: str, dirty: str) -> Asked | None:
        """The detach's confirmation (None: it has no detach)."""
        return None

    def preflight(self, sysfs: Sysfs, action: str, *, mode: CacheMode | None = None,
                  drain: bool = False, keep_device: bool = False) -> None:
        """Raise now, changing nothing, the refusals its backend would raise when it starts
        ``action`` as the device stands (a face's question comes after them); the backend
        raises them again when it acts. Default: none known."""

    def would(self, action: str, *, keep_device: bool = False) -> list[str]:
        """What ``action`` (detach, remove) would do to it, before it is done: the plan a
        face shows with its question (the CLI's: docs/cli.md, "Confirmations"), each line in
        the conditional. ``keep_device``: remove --keep-device."""
        dirty = dirty_words(self.dirty_bytes)
        if action == "detach":
            return [f"would write {dirty} back, then detach the cache from {self.node}, "
                    "which runs on uncached"]
        return [f"would write {dirty} back, then remove the {self.title} {self.node}"]

    def remove_words(self, target: str, dirty: str, disk: str) -> Asked | None:
        """The removal's confirmation (None: it has no removal); a "keep" button keeps the
        device (``remove --keep-device``)."""
        return None

    def attach_choices(self, snap: Snapshot) -> tuple[str, list[tuple[str, str]], str]:
        """The attach's question, its choices (id, words) and what to say when there are
        none."""
        return (f"Attach {self.node}?", [], "nothing to attach")

    def attach_pair(self, choice: str) -> tuple[str, str]:
        """(the device to attach, the cache) for a choice of :meth:`attach_choices`."""
        raise self._cannot("attach")

    def detail(self, snap: Snapshot) -> list[Section]:
        """The detail view's sections, as data."""
        return [Section(f"{self.title} {self.node}",
                        (("mode", self.mode), ("dirty", human(self.dirty_bytes))))]


def identity_section(title: str, i: Identity) -> Section:
    """A block device's identities (node, names that survive a reboot, size...)."""
    return Section(title, (
        ("node", i.node), ("kernel name", i.name), ("devno", i.devno),
        ("size", human(i.size_bytes) if i.size_bytes is not None else None),
        ("by-id", "\n".join(i.by_id) or None), ("by-path", i.by_path),
        ("serial", i.serial), ("WWN", i.wwn),
        ("vendor/model", " ".join(x for x in (i.vendor, i.model) if x) or None),
        ("rotational", i.rotational), ("fs type", i.fs_type), ("fs UUID", i.fs_uuid),
    ))


def stats_section(stats: dict[str, Stats]) -> Section:
    """bcache's stats per interval, as a table."""
    rows = []
    for name in ("five_minute", "hour", "day", "total"):
        s = stats.get(name)
        if s is None:
            continue
        r = s.computed_hit_ratio
        rows.append((name, s.hits, s.misses, "-" if r is None else f"{100 * r:.1f}",
                     s.bypassed, s.bypass_hits, s.bypass_misses, s.miss_collisions))
    return Section("stats per interval", columns=(
        "interval", "hits", "misses", "hit%", "bypassed", "byp hits", "byp miss",
        "collisions"), rows=tuple(rows), numbers=True)
