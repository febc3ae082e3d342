"""The cache commands: status, mode, drain, attach, detach, create, remove, tune, force-run,
stop-set. One function per command; the CLI, the TUI and the Ansible modules (through the
CLI) only parse, call and render.

Each command takes the target as an admin types it and its options, and does every check
itself, in this order: the words (mode names, option combinations: usage errors, exit 2), the
target (resolved on a fresh snapshot: exit 2 when it names nothing), root (exit 2), the
per-object lock (exit 3 while another run acts on it), the safety refusals (exit 3), the
face's question where the change can lose data or disrupt a VM (``ctl.confirm``: see
"questions" below), then the change. "Already so" is
:class:`~cachemgr.core.errors.AlreadyError` (exit 4) or ``Result.already``. Progress goes to
``ctl.report`` (which also raises ``Cancelled`` when the operator cancels).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cachemgr.backends import bcache, dmcache, kernlog, signatures, smart
from cachemgr.backends import snapshot as snapshot_mod
from cachemgr.backends import vms as vms_mod
from cachemgr.backends.dmcache import build as dm_build
from cachemgr.backends.dmcache import discover as dm_discover
from cachemgr.backends.dmcache import record as dm_record
from cachemgr.backends.lvm import manage as lvm_manage
from cachemgr.backends.lvm.command import spelling as lvm_spelling
from cachemgr.backends.scancache import ScanCache as ScanCache
from cachemgr.backends.targets import resolve_backing, resolve_cache_set
from cachemgr.core import checks, pace, state
from cachemgr.core.errors import (
    AlreadyError,
    CacheMgrError,
    UnsafeError,
    UsageError,
    require_root,
)
from cachemgr.core.model import (
    AcceptDataLoss,
    CacheMode,
    LoggedErrors,
    Owner,
    Snapshot,
    UnassembledDmCache,
    UnregisteredBcache,
    Unseen,
    human,
)
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import gate as gate_mod
from cachemgr.ops import tuning
from cachemgr.ops.control import Control, Plan, Result
from cachemgr.procedures import coherence, health, kinds, owners, protect, traffic, unseen
from cachemgr.procedures.kinds.base import dirty_words
from cachemgr.procedures.kinds.base import size_words as size_words

DRAIN_TIMEOUT = 24 * 3600.0
DETACH_TIMEOUT = 3600.0
STALL_TIMEOUT = 60.0


def status(sysfs: Sysfs, *, probe_unregistered: bool = False, vms: bool = False,
           uri: str | None = None, stats: bool = True,
           cache: ScanCache | None = None) -> Snapshot:
    """Everything on the host, once: the one snapshot every face reads. ``vms``: with the
    libvirt domains of ``uri`` (default qemu:///system) above the caches. ``stats`` False:
    a poll's scan, without bcache's five_minute/hour/day stats; ``cache``: the poller's
    (snapshot.take; and the owners, protected SSDs and unassembled dm-cache records read
    through one walk of the state directory, what did not change since its last poll kept:
    core/state.py ``Kept``). Without one, every reader walks it as every command does."""
    snap = snapshot_mod.take(sysfs, probe_unregistered=probe_unregistered, vms=vms, uri=uri,
                             stats=stats, cache=cache)
    snap = _health_inputs(sysfs, snap, cache, probed=probe_unregistered)
    # run by another user than root (a monitoring agent's): what cachemgr's own directories
    # hold is left out, and said once (Snapshot.unseen); nothing is created or written
    hidden = unseen.own_files()
    # no state directory: nothing in it to keep, and a poller never makes it (the metrics'
    # scrape runs in a read-only sandbox)
    if cache is None or hidden or not state.exists():
        return _with_files(sysfs, snap, hidden)
    # a poller's: the state directory walked once, what did not change since its last poll
    # kept (core/state.py polled; the holders' liveness read from /proc/locks every time)
    with state.polled(cache.state) as view:
        found = tuple(owners.owners(view=view))
        others = kinds.scan_others(sysfs)
        unassembled = tuple(dm_record.unassembled(sysfs, (d.name for d in snap.dmcaches),
                                                  kept=cache.state))
        prot = protect_fields(view)
    return dataclasses.replace(snap, owners=found, others=others, unassembled=unassembled,
                               **prot)


def protect_fields(view: state.View | None = None) -> dict[str, Any]:
    """The snapshot's ``protected``, ``protect_off`` and ``protect_unknown``, from one read
    of the protect state (procedures/protect.py), and its ``scrub_mismatches``."""
    st = protect.load_state(view)
    return {"protected": tuple(protect.protected(st)), "protect_off": protect.is_off(st),
            "protect_unknown": tuple(protect.unknown(st)), **scrub_fields(view)}


def scrub_fields(view: state.View | None = None) -> dict[str, Any]:
    """The snapshot's ``scrub_mismatches``: the devices whose last scrub found blocks the
    cache served unlike its origin (procedures/scrub.py), read with the protect state."""
    from cachemgr.procedures import scrub

    return {"scrub_mismatches": scrub.found(view)}


def _with_files(sysfs: Sysfs, snap: Snapshot, hidden: list[Unseen]) -> Snapshot:
    """``snap`` with what cachemgr's own files add (owners, unassembled dm-cache devices,
    protected SSDs), read as every command reads them; what ``hidden`` lists (and whatever
    else is refused to this process on the way) left out and added to ``snap.unseen``."""
    found = list(hidden)
    blind_state = unseen.blind(found, unseen.STATE)
    own: tuple[Owner, ...] = () if blind_state else tuple(unseen.guarded(
        found, unseen.state_directory, owners.owners, []))
    none: dict[str, Any] = {}
    prot = none if blind_state else unseen.guarded(
        found, unseen.state_directory, protect_fields, none)
    names = [d.name for d in snap.dmcaches]
    left: tuple[UnassembledDmCache, ...] = () if unseen.blind(found, unseen.RECORDS) else \
        tuple(unseen.guarded(found, unseen.records,
                             lambda: dm_record.unassembled(sysfs, names), []))
    return dataclasses.replace(snap, owners=own, others=kinds.scan_others(sysfs),
                               unassembled=left, unseen=snap.unseen + tuple(found), **prot)


def _health_inputs(sysfs: Sysfs, snap: Snapshot, cache: ScanCache | None, *,
                   probed: bool) -> Snapshot:
    """What the health model reads beyond the kernel's objects: the failed requests the
    kernel logged for the disks under each device-mapper cache's cache device (a poller
    keeps its log reader: only new records are read), the dm-cache record files that cannot
    be used, the bcache backing devices ``check`` last saw dirty that are gone (only when
    ``probed``: a scan that read the unregistered devices' superblocks tells gone from
    unregistered)."""
    reader = cache.kernlog if cache is not None else None
    if reader is None:
        reader = kernlog.Reader(sysfs)
        if cache is not None:
            cache.kernlog = reader
    errors: list[tuple[str, LoggedErrors]] = []
    if snap.dm_devices:
        logged = reader.read()
        for d in snap.dm_devices:
            if d.cache is None or not logged:
                continue
            disks = kernlog.disks_under(sysfs, d.cache.name)
            errors += [(d.node, e) for e in kernlog.summarise(logged, disks, reader.now)]
    if cache is None:
        reader.close()
    # a poller's reads it through its kept state-directory walk, as unassembled() below does
    _, bad = dm_record.load_all(cache.state if cache is not None else None)
    if sysfs.live and os.geteuid() != 0:
        # a reader without root cannot open root's record directory (mode 0700): that says
        # nothing of the records (the non-root reader's notes say what it could not read)
        denied = os.strerror(errno.EACCES)
        bad = [line for line in bad if not line.endswith(denied)]
    bad_records = tuple((line.split(": ", 1)[0] if line.startswith("/") else
                         dm_record.records_dir(),
                         line.split(": ", 1)[1] if line.startswith("/") and ": " in line
                         else line) for line in bad)
    return dataclasses.replace(snap, cache_errors=tuple(errors), bad_records=bad_records,
                               gone=tuple(health.gone(snap, health.remembered()))
                               if probed else ())


def owner_of(snap: Snapshot, obj: object) -> Owner | None:
    """The procedure that owns ``obj`` (a snapshot object) now, running or interrupted."""
    k = kinds.of(obj)
    if k is None:
        return None
    return owners.owner_of(snap.owners, (key for key, _ in k.locks))


def others(snap: Snapshot) -> list[kinds.Kind]:
    """The objects of kinds registered beyond the built-in ones, as their kinds (the faces
    list them with the columns every kind has)."""
    return [k for k in (kinds.of(o) for o in snap.others) if k is not None]


def kind_of(obj: object) -> kinds.Kind | None:
    """A snapshot object as its cache kind: what it is, can do and is called (the faces
    ask it; None: no registered kind owns it)."""
    return kinds.of(obj)


# what kind_of answers, for a face's type hints (the faces import the command layer only)
Kind = kinds.Kind


# a poller's pieces (the TUI imports the command layer only)
carry_stats = snapshot_mod.carry_stats
WritebackMeter = traffic.Meter  # measured write-back bytes per second (WB/s)


def parse_mode(word: str, *, hint: str = "use writethrough, writeback, writearound or none"
               ) -> CacheMode:
    try:
        return CacheMode(word)
    except ValueError:
        raise UsageError(f"unknown cache mode {word!r}", hint=hint) from None


# an interrupted drain (or flush) is taken over by the next drain of its device: the drain
# puts back what the interrupted one left before it starts (procedures/drain.py)
DRAINS = gate_mod.resumes("drain", "dm-cache flush", "lvm drain")


def _ctl(ctl: Control | None, what: str) -> Control:
    return ctl if ctl is not None else Control(what=what)


def _root(dev: kinds.Kind, doing: str) -> None:
    """Root before the gate, except for the kinds whose backend checks it after its own
    refusals (which say what is wrong first)."""
    if not dev.root_in_backend:
        require_root(doing)


# ----------------------------------------------------------------------------- questions
# The commands that can lose data or disrupt a VM ask before they change anything (docs/
# cli.md, "Confirmations"): the face's question is ``ctl.confirm`` (the CLI's prompt; the TUI
# asks in its own dialog and passes none). It is put after every check the command can make
# without acting (the words, the target, root, what the kind can do, the locks and the
# journals: the same refusals, exit 3, as before), and before the first change; a refusal the
# command only meets while acting (a backend's: dirty data on a device it would stop) comes
# after it. After an answer the device is read again: the question may have waited.

# the modes in which a device no longer caches: its VMs run at the speed of the disk under it
UNCACHED = (CacheMode.NONE, CacheMode.PASSTHROUGH)


def _checked(subject: gate_mod.Subject, action: str, *,
             takes_over: Callable[[Owner], bool] | None = None) -> list[str]:
    """The gate's refusals before the question (``gate.precheck``: its rules, order and
    words, taking no lock); the lines saying what the gate puts back first, for the
    question."""
    return gate_mod.precheck(subject, action, takes_over=takes_over)


def _ask(ctl: Control, sysfs: Sysfs, snap: Snapshot | None, command: str,
         lines: Sequence[str], vm_nodes: Sequence[str | None] = ()) -> bool:
    """Put the question (``ctl.ask``) with the plan ``lines`` and the VMs that use
    ``vm_nodes``. No question without a face that asks, nor for a user who is not root: the
    command changes nothing then, and its own refusal says why. True when it was answered
    yes (read the device again)."""
    if not ctl.asks or os.geteuid() != 0:
        return False
    vms = vm_lines(sysfs, snap, vm_nodes) if snap is not None else []
    return ctl.ask(Plan(command, (*lines, *vms)))


def vm_lines(sysfs: Sysfs, snap: Snapshot, nodes: Sequence[str | None]) -> list[str]:
    """The libvirt domains whose disks are on ``nodes``, for a plan: "/dev/bcache0 is a disk
    of VM vm1 (vda, running)"; or that it is not known (libvirt not reachable)."""
    wanted = [n for n in nodes if n]
    if not wanted:
        return []
    scan = vms_mod.scan(sysfs, snap)
    out = []
    for node in wanted:
        served = vms_mod.serving(scan, node)
        if served:
            out.append(f"{node} is a disk of " + ", ".join(
                f"VM {v.name} ({d.target}, {v.state})" for v, d in served))
    if not scan.vms and scan.warnings:
        out.append(f"whether a VM uses {', '.join(wanted)} is not known ({scan.warnings[0]})")
    return out


def _kind(obj: object) -> kinds.Kind:
    """A snapshot object found by its own resolver (resolve_backing, resolve_cache_set), as
    its kind, whose verbs do the change."""
    k = kinds.of(obj)
    if k is None:
        raise CacheMgrError(f"{obj!r}: no cache kind owns it")
    return k


def _again(sysfs: Sysfs, target: str, *, caches: bool = False) -> tuple[Snapshot, kinds.Kind]:
    """The target read again after the question (it may have waited a while)."""
    snap = status(sysfs, probe_unregistered=False)
    return snap, kinds.resolve(snap, target, sysfs, caches=caches)


# ----------------------------------------------------------------------------- mode / drain


def _timeouts(timeout: float, stall_timeout: float | None = None) -> None:
    """A nan timeout never expires and a negative one expires at once: UsageError (exit 2),
    in the CLI's words, whichever face passed it."""
    checks.seconds(timeout, "--timeout")
    if stall_timeout is not None:
        checks.seconds(stall_timeout, "--stall-timeout")


def mode(sysfs: Sysfs, target: str, mode_word: str, *, drain: bool = False,
         ctl: Control | None = None, timeout: float = DRAIN_TIMEOUT,
         stall_timeout: float = STALL_TIMEOUT, max_latency_ms: float | None = None) -> Result:
    """Switch the cache mode. bcache allows any switch while dirty (writeback goes on; a
    note says so); dm-cache refuses passthrough while dirty unless ``drain``, which flushes
    and then loads passthrough. ``drain`` also waits until clean; ``max_latency_ms`` paces
    that drain (:func:`drain`)."""
    _timeouts(timeout, stall_timeout)
    _max_latency(max_latency_ms, drain=drain)
    ctl = _ctl(ctl, f"mode {mode_word} on {target}")
    new = parse_mode(mode_word)
    snap = status(sysfs, probe_unregistered=False)
    dev = kinds.resolve(snap, target, sysfs)
    _root(dev, "changing a cache mode")
    if ctl.asks and new in UNCACHED and new in dev.modes and dev.mode != new:
        first = _checked(gate_mod.of_kind(dev), "mode", takes_over=DRAINS if drain else None)
        dev.preflight(sysfs, "mode", mode=new, drain=drain)
        if _ask(ctl, sysfs, snap, f"mode {target} {new.value}" + (" --drain" if drain else ""),
                [*first, *mode_plan(dev, new, drain=drain)], [dev.vm_node]):
            snap, dev = _again(sysfs, target)
    with gate_mod.gate(gate_mod.of_kind(dev), "mode --drain" if drain else "mode",
                       takes_over=DRAINS if drain else None, detail={"to": new.value}):
        sw = dev.switch_mode(sysfs, new, drain=drain, timeout=timeout,
                             stall_timeout=stall_timeout, progress=ctl.report,
                             max_latency_ms=max_latency_ms)
        if sw.as_drain:
            return _drained(sysfs, dev, ctl, timeout, stall_timeout, resume=False,
                            max_latency_ms=max_latency_ms)
        return Result(changes=sw.changes, notes=sw.notes)


def mode_plan(dev: kinds.Kind, new: CacheMode, *, drain: bool = False) -> list[str]:
    """What ``mode`` to ``new`` would do to ``dev``, for the question before it."""
    cur = dev.mode.value if dev.mode else "an unknown mode"
    dirty = dev.dirty_bytes
    out = []
    if dev.mode != new:
        out.append(f"would switch {dev.node} from {cur} to {new.value}: it then caches "
                   "nothing, and every read and write goes to the disk under it")
    if drain:
        out.append(f"would write {dirty_words(dirty)} back now (a drain, with progress)")
    elif dirty != 0:
        out.append(f"{dev.node}: {dirty_words(dirty)} stays on the cache and keeps being "
                   "written back (mode --drain writes it back now)")
    return out


def _max_latency(max_latency_ms: float | None, *, drain: bool = True) -> None:
    """``--max-latency``: a bound in ms above 0 (at most a minute), for a drain only;
    UsageError (exit 2) otherwise, whichever face passed it."""
    if max_latency_ms is None:
        return
    if not drain:
        raise UsageError("--max-latency paces a drain: use it with --drain")
    pace.check_max_latency(max_latency_ms)


def _drained(sysfs: Sysfs, dev: kinds.Kind, ctl: Control, timeout: float,
             stall_timeout: float, *, resume: bool,
             max_latency_ms: float | None = None) -> Result:
    out = Result()
    if resume:
        restored = dev.restore_interrupted(sysfs)
        if not restored:
            raise AlreadyError(f"{dev.node}: no interrupted {dev.drain_word} to resume")
        out.notes.append(dev.restored_note(restored))
        dev = dev.reread(sysfs)
    try:
        d = dev.drain(sysfs, timeout=timeout, stall_timeout=stall_timeout,
                      progress=ctl.report, max_latency_ms=max_latency_ms)
    except AlreadyError:
        if not resume:
            raise
        out.notes.append(f"{dev.node}: already clean")
        return out
    out.lines.append(d.summary())
    out.data = {"schema": 1, "device": d.device, "clean": not d.dirty_after,
                "drained_bytes": d.start_bytes, "seconds": round(d.elapsed_s, 2),
                "restored": d.restored}
    if d.dirty_after:
        out.data["dirty_blocks_after"] = d.dirty_after
    if d.pacing is not None:
        out.data["pacing"] = d.pacing
    out.value = d
    return out


def drain(sysfs: Sysfs, target: str, *, ctl: Control | None = None, resume: bool = False,
          timeout: float = DRAIN_TIMEOUT, stall_timeout: float = STALL_TIMEOUT,
          max_latency_ms: float | None = None) -> Result:
    """Write every dirty block back as fast as the backing device allows, with progress;
    every tunable (or table) changed for it is put back. ``resume`` first puts back what an
    interrupted drain left. ``max_latency_ms``: as fast as the p99 latency of the other IO on
    the device (the VMs') under that bound allows (cachemgr/core/pace.py; bcache, dm-cache and
    lvmcache)."""
    _timeouts(timeout, stall_timeout)
    _max_latency(max_latency_ms)
    ctl = _ctl(ctl, f"drain of {target}")
    snap = status(sysfs, probe_unregistered=False)
    lv = lvm_spelling(target)
    if resume and lv and kinds.find(snap, target, sysfs, kinds.devices_only()) is None \
            and lvm_manage.journal_for(lv).exists():
        # killed after lvm2 split or uncached it: no cache left on the LV to restore
        with gate_mod.gate(gate_mod.of_names(lv, [owners.lvm_key(lv), owners.cache_key(lv)]),
                           "drain --resume", takes_over=DRAINS):
            done = lvm_manage.restore_split(lv)
        return Result(notes=[f"{lv}: an interrupted detach/remove had split the cache off; "
                             + (f"policy {done['policy']} put back on {done['on']}" if done
                                else "nothing left to put back")])
    dev = kinds.resolve(snap, target, sysfs)
    _root(dev, "draining")
    with gate_mod.gate(gate_mod.of_kind(dev), "drain", takes_over=DRAINS):
        return _drained(sysfs, dev, ctl, timeout, stall_timeout, resume=resume,
                        max_latency_ms=max_latency_ms)


# ----------------------------------------------------------------------------- attach/detach


def attach(sysfs: Sysfs, backing: str, cache: str, *, writecache: bool = False,
           mode: str | None = None) -> Result:
    """Attach a bcache backing device to a cache set (its UUID or its SSD); or an LVM cache
    pool or cachevol to an LV, through lvm2 (``writecache``: as lvm writecache)."""
    origin_lv, cache_lv = lvm_spelling(backing), lvm_spelling(cache)
    if origin_lv is not None and cache_lv is not None:
        m = parse_mode(mode, hint="writeback, writethrough or passthrough") if mode else None
        subject = gate_mod.of_names(origin_lv, [owners.lvm_key(origin_lv),
                                                owners.cache_key(origin_lv)])
        with gate_mod.gate(subject, "attach", detail={"cache": cache_lv}):
            return Result(changes=[lvm_manage.attach(origin_lv, cache_lv,
                                                     writecache=writecache, mode=m)])
    if writecache or mode:
        raise UsageError("--writecache and --mode apply to LVM caches (VG/LV VG/POOL) only",
                         hint="a bcache device takes its mode with 'cachemgr mode'")
    snap = status(sysfs, probe_unregistered=False)
    b = resolve_backing(snap, backing, sysfs)
    require_root("attaching")
    # the device first: while a procedure owns it, that is the refusal (exit 3), whatever
    # became of the cache named (a replacement may have unregistered it)
    with gate_mod.gate(gate_mod.of_backing(b), "attach", detail={"cache": cache}):
        c = resolve_cache_set(snap, cache, sysfs)
        with gate_mod.gate(gate_mod.of_cache_set(c), "attach"):
            return Result(changes=[_kind(b).attach_to(sysfs, _kind(c))])


def detach(sysfs: Sysfs, backing: str, *, ctl: Control | None = None,
           timeout: float = DETACH_TIMEOUT) -> Result:
    """Detach (bcache flushes first; waits with progress). Cancelling stops the wait only:
    the kernel finishes the detach by itself."""
    _timeouts(timeout)
    ctl = _ctl(ctl, f"detach of {backing}")
    snap = status(sysfs, probe_unregistered=False)
    dev = kinds.resolve(snap, backing, sysfs)
    _root(dev, "detaching")
    if ctl.asks and dev.can("detach"):
        first = _checked(gate_mod.of_kind(dev), "detach")
        if _ask(ctl, sysfs, snap, f"detach {backing}", [*first, *dev.would("detach")],
                [dev.vm_node]):
            snap, dev = _again(sysfs, backing)
    with gate_mod.gate(gate_mod.of_kind(dev), "detach"):
        return Result(changes=dev.detach(sysfs, timeout=timeout, stall_timeout=STALL_TIMEOUT,
                                         progress=ctl.report))


# ----------------------------------------------------------------------------- register


def register(sysfs: Sysfs, devices: Sequence[str]) -> Result:
    """Bring back bcache devices the kernel stopped or a boot left unregistered: cache
    devices first (whatever the order given), then backing devices, each through the gate.
    Refused (exit 3, nothing registered): a backing device whose dirty data sits on a cache
    set that is neither registered nor being registered with it (its SSD absent, or present
    and not named: the hint names it). "Already so" (exit 4) when every one is registered."""
    if not devices:
        raise UsageError("register needs at least one DEV", hint="cachemgr status lists the "
                         "unregistered bcache devices; their SSDs come first")
    snap = status(sysfs, probe_unregistered=True)
    require_root("registering")
    plans: list[tuple[str, UnregisteredBcache]] = []
    already: list[str] = []
    for dev in devices:
        if kinds.find(snap, dev, sysfs) is not None:
            already.append(f"cachemgr: {dev} is already registered with bcache")
            continue
        u = _unregistered(snap, dev, sysfs)
        if u is None:
            raise UsageError(f"{dev} carries no bcache superblock bcache has not registered",
                             hint="cachemgr status lists the unregistered bcache devices "
                                  "(bcache-super-show DEV shows a superblock)")
        plans.append((dev, u))
    # each disk as the kind that registers a disk of its superblock role (the gate checks
    # that kind declares register), which says what stands against it
    batch = [u for _, u in plans]
    made: list[tuple[UnregisteredBcache, type[kinds.Kind]]] = []
    for dev, u in plans:
        k = kinds.registering(u.kind)
        if k is None:
            raise CacheMgrError(f"{u.identity.node}: no cache kind registers a {u.kind} disk")
        refused = k.register_refusal(snap, dev, u, batch)
        if refused is not None:
            raise refused
        made.append((u, k))
    out = Result(notes=already, already=not plans and bool(already))
    for u, k in sorted(made, key=lambda m: m[1].cached_device):  # the caches first
        subject = gate_mod.of_disks([u.identity.node], k)
        if u.cset_uuid:
            subject = subject + gate_mod.of_names(
                f"cache set {u.cset_uuid}", [owners.cache_key(u.cset_uuid)])
        with gate_mod.gate(subject, "register"):
            try:
                out.changes.append(k.register_disk(sysfs, u.identity.node))
            except AlreadyError as exc:  # 69-bcache.rules (udev) was first
                out.notes.append(f"cachemgr: {exc}")
        k.wait_registered(sysfs, u)
    return out


def _unregistered(snap: Snapshot, dev: str, sysfs: Sysfs) -> UnregisteredBcache | None:
    name = sysfs.block_name_of(dev) if dev.startswith("/dev/") else None
    for u in snap.unregistered:
        if dev == u.identity.node or (name is not None and name == u.identity.name):
            return u
    return None


# ----------------------------------------------------------------------------- create/remove


def _signatures(nodes: Sequence[str]) -> dict[str, str]:
    """The on-disk signatures (wipefs) of the devices of ``nodes`` that exist: what a
    ``--force`` would wipe."""
    out = {}
    for n in nodes:
        if n and os.path.exists(n):
            sig = ", ".join(signatures.found(n))
            if sig:
                out[n] = sig
    return out


def create_bcache(sysfs: Sysfs, *, backings: Sequence[str], cache: str | None,
                  mode: str | None = None, bucket: str | None = None,
                  force: bool = False, ctl: Control | None = None) -> Result:
    """make-bcache, register, attach (and the mode). With ``force`` over a device that
    carries a signature, ``ctl``'s question first (a format over a signature loses what
    is on it; without ``force`` it is refused)."""
    m = parse_mode(mode, hint="writethrough, writeback, writearound or none") if mode else None
    disks = [*backings, *([cache] if cache else [])]
    # what it makes: backing devices, a cache set (the gate checks each kind declares create)
    made = [*([kinds.Bcache] if backings else []), *([kinds.BcacheSet] if cache else [])]
    ctl = _ctl(ctl, "create bcache")
    if force and ctl.asks:
        sigs = _signatures(disks)
        if sigs:
            roles = [*((d, "backing") for d in backings), *([(cache, "cache")] if cache else [])]
            first = _checked(gate_mod.of_disks(disks, *made), "create bcache")
            _ask(ctl, sysfs, None, "create bcache --force", [*first, *(
                f"would format {d} as a bcache {role} device"
                + (f", wiping its {sigs[d]} signature: whatever is on it is lost"
                   if d in sigs else "") for d, role in roles)])
    with gate_mod.gate(gate_mod.of_disks(disks, *made), "create bcache"):
        return Result(changes=bcache.create(sysfs, backings=list(backings),
                                            cache=cache or None, mode=m,
                                            bucket=bucket or None, force=force))


def create_dmcache(sysfs: Sysfs, *, name: str, origin: str, cache: str, metadata: str,
                   mode: str | None = None, block_size: str | None = None,
                   force: bool = False, ctl: Control | None = None) -> Result:
    """A dm-cache device over ``origin`` (its data kept). With ``force`` over a cache or
    metadata device that carries a signature or dm-cache metadata, ``ctl``'s question
    first."""
    if not (name and origin and cache and metadata):
        raise UsageError("create dm-cache needs NAME, --origin DEV, --cache DEV and "
                         "--metadata DEV")
    m = parse_mode(mode or "writeback", hint="writeback, writethrough or passthrough")
    block = dmcache.parse_size(block_size) if block_size else None
    subject = gate_mod.of_names(f"/dev/mapper/{name}", [owners.dmcache_key(name),
                                                        owners.cache_key(name)], kinds.DmCache)
    ctl = _ctl(ctl, f"create dm-cache {name}")
    if force and ctl.asks:
        sigs = _signatures([cache, metadata])
        lines = [f"would overwrite {n} (the {role} device), wiping its {sigs[n]} signature: "
                 "whatever is on it is lost" for n, role in ((cache, "cache"),
                                                             (metadata, "metadata"))
                 if n in sigs]
        if os.path.exists(metadata) and dm_build.has_cache_metadata(metadata):
            lines.append(f"would zero the dm-cache metadata on {metadata}: if it belongs to "
                         "another cache, that cache's dirty blocks are lost")
        if lines:
            first = _checked(subject + gate_mod.of_disks([origin, cache, metadata]),
                             "create dm-cache")
            _ask(ctl, sysfs, None, f"create dm-cache {name} --force", [*first, *lines])
    with gate_mod.gate(subject + gate_mod.of_disks([origin, cache, metadata]),
                       "create dm-cache"):
        out = Result(changes=dmcache.create(sysfs, name, origin=origin, cache=cache,
                                            metadata=metadata, mode=m, block_bytes=block,
                                            force=force))
        out.notes += _record_dmcache(sysfs, name, {"origin": origin, "cache": cache,
                                                   "metadata": metadata})
        return out


def _record_dmcache(sysfs: Sysfs, name: str, nodes: dict[str, str]) -> list[str]:
    """Record the device just created, so that the boot pass assembles it again after a
    reboot (backends/dmcache/record.py); the notes to print. A record that cannot be
    written is a note, not a failure: the device exists and works now."""
    try:
        d = dm_discover.find(sysfs, name)
        rec = dm_record.make(sysfs, name, nodes, d.table, time.time())
        path = dm_record.save(rec)
    except CacheMgrError as exc:
        return [f"cachemgr: {name} is NOT recorded, so nothing assembles it after a reboot "
                f"(in writeback its origin is then stale): {exc}"]
    place = [role for role in dm_record.ROLES if rec.device(role).place_only]
    none = [role for role in dm_record.ROLES if rec.device(role).strongest() is None]
    notes = [f"cachemgr: recorded in {path} (cachemgr autoattach assembles it at boot)"
             if not place and not none else f"cachemgr: recorded in {path}"]
    for role in none:
        notes.append(f"cachemgr: {nodes[role]} ({role}) has no stable identity (WWN, "
                     "serial, by-id or by-path link, sysfs place): nothing will assemble "
                     "it after a reboot")
    for role in place:
        notes.append(f"cachemgr: {nodes[role]} ({role}) is known by its place only (no WWN, "
                     "serial or by-id link): after a reboot the boot pass leaves the device "
                     f"to you (check its disks, then: cachemgr assemble {name})")
    return notes


def remove(sysfs: Sysfs, target: str, *, keep_device: bool = False,
           ctl: Control | None = None, timeout: float = DETACH_TIMEOUT,
           stall_timeout: float = STALL_TIMEOUT) -> Result:
    """Safe decommission: a backing device is detached (flushes), then stopped; a dm-cache
    device is flushed and removed (or kept as a linear mapping); a cache set is unregistered
    once nothing is attached and no stopped backing device left dirty data on its SSD."""
    _timeouts(timeout, stall_timeout)
    ctl = _ctl(ctl, f"remove of {target}")
    snap = status(sysfs, probe_unregistered=False)
    dev = kinds.resolve(snap, target, sysfs, caches=True)
    _root(dev, "removing")
    if not dev.cached_device:  # a cache set: its kind's own refusals (its preflight)
        # no question while devices are attached to it: that is refused as it stands
        if ctl.asks and not getattr(dev.obj, "backing_names", ()):
            first = _checked(gate_mod.of_cache_set(dev.obj, snap), "remove")
            if os.geteuid() == 0:
                dev.preflight(sysfs, "remove")
            if _ask(ctl, sysfs, snap, f"remove {target}", [*first, *dev.would("remove")]):
                snap, dev = _again(sysfs, target, caches=True)
        with gate_mod.gate(gate_mod.of_cache_set(dev.obj, snap), "remove"):
            return Result(changes=dev.remove(sysfs, keep_device=keep_device, timeout=timeout,
                                             stall_timeout=stall_timeout, progress=ctl.report))
    if ctl.asks:
        first = _checked(gate_mod.of_kind(dev), "remove")
        dev.preflight(sysfs, "remove", keep_device=keep_device)
        if _ask(ctl, sysfs, snap, f"remove {target}" + (" --keep-device" if keep_device else ""),
                [*first, *dev.would("remove", keep_device=keep_device)], [dev.vm_node]):
            snap, dev = _again(sysfs, target, caches=True)
    with gate_mod.gate(gate_mod.of_kind(dev), "remove"):
        out = Result(changes=dev.remove(sysfs, keep_device=keep_device, timeout=timeout,
                                        stall_timeout=stall_timeout, progress=ctl.report))
        out.notes += dev.forget()  # what would bring it back (a dm-cache's record)
        return out


# ----------------------------------------------------------------------------- tune


def tunables_of(obj: object) -> dict[str, tuple[int, int]]:
    """What can be tuned on ``obj`` and the library's bounds."""
    k = kinds.of(obj)
    return k.tunables() if k is not None else {}


def tune(sysfs: Sysfs, target: str, settings: Sequence[str]) -> Result:
    """NAME=VALUE settings; every one is checked before the first write; "already so" for
    each unchanged one (a note), and exit 4 when none changed."""
    return tuning.tune(sysfs, status(sysfs, probe_unregistered=False), target, settings)


# ----------------------------------------------------------------------------- dangerous


def force_run(sysfs: Sysfs, backing: str, *, accept_data_loss: bool = False,
              ctl: Control | None = None) -> Result:
    """Start a backing device without its cache: refused unless the caller accepts the
    data loss in so many words; then ``ctl``'s question."""
    if not accept_data_loss:
        raise UnsafeError(
            "starting a backing device without its cache can corrupt its filesystem when its "
            "dirty data was in that cache",
            hint="bring the cache back instead; if it is gone for good, repeat with "
                 "--i-accept-data-loss",
        )
    snap = status(sysfs, probe_unregistered=False)
    b = resolve_backing(snap, backing, sysfs)
    require_root("force-run")
    ctl = _ctl(ctl, f"force-run {backing}")
    if ctl.asks and not b.running:
        first = _checked(gate_mod.of_backing(b), "force-run")
        node = b.identity.node
        dirty = b.state.value == "dirty"
        if _ask(ctl, sysfs, snap, f"force-run {backing}", [
                *first, f"would start {b.device or node} without its cache: it runs on what {node} "
                f"holds alone; bcache says {b.state.value}"
                + (": what its cache held dirty is lost, and the filesystem on it can be "
                   "corrupt" if dirty else "")], [b.device]):
            b = resolve_backing(status(sysfs, probe_unregistered=False), backing, sysfs)
    dev = _kind(b)
    with gate_mod.gate(gate_mod.of_kind(dev), "force-run"):
        return Result(changes=[dev.force_run(sysfs, AcceptDataLoss.I_ACCEPT_DATA_LOSS)])


def stop_set(sysfs: Sysfs, cache: str, *, accept_data_loss: bool = False,
             ctl: Control | None = None) -> Result:
    """Stop a cache set without flushing: refused unless the data loss is accepted; then
    ``ctl``'s question."""
    if not accept_data_loss:
        raise UnsafeError(
            "stopping a cache set stops every backing device on it (the VMs' disks vanish) "
            "and leaves dirty data behind on the SSD",
            hint="use 'cachemgr remove' (flushes first); to stop anyway, repeat with "
                 "--i-accept-data-loss",
        )
    snap = status(sysfs, probe_unregistered=False)
    c = resolve_cache_set(snap, cache, sysfs)
    require_root("stop-set")
    ctl = _ctl(ctl, f"stop-set {cache}")
    if ctl.asks:
        first = _checked(gate_mod.of_cache_set(c, snap), "stop-set")
        members = [b for b in snap.backings if b.cset_uuid == c.uuid]
        names = [b.device or b.identity.node for b in members]
        dirty = [b.dirty_bytes for b in members]
        total = None if None in dirty else sum(d or 0 for d in dirty)
        ssd = ", ".join(x.identity.node for x in c.caches) or "its SSD"
        if _ask(ctl, sysfs, snap, f"stop-set {cache}", [
                *first, f"would stop cache set {c.uuid} without writing its dirty data back",
                *([f"would stop {', '.join(names)} with it: whatever uses "
                   + ("them" if len(names) > 1 else "it")
                   + " (a VM's disk, a mount) loses the disk",
                   ("the dirty data (how much is not known)" if total is None
                    else f"{human(total)} of dirty data") + f" would stay on {ssd}, never "
                   "written to the disks under them"] if names else [])],
                [b.device for b in members]):
            snap = status(sysfs, probe_unregistered=False)
            c = resolve_cache_set(snap, cache, sysfs)
    with gate_mod.gate(gate_mod.of_cache_set(c, snap), "stop-set"):
        return Result(changes=[_kind(c).stop_set(sysfs, AcceptDataLoss.I_ACCEPT_DATA_LOSS)])


# ----------------------------------------------------------------------------- words


def dirty_consequence(obj: object, mode: CacheMode) -> str:
    """What happens to the dirty data when switching ``obj`` to ``mode`` (a confirmation
    text)."""
    k = kinds.of(obj)
    return k.dirty_consequence(mode) if k is not None else ""


def status_json(snap: Snapshot, sysfs: Sysfs | None = None, *,
                written_back: Mapping[str, float | None] | None = None) -> dict[str, Any]:
    """``status --json``: schema 1 (docs/json.md). With ``sysfs``, also ``ssd_health``: each
    cache SSD's SMART health (smart.lookup: smartctl at most every 10 min per disk, cached;
    never on the snapshot's own scan). ``written_back``: a poller's measured write-back
    bytes per second by backing key (``written_back_bytes_per_second``; null without)."""
    doc = snapshot_mod.to_json(snap)
    objs = [*snap.backings, *snap.dmcaches, *snap.writecaches]
    for entry, obj in zip(doc["devices"], objs, strict=True):
        entry["owner"] = owners.owner_json(owner_of(snap, obj))
    # the bcache entries come first (snapshot.to_json): measured write-back, by backing key
    for entry, b in zip(doc["devices"][:len(snap.backings)], snap.backings, strict=True):
        v = (written_back or {}).get(b.key)
        entry["written_back_bytes_per_second"] = None if v is None else round(v)
    for obj in snap.others:  # the kinds registered beyond the built-in ones
        k = kinds.of(obj)
        if k is not None and k.cached_device:
            doc["devices"].append({**k.to_json(),
                                   "owner": owners.owner_json(owner_of(snap, obj))})
    doc["owners"] = [owners.owner_json(o) for o in snap.owners]
    doc["unassembled"] = [unassembled_json(u) for u in snap.unassembled]
    doc["unseen"] = [unseen_json(u) for u in snap.unseen]
    # caches marked as holding copies of a disk a VM took elsewhere (procedures/coherence.py)
    doc["left"] = coherence.left_json()
    doc["warms"] = coherence.warm_json()  # the warms arrivals started (ops/migrate.py)
    if sysfs is not None:
        doc["ssd_health"] = ssd_health_json(ssd_health(sysfs, snap))
    return doc


def ssd_health(sysfs: Sysfs, snap: Snapshot, *, max_age: float = smart.MAX_AGE) -> list[
        tuple[smart.Ssd, smart.Health | None]]:
    """Each cache SSD of ``snap`` with its SMART health (cached; smartctl for an answer older
    than ``max_age``: status, the TUI detail, ``ssd-health``)."""
    return smart.ssd_health(sysfs, snap, max_age=max_age)


def ssd_health_json(rows: list[tuple[smart.Ssd, smart.Health | None]]) -> list[dict[str, Any]]:
    """docs/json.md, ``ssd_health``: one entry per cache SSD."""
    return [{"device": ssd.node, "name": ssd.name, "caches": list(ssd.caches),
             "health": smart.health_json(h)}
            for ssd, h in rows]


def unseen_json(u: Unseen) -> dict[str, Any]:
    """docs/json.md, ``unseen``: one thing this run (not root) could not read."""
    return {"what": u.what, "path": u.path, "why": u.why, "hides": u.hides}


unseen_words = unseen.words  # the one line a face prints (the faces import this layer)


def unassembled_json(u: UnassembledDmCache) -> dict[str, Any]:
    """docs/json.md, ``unassembled``: a recorded dm-cache device that is not assembled."""
    return {"kind": "dm-cache", "name": u.name, "device": u.node, "record": u.record,
            "mode": u.mode.value, "stale_origin": u.mode == CacheMode.WRITEBACK,
            "problems": [{"role": r, "why": w} for r, w in u.problems],
            "unproven": [{"role": r, "why": w} for r, w in u.unproven],
            "check": u.check}
