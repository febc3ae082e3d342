"""A replace-ssd run's journal: its options, what it recorded before any change, the steps
done; read back field by field (a journal that cannot be acted on is refused with its path and
why), listed, and saved atomically under /var/lib/cachemgr/replace/<id>.json after every step.
The same journal serves every kind (:data:`KIND_NAMES`); what a kind records beyond the common
fields is in ``lvm`` or ``dm``."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cachemgr.backends.identity import normalize_wwn
from cachemgr.core import state
from cachemgr.core.errors import UsageError
from cachemgr.core.model import CacheMode
from cachemgr.procedures.replace import steps

# Step names journals of earlier versions used, and the name each has now.
RENAMED_STEPS = {"scsi-remove": "remove-old"}
# Fault injection for the crash tests: SIGKILL ourselves right after this step is journaled.
KILL_AFTER_ENV = "CACHEMGR_FAULT_KILL_AFTER"
# The kinds a journal may name (procedures/replace/run.py kind_of gives each one's Kind).
KIND_NAMES = ("bcache", "lvm", "dmcache")


@dataclass
class Options:
    new: str = "same"  # "same" (re-insert the old SSD), "any" (a new disk in its slot), a spec
    interim_mode: str = CacheMode.NONE.value
    wipe_old: bool = True
    yes: bool = False
    drain_timeout: float = 24 * 3600.0
    stall_timeout: float = 120.0
    wait_timeout: float = 600.0
    warm: str | None = None  # a trace: the last step warms the new cache from it


@dataclass
class Journal:
    id: str
    cset: str
    options: dict[str, Any]
    old: dict[str, Any]  # the old SSD: hotplug.record (bus, slot, wwid, serial...), bucket
    backings: list[dict[str, Any]]  # uuid, name, node, device, mode, tunables
    congested: dict[str, int] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)
    new: dict[str, Any] = field(default_factory=dict)  # name, wwid, serial, cset
    status: str = "running"  # running, done, failed, rolled-back
    error: str | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    # "bcache" (``cset`` is the cache set's UUID), "lvm" (``cset`` is the cached LV's VG/LV,
    # ``lvm`` what rebuilds its cache: procedures/replace/lvm.py) or "dmcache" (``cset`` is
    # the dm name, ``dm`` its table and areas: procedures/replace/dmcache.py)
    kind: str = "bcache"
    lvm: dict[str, Any] = field(default_factory=dict)
    dm: dict[str, Any] = field(default_factory=dict)
    # wall seconds each step took, over every attempt (a resumed or retried step adds its
    # new attempt); journals of earlier versions have none
    seconds: dict[str, float] = field(default_factory=dict)

    def lvs(self) -> list[str]:
        """An LVM run's cached LVs (VG/LV): its own first, then every other LV cached on the
        same SSD PV, replaced in the same run; [] for the other kinds."""
        if self.kind != "lvm":
            return []
        vg = str(self.lvm.get("vg"))
        others = self.lvm.get("caches") or []
        return [self.cset, *(f"{vg}/{x.get('lv')}" for x in others if isinstance(x, dict))]

    @property
    def steps(self) -> tuple[tuple[str, str], ...]:
        return steps.of(self.kind)

    @property
    def path(self):  # type: ignore[no-untyped-def]
        return state.journal_path("replace", self.id)

    def save(self) -> None:
        self.updated = time.time()
        state.write_json(self.path, asdict(self))

    @classmethod
    def load(cls, run_id: str) -> Journal:
        """The journal of run ``run_id``: UsageError (exit 2) if there is none, StateFileError
        (exit 2, its path and why) if it cannot be read."""
        j = cls.read(state.journal_path("replace", run_id))
        if j is None:
            raise UsageError(f"no replacement run {run_id!r}",
                             hint="cachemgr replace-ssd --list shows the journaled runs")
        return j

    @classmethod
    def read(cls, path: Path, view: state.View | None = None) -> Journal | None:
        """The journal in ``path`` (None if there is no file), checked field by field.
        ``view``: a poller's state directory for this poll (core/state.py ``polled``)."""
        data = state.read_json(path) if view is None else view.read_json("replace", path.name)
        if data is None:
            return None
        if isinstance(data.get("done"), list):
            data["done"] = [RENAMED_STEPS.get(s, s) if isinstance(s, str) else s
                            for s in data["done"]]
        problem = _journal_problem(data)
        if problem is None and (state.journal_path("replace", data["id"]) if view is None
                                else view.path("replace", state.journal_name(data["id"]))
                                ) != path:
            problem = f"it is the journal of run {data['id']!r}, not of its file name"
        if problem is not None:
            raise state.StateFileError(path, f"not a replace-ssd journal: {problem}")
        return cls(**data)

    def names_old_ssd(self, spec: str) -> bool:
        """``spec`` (stripped, not empty) names this run's old SSD: its node, its kernel
        name or its WWID; told from the journal alone, so it holds once the SSD is gone.
        Whether it names the run's cache is its kind's to say (run.py named_by)."""
        old = self.old
        wwid = str(old.get("wwid") or "")
        if spec in {old.get("node"), old.get("name"), f"/dev/{old.get('name')}"}:
            return True
        return bool(wwid) and normalize_wwn(spec.removeprefix("wwn:")) == wwid

    def same_cache(self, other: Journal) -> bool:
        """``other`` works on this run's cache or on its old SSD."""
        if (self.kind, self.cset) == (other.kind, other.cset):
            return True
        mine, theirs = self.old.get("wwid"), other.old.get("wwid")
        return bool(mine) and mine == theirs

    def took(self, step: str, seconds: float) -> None:
        """Add ``seconds`` of wall time to ``step`` (saved with the next save)."""
        self.seconds[step] = round(self.seconds.get(step, 0.0) + seconds, 3)

    def mark(self, step: str) -> None:
        if step not in self.done:
            self.done.append(step)
        self.save()
        if os.environ.get(KILL_AFTER_ENV) == step:
            os.kill(os.getpid(), signal.SIGKILL)


_JOURNAL_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,), "cset": (str,), "options": (dict,), "old": (dict,), "backings": (list,),
    "congested": (dict,), "done": (list,), "new": (dict,), "status": (str,),
    "error": (str, type(None)), "created": (int, float), "updated": (int, float),
    "kind": (str,), "lvm": (dict,), "dm": (dict,), "seconds": (dict,)}
_OPTION_NAMES = frozenset(Options.__dataclass_fields__)
STATUSES = ("running", "done", "failed", "rolled-back")


def _journal_problem(data: dict[str, Any]) -> str | None:
    """Why ``data`` is not a journal this cachemgr can act on (None if it is one)."""
    unknown = sorted(set(data) - set(_JOURNAL_TYPES))
    if unknown:
        return f"unknown fields {unknown} (written by a newer cachemgr?)"
    for name in ("id", "cset", "options", "old", "backings"):
        if name not in data:
            return f"no {name!r}"
    for name, value in data.items():
        if not isinstance(value, _JOURNAL_TYPES[name]) or isinstance(value, bool):
            return f"{name!r} is a {type(value).__name__}"
    if not data["id"] or not data["cset"]:
        return "an empty 'id' or 'cset'"
    if not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
               and v >= 0 for k, v in data.get("seconds", {}).items()):
        return "'seconds' is not a map of step names to seconds"
    if data.get("status", "running") not in STATUSES:
        return f"unknown status {data['status']!r}"
    if not set(data["options"]) <= _OPTION_NAMES:
        return f"unknown options {sorted(set(data['options']) - _OPTION_NAMES)}"
    if not isinstance(data["options"].get("new", "same"), str):
        return "option 'new' is not a string"
    if data.get("kind", "bcache") not in KIND_NAMES:
        return f"unknown kind {data['kind']!r}"
    names = [n for n, _ in steps.of(data.get("kind", "bcache"))]
    if any(s not in names for s in data.get("done", [])):
        return f"unknown steps in 'done': {data['done']}"
    for b in data["backings"]:
        if not (isinstance(b, dict) and isinstance(b.get("uuid"), str)
                and isinstance(b.get("tunables", {}), dict)
                and all(k in b for k in ("name", "node", "device", "mode"))):
            return f"a backing device entry {b!r} lacks uuid, name, node, device or mode"
    return None


def scan_runs(view: state.View | None = None
              ) -> tuple[list[Journal], list[state.StateFileError]]:
    """Every journaled run (oldest first) and every journal that cannot be read. ``view``:
    a poller's state directory for this poll (core/state.py ``polled``)."""
    if view is not None:
        paths = [view.path("replace", n) for n in view.names("replace")]
    else:
        d = state.state_dir(create=False) / "replace"
        if not d.is_dir():
            return [], []
        paths = sorted(d.glob("*.json"))
    found: list[Journal] = []
    bad: list[state.StateFileError] = []
    for p in paths:
        try:
            j = Journal.read(p, view)
        except state.StateFileError as exc:
            bad.append(exc)
            continue
        if j is not None:
            found.append(j)
    return sorted(found, key=lambda j: j.created), bad


def list_runs(view: state.View | None = None) -> list[Journal]:
    """The readable journaled runs, oldest first (:func:`scan_runs` also gives the others)."""
    return scan_runs(view)[0]


def new_run_id(tag: str) -> str:
    """A run id not taken yet: the time and ``tag`` (a second run in the same second: -2...)."""
    base = time.strftime("%Y%m%d-%H%M%S") + "-" + tag
    run_id, n = base, 1
    while state.journal_path("replace", run_id).exists():
        n += 1
        run_id = f"{base}-{n}"
    return run_id

