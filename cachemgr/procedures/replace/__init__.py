"""replace-ssd: replacing the SSD under a cache while the devices it caches stay up, as a
journaled, resumable plan of named steps.

Each step is idempotent: it first checks whether its effect is already there (so a resumed
run does not repeat or undo work), then acts, then the run's journal records it (atomically)
before the next step starts. A run killed at any point is finished by ``--resume ID``; before
its kind's point of no return it can instead be rolled back (``--rollback ID``). A lock per
cache stops two runs on one cache.

The package, one module a part; no module borrows another's private helpers (a unit test,
tests/unit/test_replace_package.py, reads their imports):

* journal.py: the journal (:class:`Journal`, :class:`Options`): read back field by field,
  saved after every step, listed (:func:`scan_runs`, :func:`list_runs`), run ids.
* run.py: the engine: the kinds by name (:data:`run.KINDS`, :func:`kind_of`), which kind a
  CACHE is (:func:`recognise`, :func:`plan_cache`), the plan in words (:func:`describe`),
  :func:`execute` and :func:`rollback` (the cache's lock, the journal read again under it).
  A run's context (:class:`Ctx`) and what a kind is (:class:`Kind`) are in base.py.
* shared.py: what every kind shares: the old SSD and the new one (found, pulled, waited for,
  identified, a wrong disk refused), a drain's progress in words.
* bcache.py, lvm.py, dmcache.py: one module per kind: its plan, steps and rollback.

The names below are the package's face (``from cachemgr.procedures import replace`` then
``replace.Journal``, ``replace.execute``...); bcache's plan and steps are the defaults.
"""

from __future__ import annotations

from cachemgr.procedures.replace.bcache import KIND as BCACHE
from cachemgr.procedures.replace.bcache import POINT_OF_NO_RETURN, STEP_NAMES, STEPS, plan
from cachemgr.procedures.replace.journal import (
    KILL_AFTER_ENV,
    KIND_NAMES,
    RENAMED_STEPS,
    STATUSES,
    Journal,
    Options,
    list_runs,
    new_run_id,
    scan_runs,
)
from cachemgr.procedures.replace.run import (
    Ctx,
    Kind,
    Prompt,
    Say,
    describe,
    execute,
    json_fields,
    kind_of,
    kinds,
    named_by,
    new_words,
    plan_cache,
    recognise,
    rollback,
)
from cachemgr.procedures.replace.shared import (
    MIN_BUCKETS,
    NEW_HINT,
    drain_reporter,
    hotplug_disk,
    new_disk,
    new_match,
    refuse_new_disk,
    refuse_unpullable,
    ssd_words,
)

__all__ = [
    "BCACHE",
    "KILL_AFTER_ENV",
    "KIND_NAMES",
    "MIN_BUCKETS",
    "NEW_HINT",
    "POINT_OF_NO_RETURN",
    "RENAMED_STEPS",
    "STATUSES",
    "STEPS",
    "STEP_NAMES",
    "Ctx",
    "Journal",
    "Kind",
    "Options",
    "Prompt",
    "Say",
    "describe",
    "drain_reporter",
    "execute",
    "hotplug_disk",
    "json_fields",
    "kind_of",
    "kinds",
    "list_runs",
    "named_by",
    "new_disk",
    "new_match",
    "new_run_id",
    "new_words",
    "plan",
    "plan_cache",
    "recognise",
    "refuse_new_disk",
    "refuse_unpullable",
    "rollback",
    "scan_runs",
    "ssd_words",
]
