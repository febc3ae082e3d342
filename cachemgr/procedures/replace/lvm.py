"""Replacing the SSD under an LVM-owned cache (lvmcache with a cache pool or cachevol, or lvm
writecache): the journaled, resumable procedure of the package (cachemgr/procedures/replace/)
with its own steps, every one through lvm2 (docs/kernel-notes.md, "lvm2", "Replacing the SSD
of an LVM cache").

The cached LV stays up and keeps serving IO throughout: it is drained through lvm2's cleaner
(writethrough while it drains, so no new dirty block appears), its cache is split off
(``lvconvert --splitcache``: the LV goes on uncached, every byte on its origin), the old cache
pool or cachevol is deleted, the SSD's PV is taken out of the VG and its label wiped, the SSD
is SCSI-removed and the new (or re-inserted) one found and checked as for bcache; then the new
disk becomes a PV of the VG, a cache pool or cachevol like the old one (name, size, metadata
size, chunk size) is made on it alone, attached with the old mode, policy and settings, and
checked. Each step first looks whether its effect is there already, so a resumed run neither
repeats nor undoes work; before the old cache is deleted a run can be rolled back (the cache
attached again, its policy put back).

Every other LV cached on the same SSD PV is replaced in the same run (the journal's
``lvm["caches"]``, :func:`caches`): each step does its part for every cache, the named LV's
first, and the PV leaves the VG once (docs/admin-guide.md, "Replacing the SSD under an LVM
cache", for why not ``pvmove -n``).

Refused at plan time: an LV whose cache (or any other cache on the same PV) lies on more than
one PV besides the origin's, an SSD that is neither a SCSI disk nor an NVMe namespace (or on a
shared NVMe controller), an SSD PV that holds any LV that is not one of those caches (a data
LV: vgreduce would fail, and the run moves no data LV), a failed or needs_check cache, and
every wrong new disk bcache's replacement refuses.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from cachemgr.backends import hotplug, signatures, snapshot
from cachemgr.backends.lvm import command, manage
from cachemgr.backends.lvm import report as lvm_report
from cachemgr.backends.targets import find_dm
from cachemgr.core.errors import AlreadyError, CacheMgrError, UnsafeError, UsageError
from cachemgr.core.model import CacheMode, DmCacheDevice, DmWritecacheDevice, Size, Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import keys
from cachemgr.procedures.replace import shared, steps
from cachemgr.procedures.replace.base import Ctx, Kind
from cachemgr.procedures.replace.journal import Journal, Options, new_run_id

STEPS = steps.LVM
POINT_OF_NO_RETURN = "remove-old-cache"
# lvm2 places the cache pool's spare metadata LV (lvol0_pmspare, as large as the metadata)
# beside a new pool, and rounds each LV up to whole extents (4 MiB by default): room for both
SLACK_BYTES = 16 * 1024 * 1024


def _lv_word(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text)[:24]


def find(sysfs: Sysfs, target: str) -> manage.LvmDevice | None:
    """The LVM-owned cache ``target`` names, if it names one."""
    return find_dm(snapshot.take(sysfs), target, sysfs, lvm=True)


def names_lv(target: str) -> bool:
    """``target`` is spelt as an LV (VG/LV, /dev/VG/LV, /dev/mapper/VG-LV)."""
    return command.spelling(target) is not None


def claims(target: str, sysfs: Sysfs | None,
           snap: Snapshot | None = None) -> manage.LvmDevice | bool | None:
    """Whether ``target`` names an LVM cache: True when it is spelt as an LV (the plan looks
    it up), the cache a dm name or /dev/dm-N is (in ``snap``, or a snapshot of ``sysfs``),
    None when neither (or when there is neither a snapshot nor a /sys to look in)."""
    if names_lv(target):
        return True
    if snap is not None:
        return find_dm(snap, target, sysfs, lvm=True)
    return None if sysfs is None else find(sysfs, target)


def plan_claimed(sysfs: Sysfs, target: str, opts: Options, found: object) -> Journal:
    """:func:`plan` of what :func:`claims` found."""
    return plan(sysfs, target, opts,
                found if isinstance(found, DmCacheDevice | DmWritecacheDevice) else None)


# --------------------------------------------------------------------------------- planning


def plan(sysfs: Sysfs, target: str, opts: Options,
         found: manage.LvmDevice | None = None) -> Journal:
    """Preflight and remember for an LVM cache; changes nothing. ``found``: the cache
    ``target`` names, when the caller has looked it up already."""
    if opts.interim_mode != CacheMode.NONE.value:
        raise UsageError(f"--interim-mode {opts.interim_mode} does not apply to an LVM cache",
                         hint="it drains through lvm2's cleaner policy (writethrough while it "
                              "drains); leave --interim-mode out")
    if not opts.wipe_old:
        raise UsageError("--keep-old-signature does not apply to an LVM cache",
                         hint="its PV label is wiped (pvremove) once it has left the VG")
    d = found or find(sysfs, target)
    if d is None:
        raise UsageError(f"{target} is not a cached LV",
                         hint="cachemgr status lists the LVM caches (VG/LV)")
    v = manage.lv_of(d)
    manage.refuse_unhealthy(d, "cache")
    pv = _ssd_pv(v)
    name = sysfs.block_name_of(pv) if sysfs.live else pv.removeprefix("/dev/")
    disk = shared.hotplug_disk(sysfs, name or pv, f"{pv} (the PV under {v.full_name}'s cache)")
    shared.refuse_unpullable(sysfs, disk, None)
    rows = command.default_source(sysfs).report()
    # every other LV cached on the same SSD PV is replaced in the same run (the PV leaves the
    # VG once, for all of them): each must be one this run can replace
    mates = [x for x in _cached_lvs(sysfs) if x.lvm is not None and x.lvm.vg == v.vg
             and pv in x.lvm.cache_pvs and x.lvm.lv != v.lv]
    cached = [v]
    for x in sorted(mates, key=lambda x: manage.lv_of(x).lv):
        manage.refuse_unhealthy(x, "cache")
        xv = manage.lv_of(x)
        if _ssd_pv(xv) != pv:
            raise UnsafeError(f"{xv.full_name} is cached on {pv} too, and its cache lies on "
                              "other PVs as well; replace-ssd replaces caches on one SSD",
                              hint="lvs -a -o+devices shows where it lies")
        cached.append(xv)
    own = {"lvol0_pmspare"} | {f"{x.pool}{sfx}" for x in cached
                               for sfx in ("", "_cdata", "_cmeta")}
    others = [x for x in lvm_report.lvs_on(rows, v.vg, pv) if x not in own]
    if others:
        raise UnsafeError(f"{pv} holds other LVs of {v.vg} besides the caches: "
                          f"{', '.join(others)}; taking it out of the VG would need them moved, "
                          "and replace-ssd moves no data LV; nothing was changed",
                          hint=f"pvmove them off {pv} first (pvmove -n LV {pv} PV...), or "
                               "remove them")
    pools = {x.pool for x in cached}
    if "lvol0_pmspare" in lvm_report.lvs_on(rows, v.vg, pv) and [
            x for x in lvm_report.lv_names(rows, v.vg, "cache-pool") if x not in pools]:
        raise UnsafeError(f"{pv} holds {v.vg}'s spare pool metadata (lvol0_pmspare), which "
                          "another cache pool needs", hint=f"pvmove it off {pv} first")
    records = [_record(rows, x, pv) for x in cached]
    need = sum(r["need_bytes"] for r in records)
    lvm: dict[str, Any] = {**records[0], "need_bytes": need,
                           "caches": [{k: val for k, val in r.items() if k not in ("vg", "pv")}
                                      for r in records[1:]]}
    shared.check_new_spec(sysfs, opts.new, disk, v.full_name, None, need)
    if opts.new == "any" and not opts.yes and not sys.stdin.isatty():
        raise UsageError("--new any needs an operator to swap the disk",
                         hint="run it on a terminal, or pass --yes once the disk is in")
    shared.old_match(disk)  # refuses an SSD with neither WWID nor serial
    return Journal(
        id=new_run_id(_lv_word(v.full_name)), cset=v.full_name, options=asdict(opts),
        old={**hotplug.record(disk), "bucket": None},
        backings=[], kind="lvm", lvm=lvm)


def _ssd_pv(v: Any) -> str:
    """The one PV of ``v``'s cache that its origin does not use (the SSD)."""
    ssd_pvs = [p for p in v.cache_pvs if p not in v.origin_pvs]
    if len(ssd_pvs) != 1:
        raise UnsafeError(f"{v.full_name}: its cache lies on {len(ssd_pvs)} PVs apart from the "
                          f"origin's ({', '.join(ssd_pvs) or 'none'}); replace-ssd replaces a "
                          "cache on one SSD", hint="lvs -a -o+devices shows where it lies")
    return str(ssd_pvs[0])


def _cached_lvs(sysfs: Sysfs) -> list[manage.LvmDevice]:
    return [x for x in snapshot.take(sysfs).dm_devices
            if isinstance(x, (DmCacheDevice, DmWritecacheDevice)) and x.lvm is not None]


def _record(rows: list[dict[str, Any]], v: Any, pv: str) -> dict[str, Any]:
    """What the run remembers of one cached LV on the SSD: enough to make its cache again."""
    data = lvm_report.size(rows, v.vg, v.pool)
    meta = lvm_report.size(rows, v.vg, f"{v.pool}_cmeta") if v.pool_kind == "cachepool" else 0
    if not data or meta is None:
        raise CacheMgrError(f"{v.full_name}: lvs reports no size for its cache {v.pool}")
    settings = [[k, val] for k, val in v.settings if k != "cleaner"]
    return {"vg": v.vg, "lv": v.lv, "segtype": v.segtype, "pool_kind": v.pool_kind,
            "pool": v.pool_name, "data_bytes": data, "meta_bytes": meta,
            "chunk_bytes": v.chunk_bytes, "mode": v.cache_mode, "policy": v.policy,
            "settings": settings, "pv": pv, "need_bytes": data + 2 * meta + SLACK_BYTES}


def caches(j: Journal) -> list[dict[str, Any]]:
    """Every cache the run replaces, as one record each (vg and pv filled in): the named LV's
    first, then the other LVs cached on the same SSD PV (journals before that have none)."""
    m = j.lvm
    return [m, *({**x, "vg": m["vg"], "pv": m["pv"]} for x in m.get("caches") or [])]


def head(j: Journal) -> list[str]:
    m, old = j.lvm, j.old
    what = "lvm writecache" if m["segtype"] == "writecache" else f"lvmcache ({m['pool_kind']})"
    cfg = [f"{Size.exact(m['data_bytes'])}"]
    if m.get("meta_bytes"):
        cfg.append(f"metadata {Size.exact(m['meta_bytes'])}")
    if m.get("chunk_bytes"):
        cfg.append(f"{'block' if m['segtype'] == 'writecache' else 'chunk'} "
                   f"{Size.exact(m['chunk_bytes'])}")
    if m.get("mode"):
        cfg.append(f"mode {m['mode']}")
    if m.get("policy"):
        cfg.append(f"policy {m['policy']}")
    if m.get("settings"):
        cfg.append("settings " + ",".join(f"{k}={v}" for k, v in m["settings"]))
    out = [f"replace the cache SSD {shared.ssd_words(old)} of {what} {j.cset}",
           f"cache {m['vg']}/{m['pool']}: " + ", ".join(cfg)]
    for x in caches(j)[1:]:
        out.append(f"and of {x['vg']}/{x['lv']} (cached on the same SSD PV {m['pv']}): cache "
                   f"{x['vg']}/{x['pool']}, {Size.exact(x['data_bytes'])}, mode "
                   f"{x.get('mode') or 'writeback'}; replaced in the same run")
    return out


# --------------------------------------------------------------------------------- steps


def _vg_lv(m: dict[str, Any]) -> str:
    return f"{m['vg']}/{m['lv']}"


def _pool(m: dict[str, Any]) -> str:
    return f"{m['vg']}/{m['pool']}"


def _cached(c: Ctx, m: dict[str, Any]) -> manage.LvmDevice | None:
    """The LV as a cached device now (None once its cache is split off)."""
    return find(c.sysfs, _vg_lv(m))


def _rows() -> list[dict[str, Any]]:
    return command.LiveLvs().report()


def s_drain(c: Ctx) -> None:
    # one LV after the other; a drained one keeps the cleaner (writethrough) until its split
    for m in caches(c.j):
        d = _cached(c, m)
        if d is None:
            continue  # split off already
        # ``then`` makes even a clean cache go through the journaled cleaner, and
        # keep_cleaner leaves it on (writethrough: nothing new gets dirty) until split takes
        # the cache off
        start, secs, _, _ = manage.drain(d, timeout=c.opts.drain_timeout,
                                         stall_timeout=c.opts.stall_timeout,
                                         progress=shared.drain_reporter(c.say),
                                         then=lambda _d: None, keep_cleaner=True)
        c.say(f"{_vg_lv(m)}: clean after {secs:.1f} s ({Size.exact(start or 0)} written "
              "back); the cleaner stays on until the split")


def s_split(c: Ctx) -> None:
    for m in caches(c.j):
        d = _cached(c, m)
        v = manage.lv_of(d) if d is not None else None
        if v is not None:
            if v.pool_name != m["pool"]:
                raise UnsafeError(f"{_vg_lv(m)} is cached by {v.vg}/{v.pool_name}, not by the "
                                  f"cache this run replaces ({_pool(m)})")
            command.lvconvert("--splitcache", "--", _vg_lv(m), timeout=c.opts.drain_timeout)
            c.say(f"{_vg_lv(m)}: cache {_pool(m)} split off; the LV runs uncached")
        # the drain's journal (the policy to put back) has no LV to go back to now: the old
        # cache is deleted next, and the new one is attached with the remembered policy
        manage.journal_for(_vg_lv(m)).unlink(missing_ok=True)


def s_remove_old_cache(c: Ctx) -> None:
    for m in caches(c.j):
        rows = _rows()
        vg, pool = m["vg"], m["pool"]
        if not lvm_report.field(rows, vg, pool, "lv_layout"):
            continue
        if _cached(c, m) is not None:
            raise UnsafeError(f"{_vg_lv(m)} is cached again; refusing to delete {vg}/{pool}")
        if m["pv"] not in lvm_report.pvs_of(rows, vg, pool):
            raise UnsafeError(f"{vg}/{pool} does not lie on the old SSD's PV {m['pv']} "
                              "(another LV of that name?); refusing to delete it")
        command.lvm("lvremove", "-y", "--", f"{vg}/{pool}", timeout=600)
        c.say(f"{vg}/{pool} deleted (its data was written back)")


def _old_node(c: Ctx) -> str | None:
    d = shared.old_present(c)
    return command.check_node(d.node) if d is not None else None


def s_vgreduce(c: Ctx) -> None:
    node = _old_node(c)
    if node is None:
        return
    vg = c.j.lvm["vg"]
    if command.pv_vg(node) != vg:
        return
    command.lvm("vgreduce", "--", vg, node, timeout=600)
    c.say(f"{node} taken out of {vg}")


def s_pvremove(c: Ctx) -> None:
    node = _old_node(c)
    if node is None:
        c.say("the old SSD is not there any more: no PV label to wipe")
        return
    in_vg = command.pv_vg(node)
    if in_vg is None:
        c.say(f"{node}: no PV label left")
        return
    if in_vg:
        raise UnsafeError(f"{node} is a PV of {in_vg}; refusing to wipe its label")
    command.lvm("pvremove", "-y", "--", node, timeout=600)
    c.say(f"{node}: PV label wiped")


def _new_node(c: Ctx) -> str:
    return command.check_node(shared.new_disk(c).node)


def s_pvcreate(c: Ctx) -> None:
    node = _new_node(c)
    if command.pv_vg(node) is not None:
        return
    sig = signatures.first(node)
    if sig is not None:
        raise UnsafeError(f"{node} carries a {sig} signature now; refusing to make it a PV",
                          hint="check it is the right disk; wipe it deliberately (wipefs -a), "
                               f"then cachemgr replace-ssd --resume {c.j.id}")
    command.lvm("pvcreate", "-y", "--", node, timeout=600)
    c.say(f"{node}: PV made")


def s_vgextend(c: Ctx) -> None:
    node = _new_node(c)
    vg = c.j.lvm["vg"]
    cur = command.pv_vg(node)
    if cur == vg:
        return
    if cur:
        raise UnsafeError(f"{node} is a PV of another VG {cur}")
    command.lvm("vgextend", "--", vg, node, timeout=600)
    c.say(f"{node} added to {vg}")


def s_make_cache(c: Ctx) -> None:
    node = _new_node(c)
    for m in caches(c.j):
        rows = _rows()
        if lvm_report.field(rows, m["vg"], m["pool"], "lv_layout"):
            if node not in lvm_report.pvs_of(rows, m["vg"], m["pool"]):
                raise UnsafeError(f"{_pool(m)} exists and does not lie on the new SSD {node}")
            continue  # made by an earlier run
        argv = ["lvcreate", "-y", "-n", m["pool"], "-L", f"{int(m['data_bytes'])}b"]
        if m["pool_kind"] == "cachepool":
            argv += ["--type", "cache-pool", "--poolmetadatasize", f"{int(m['meta_bytes'])}b"]
            if m.get("chunk_bytes"):
                argv += ["--chunksize", f"{int(m['chunk_bytes']) // 1024}k"]
        command.lvm(*argv, "--", m["vg"], node, timeout=600)
        c.say(f"{_pool(m)}: {m['pool_kind']} of {Size.exact(m['data_bytes'])} made on {node}")


def _settings(m: dict[str, Any]) -> list[tuple[str, str]]:
    return [(str(k), str(v)) for k, v in m.get("settings") or []]


def _attach_one(c: Ctx, m: dict[str, Any]) -> None:
    writecache = m["segtype"] == "writecache"
    try:
        manage.attach(_vg_lv(m), _pool(m), writecache=writecache,
                      mode=None if writecache or not m.get("mode") else CacheMode(m["mode"]),
                      policy=None if writecache else m.get("policy"),
                      settings=_settings(m))
        c.say(f"{_vg_lv(m)}: cached again by {_pool(m)}")
    except AlreadyError:
        d = _cached(c, m)
        if d is None or manage.lv_of(d).pool_name != m["pool"]:
            raise


def s_attach(c: Ctx) -> None:
    for m in caches(c.j):
        _attach_one(c, m)


def _restore_one(c: Ctx, m: dict[str, Any]) -> None:
    d = _cached(c, m)
    if d is None:
        raise CacheMgrError(f"{_vg_lv(m)} is not cached after attach")
    v = manage.lv_of(d)
    vl = _vg_lv(m)
    if not isinstance(d, DmWritecacheDevice):
        if m.get("mode") and v.cache_mode != m["mode"]:
            command.lvchange(vl, "--cachemode", m["mode"])
            c.say(f"{vl}: mode {m['mode']} restored")
        if m.get("policy") and v.policy != m["policy"]:
            command.lvchange(vl, "--cachepolicy", m["policy"])
            c.say(f"{vl}: policy {m['policy']} restored")
    differ = [(k, val) for k, val in _settings(m) if v.setting(k) != val]
    if differ:
        command.lvchange(vl, "--cachesettings", manage.settings_word(differ))
        c.say(f"{vl}: settings {', '.join(f'{k}={val}' for k, val in differ)} restored")


def s_restore(c: Ctx) -> None:
    for m in caches(c.j):
        _restore_one(c, m)


def s_verify(c: Ctx) -> None:
    node = c.j.new.get("node")
    new_pv = shared.find_new(c)
    problems = []
    for m in caches(c.j):
        d = _cached(c, m)
        if d is None:
            problems.append(f"{_vg_lv(m)} is not cached")
            continue
        v = manage.lv_of(d)
        p = []
        if v.pool_name != m["pool"]:
            p.append(f"cached by {v.pool_name}, not {m['pool']}")
        if new_pv is None or new_pv.node not in v.cache_pvs:
            p.append(f"its cache does not lie on the new SSD {node} ({v.cache_pvs})")
        if m["pv"] in v.cache_pvs and (new_pv is None or new_pv.node != m["pv"]):
            p.append(f"its cache still lies on the old PV {m['pv']}")
        if m.get("mode") and v.cache_mode != m["mode"]:
            p.append(f"mode {v.cache_mode}, not {m['mode']}")
        if m.get("policy") and v.policy != m["policy"]:
            p.append(f"policy {v.policy}, not {m['policy']}")
        if d.failure or v.check_needed or v.health:
            p.append(f"unhealthy ({d.failure or v.health or 'needs_check'})")
        problems += [f"{_vg_lv(m)}: {x}" for x in p]
    if problems:
        raise CacheMgrError("verification failed: " + "; ".join(problems))
    for m in caches(c.j):
        c.say(f"verified: {_vg_lv(m)} cached by {_pool(m)} on "
              f"{new_pv.node if new_pv else node}")


def _rollback(c: Ctx) -> None:
    """Before the old caches are deleted: attach each again (if split) with the old mode,
    policy and settings, or put its policy back (if only drained)."""
    for m in caches(c.j):
        d = _cached(c, m)
        if d is not None:
            manage.restore_interrupted(d)
            c.say(f"{_vg_lv(m)}: policy put back; the cache stays attached")
            continue
        if lvm_report.field(_rows(), m["vg"], m["pool"], "lv_layout"):
            _attach_one(c, m)
            _restore_one(c, m)
        manage.journal_for(_vg_lv(m)).unlink(missing_ok=True)


FUNCS: dict[str, Callable[[Ctx], None]] = {
    "drain": s_drain,
    "split": s_split,
    "remove-old-cache": s_remove_old_cache,
    "vgreduce": s_vgreduce,
    "pvremove": s_pvremove,
    "remove-old": shared.s_remove_old,
    "wait-new": shared.s_wait_new,
    "identify-new": shared.s_identify_new,
    "pvcreate": s_pvcreate,
    "vgextend": s_vgextend,
    "make-cache": s_make_cache,
    "attach": s_attach,
    "restore": s_restore,
    "verify": s_verify,
    "warm": lambda c: shared.warm_step(c, [c.j.cset]),
}


def done_line(j: Journal) -> str:
    return (f"{j.id}: done; " + ", ".join(f"{lv} cached by {m['vg']}/{m['pool']}"
                                          for lv, m in zip(j.lvs(), caches(j), strict=False))
            + f" on {j.new.get('node')}")


KIND = Kind(
    STEPS, FUNCS, POINT_OF_NO_RETURN, _rollback, head, "cached LV",
    name="LVM cache", tag="lv", tag_chars=None,
    stays_up="The LV stays up (uncached between the split and the new attach).",
    undoes="Attach the old cache again with its mode, policy and settings (or, if it was "
           "only drained, put its policy back).",
    done_line=done_line, interim_mode=False,
    claims=claims, plan=plan_claimed,
    names_run=lambda j, spec: command.spelling(spec) in j.lvs(),
    json=lambda j: {"lv": j.cset, "lvm": j.lvm},
    run_keys=lambda cache, backings, lvs: {keys.lvm_key(x) for x in (cache, *lvs)},
    vm_nodes=lambda j, snap: {d.node for d in snap.dm_devices
                              if d.lvm and d.lvm.full_name == j.cset})
