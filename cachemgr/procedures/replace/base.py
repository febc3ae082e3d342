"""What every kind of replacement builds on: a run's context (:class:`Ctx`) and what a kind is
(:class:`Kind`: its steps, their functions, its point of no return, its rollback and its
words). The kinds' modules (bcache.py, lvm.py, dmcache.py) and shared.py import it; run.py,
the engine above them, finds a journal's kind (``kind_of``) and runs its steps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cachemgr.backends import snapshot
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.model import BcacheBacking, Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures.replace.journal import Journal, Options

Say = Callable[[str], None]
Prompt = Callable[[str], None]


# --------------------------------------------------------------------------------- context


@dataclass
class Ctx:
    sysfs: Sysfs
    j: Journal
    opts: Options
    say: Say
    prompt: Prompt

    def snap(self) -> Snapshot:
        return snapshot.take(self.sysfs)

    def backing(self, uuid: str, snap: Snapshot | None = None) -> BcacheBacking:
        snap = snap or self.snap()
        for b in snap.backings:
            if b.uuid == uuid:
                return b
        raise CacheMgrError(f"backing device {uuid} is no longer registered",
                            hint="register it again (echo DEV > /sys/fs/bcache/register), "
                                 f"then cachemgr replace-ssd --resume {self.j.id}")

    def dev(self, entry: dict[str, Any]) -> str:
        return str(entry.get("device") or entry["node"])


# --------------------------------------------------------------------------------- kinds


@dataclass(frozen=True)
class Kind:
    """One kind of cache the procedure replaces the SSD of: its steps, how each is done,
    the step after which only finishing is safe, how a rollback undoes the earlier ones,
    and every word a face (the CLI, the TUI) says about a run of it."""

    steps: tuple[tuple[str, str], ...]
    funcs: dict[str, Callable[[Ctx], None]]
    point_of_no_return: str
    rollback: Callable[[Ctx], None]
    head: Callable[[Journal], list[str]]  # the plan's first lines
    what: str  # the cache, in messages: "cache set", "cached LV"
    # the words: every face takes them from here, never spells a kind out itself
    name: str  # the kind as people name it: "bcache cache set", "LVM cache"
    tag: str  # a run's object in a list of runs: "cset", "lv", "dm"
    tag_chars: int | None  # how much of the object a narrow list shows (None: all of it)
    stays_up: str  # what keeps serving IO while the run goes on, as a sentence
    undoes: str  # what a rollback puts back, as a sentence
    done_line: Callable[[Journal], str]  # what a finished run made, in one line
    interim_mode: bool  # the run switches to the operator's interim mode first
    # what the CACHE replace-ssd was given names of this kind, if anything (None: not this
    # kind's): (CACHE, the host's /sys or None, a snapshot taken already or None) -> what
    # the kind's plan takes; the engine (run.py recognise) asks every kind in turn
    claims: Callable[[str, Sysfs | None, Snapshot | None], object | None]
    # the plan of a run on the cache it claimed: (sysfs, CACHE, options, what claims found)
    plan: Callable[[Sysfs, str, Options, object], Journal]
    # whether a CACHE as replace-ssd takes it (stripped, not empty) names a run's cache,
    # told from the journal alone: (the journal, CACHE) -> bool
    names_run: Callable[[Journal, str], bool]
    # the fields of ``replace-ssd --json`` (docs/json.md) this kind fills, the same keys
    # whatever the journal; a run of another kind has each of them null
    json: Callable[[Journal], dict[str, Any]]
    # the kind of every CACHE no other kind claims (bcache: an SSD's node, a cset UUID,
    # whose own checks say what is wrong with a name that is neither); one kind is
    fallback: bool = False
    # the lock keys of what a run owns beside its cache's (procedures/keys.py): (the cache,
    # the journal's backing devices, its other cached LVs on the same SSD) -> keys
    run_keys: Callable[[str, tuple[dict[str, Any], ...], tuple[str, ...]], set[str]] = (
        lambda cache, backings, lvs: set())
    # the devices VMs use that a run takes out of caching until it ends (a snapshot with
    # the dm devices): (the journal, the snapshot) -> nodes
    vm_nodes: Callable[[Journal, Snapshot], set[str]] = lambda j, snap: set()

    def short(self, cset: str) -> str:
        """A run's object, as far as a narrow list shows it (a cache set's UUID prefix)."""
        return cset[:self.tag_chars] if self.tag_chars else cset

    def label(self, cset: str, *, short: bool = False) -> str:
        """A run's object in a list of runs: "cset 5f3c0e52", "lv vg0/vm1", "dm vc"."""
        return f"{self.tag} {self.short(cset) if short else cset}"

    @property
    def step_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.steps)

    def rollback_words(self) -> str:
        """Until when a run of this kind can be rolled back, and what then."""
        n = self.step_names.index(self.point_of_no_return) + 1
        return (f"possible only before step {n} of {len(self.steps)}, "
                f"'{self.point_of_no_return}': after it only finishing the run is safe")
