"""Reference devices measured apart from the targets (``--reference cache-ssd``, ``--reference
/dev/sdX``): the SSD a cache sits on, read with the job's block size, queue depth and
distribution, read-only, so a result can say whether a cache that is no faster than the bare
disk sits on an SSD that is no faster either (a cache cannot beat its SSD).

Why apart and read-only: a cache's own SSD cannot be a target of a write job (writing to it
destroys the cache and its dirty data; :func:`~cachemgr.procedures.bench.targets.write_refusal`
refuses it), but reading it is harmless: fio runs with ``--readonly`` (its own guard: it
refuses to issue a write or a trim) over the whole device. A reference that is a target
(``--reference LABEL``, the older form) runs the job itself, interleaved with the others."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cachemgr.core.defaults import CACHE_SSD as CACHE_SSD
from cachemgr.core.errors import UsageError
from cachemgr.core.model import Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures.bench.job import JobSpec
from cachemgr.procedures.bench.targets import Target

# --reference's word for "each cache target's own SSD"
# the longest reference run (a short look at the SSD, once per repetition)
REFERENCE_RUNTIME = 5.0
# what a write job reads instead on a reference measured apart
_READ_OF = {"randwrite": "randread", "randrw": "randread", "write": "read", "rw": "read"}


def is_apart(ref: str) -> bool:
    """A reference measured apart: the word ``cache-ssd`` or a device path."""
    return ref == CACHE_SSD or ref.startswith("/")


def reference_spec(spec: JobSpec) -> JobSpec:
    """The job run on a reference measured apart: the job's block size, queue depth, jobs,
    distribution and engine; reads only (a write job reads instead), fio's ``--readonly``
    guard on; the whole device (the job's --size may be larger than the SSD); at most
    :data:`REFERENCE_RUNTIME` seconds, no ramp, no steady-state or rate limit."""
    ref = JobSpec(rw=_READ_OF.get(spec.rw, spec.rw), bs=spec.bs, iodepth=spec.iodepth,
                  numjobs=spec.numjobs, distribution=spec.distribution,
                  runtime=min(spec.runtime, REFERENCE_RUNTIME), ioengine=spec.ioengine,
                  readonly=True)
    assert not ref.writes
    return ref


@dataclass(frozen=True)
class ApartReference:
    """One device measured apart, and the targets whose results it is the reference of."""

    target: Target  # what fio opens (label: the device node)
    role: str  # "cache SSD" or "reference device"
    of: tuple[str, ...]  # target labels


def _cache_ssd_of(snap: Snapshot, t: Target) -> Target | None:
    """The (first) cache device under bcache target ``t`` as a target to read, if it has
    one (labelled by its node)."""
    if t.backing_name is None:
        return None
    b = next((x for x in snap.backings if x.identity.name == t.backing_name), None)
    cs = snap.cache_set(b.cset_uuid) if b is not None and b.cset_uuid else None
    if cs is None or not cs.caches or not cs.caches[0].identity.name:
        return None
    ident = cs.caches[0].identity
    node = ident.node or f"/dev/{ident.name}"
    return Target(label=node, spec=node, device=node, name=ident.name)


def _device_target(sysfs: Sysfs, node: str) -> Target:
    import os

    if not os.path.exists(node):
        raise UsageError(f"--reference {node}: no such device")
    name = sysfs.block_name_of(node)
    if name is None:
        raise UsageError(f"--reference {node} is not a block device")
    return Target(label=node, spec=node, device=node, name=name)


def plan(sysfs: Sysfs, snap: Snapshot, targets: Sequence[Target],
         refs: Sequence[tuple[str, str]]) -> list[ApartReference]:
    """The devices to measure apart for ``refs`` (``(cache label or "*", REF)``; the label
    references are left to the comparison). ``cache-ssd`` finds each cache target's SSD (a
    bcache target with a cache attached; several targets on one SSD share its runs); a path
    is that device. ``*`` means every target but the first (the baseline), as for labels.
    UsageError when a named target has no cache SSD, or when no target has one."""
    labels = [t.label for t in targets]
    out: dict[str, ApartReference] = {}

    def add(node: str, role: str, of: str, make: Target | None = None) -> None:
        have = out.get(node)
        if have is None:
            t = make if make is not None else _device_target(sysfs, node)
            out[node] = ApartReference(target=t, role=role, of=(of,))
        elif of not in have.of:
            out[node] = ApartReference(have.target, have.role, (*have.of, of))

    for cache, ref in refs:
        if ref in labels or not is_apart(ref):
            continue
        whom = [t for t in targets if t.label == cache] if cache != "*" else list(targets[1:])
        if ref == CACHE_SSD:
            found = 0
            for t in whom:
                ssd = _cache_ssd_of(snap, t)
                if ssd is None:
                    if cache != "*":
                        raise UsageError(
                            f"--reference {cache}={CACHE_SSD}: {t.device} has no cache SSD "
                            "(not a bcache device with a cache attached)",
                            hint="name the SSD instead: --reference LABEL=/dev/SSD")
                    continue
                add(ssd.device, "cache SSD", t.label, ssd)
                found += 1
            if not found:
                raise UsageError(f"--reference {CACHE_SSD}: no target after the first is a "
                                 "bcache device with a cache attached",
                                 hint="name the SSD instead: --reference /dev/SSD")
        else:
            for t in whom:
                add(ref, "reference device", t.label)
    for a in out.values():
        if a.target.device in {t.device for t in targets}:
            raise UsageError(f"--reference {a.target.device} is a target: name its label "
                             "instead (it then runs the job itself)")
    return list(out.values())
