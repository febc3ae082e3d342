"""Replacing the SSD under a dm-cache device cachemgr (or an admin with dmsetup) made, not
LVM's (that is procedures/replace/lvm.py): the journaled, resumable procedure of the package
(cachemgr/procedures/replace/) with its own steps (docs/kernel-notes.md, "Replacing the SSD
of a dm-cache device").

The device (/dev/mapper/NAME) stays up and keeps serving IO throughout. It is drained with
the cleaner policy and then mapped to its origin alone (a ``linear`` table, loaded while
suspended and only if the status reads 0 dirty blocks then: every byte is on the origin).
The cache and metadata areas on the old SSD (the SSD itself, its partitions, or dm-linear
devices over it) are released, the SSD is pulled (SCSI delete, or its NVMe controller's PCI
remove), and the new (or re-inserted) one is found and checked as for bcache. The same areas
are made on it (the old partition table, or the dm-linear devices with their old names,
offsets and sizes), the metadata is zeroed, and the cache table is loaded again over the origin
with the old block size, policy, policy arguments (the live migration_threshold too) and mode.

The metadata is zeroed on every rebuild, on a re-inserted SSD and on a rollback too: while the
device ran linear the origin was written past the cache, so the old metadata's (clean) blocks
may be stale; dm-cache formats fresh metadata on a zeroed superblock and starts cold.

Refused at plan time: an LVM-owned device (lvm.py), a failed cache or one whose cache
target does not start at sector 0 (or does not span the device), a cache area that is not on
one SCSI disk or NVMe namespace, a dm area with more than one target or not ``linear``, an SSD
with anything else on it, and every wrong new disk bcache's replacement refuses.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from cachemgr.backends import hotplug, partitions, signatures
from cachemgr.backends.dmcache import build, command, discover, flushing, manage
from cachemgr.backends.dmcache import record as dm_record
from cachemgr.backends.dmcache.parse import parse_listing, parse_table
from cachemgr.backends.dmcache.refusals import check_changeable
from cachemgr.backends.dmcache.switch import switch_table, with_threshold
from cachemgr.core.change import wait_for
from cachemgr.core.errors import CacheMgrError, UnsafeError, UsageError
from cachemgr.core.model import DmCacheDevice, DmCacheTable, Identity, Size, Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import keys
from cachemgr.procedures.replace import shared, steps
from cachemgr.procedures.replace.base import Ctx, Kind
from cachemgr.procedures.replace.journal import Journal, Options, new_run_id

STEPS = steps.DMCACHE
POINT_OF_NO_RETURN = "release-old"
ROLES = ("metadata", "cache")
# a GPT keeps a backup table in the disk's last 33 sectors: room for it past the last area
TAIL_BYTES = 1024 * 1024


def names_dm(sysfs: Sysfs, target: str) -> DmCacheDevice | None:
    """The dm-cache device (not LVM's) ``target`` names: NAME, /dev/mapper/NAME, /dev/dm-N."""
    name = target.removeprefix("/dev/mapper/")
    devs = discover.dm_devices(sysfs)
    if target.startswith("/dev/dm-"):
        k = target.removeprefix("/dev/")
        name = next((n for n, x in devs.items() if x.kernel_name == k), "")
    if "/" in name or name not in devs:
        return None
    try:
        d = discover.find(sysfs, name)
    except CacheMgrError:
        return None
    return None if d.lvm is not None or (d.uuid or "").startswith("LVM-") else d


def claims(target: str, sysfs: Sysfs | None, snap: Snapshot | None = None
           ) -> DmCacheDevice | None:
    """The dm-cache device ``target`` names (:func:`names_dm`; None without a /sys)."""
    return None if sysfs is None else names_dm(sysfs, target)


# --------------------------------------------------------------------------------- planning


def _area(sysfs: Sysfs, role: str, ident: Identity | None, d: DmCacheDevice) -> dict[str, Any]:
    """Where a role's device lies: the disk itself, a partition of it, or a dm-linear device
    over it (``disk`` names the whole disk, a SCSI disk or NVMe namespace, or is None)."""
    if ident is None:
        raise UnsafeError(f"{d.node}: its {role} device is not readable here")
    k = ident.name
    if k.startswith("dm-"):
        name = (sysfs.read_opt(f"block/{k}/dm/name") or "").strip()
        names = set(discover.dm_devices(sysfs))
        lines = parse_listing(command.default_source(sysfs).output("table"),
                              names).get(name, [])
        f = lines[0].split() if len(lines) == 1 else []
        if len(f) != 5 or f[2] != "linear" or f[0] != "0":
            raise UnsafeError(f"{d.node}: its {role} device /dev/mapper/{name} is not one "
                              "linear mapping of a disk; replace-ssd rebuilds only those",
                              hint="replace this SSD by hand (docs/admin-guide.md)")
        slaves = sysfs.listdir(f"block/{k}/slaves")
        if len(slaves) != 1:
            raise UnsafeError(f"/dev/mapper/{name} lies on {len(slaves)} devices")
        disk = slaves[0]
        if not sysfs.is_dir(f"block/{disk}"):
            raise UnsafeError(f"/dev/mapper/{name} ({role}) lies on /dev/{disk}, a partition; "
                              "replace-ssd rebuilds dm areas on a whole disk only")
        return {"how": "linear", "name": name, "disk": disk, "offset": int(f[4]),
                "sectors": int(f[1]), "node": ident.node}
    if sysfs.is_dir(f"block/{k}"):
        return {"how": "disk", "disk": k, "node": ident.node,
                "sectors": int(sysfs.read(f"block/{k}/size").strip())}
    parent = ident.partition_of or sysfs.disk_of_partition(k)
    if parent is None:
        raise UnsafeError(f"{d.node}: cannot tell where its {role} device {ident.node} lies")
    p = f"block/{parent}/{k}"
    return {"how": "partition", "disk": parent, "node": ident.node,
            "number": int(sysfs.read(f"{p}/partition").strip()),
            "start": int(sysfs.read(f"{p}/start").strip()),
            "sectors": int(sysfs.read(f"{p}/size").strip())}


def plan(sysfs: Sysfs, target: str, opts: Options, d: DmCacheDevice) -> Journal:
    """Check everything, record what will be rebuilt; changes nothing."""
    if opts.interim_mode != "none":
        raise UsageError(f"--interim-mode {opts.interim_mode} does not apply to a dm-cache "
                         "device", hint="it is drained with the cleaner policy (writethrough)")
    if not opts.wipe_old:
        raise UsageError("--keep-old-signature does not apply to a dm-cache device")
    check_changeable(d, "cache", "lvconvert --uncache VG/LV")
    if d.status is None:
        raise UnsafeError(f"{d.node}: the cache is {d.failure or 'failed'}; its dirty blocks "
                          "cannot be written back", hint="docs/admin-guide.md, dm-cache")
    if d.table.start != 0:
        raise UsageError(f"{d.node}: the cache target starts at sector {d.table.start}; "
                         "replace-ssd handles whole-device caches only")
    areas = {"metadata": _area(sysfs, "metadata", d.metadata, d),
             "cache": _area(sysfs, "cache", d.cache, d)}
    ssd_name = areas["cache"]["disk"]
    disk = shared.hotplug_disk(sysfs, ssd_name, f"/dev/{ssd_name} (the SSD under {d.node})")
    meta = areas["metadata"]
    if meta["disk"] != ssd_name:
        meta["how"] = "kept"  # on another disk: stays, zeroed at the rebuild
        if meta["node"] == (d.origin.node if d.origin else None):
            raise UnsafeError(f"{d.node}: metadata on the origin")
    own = {a["name"] for a in areas.values() if a["how"] == "linear"}
    why = [w for w in hotplug.removal_refusals_besides(sysfs, disk, ssd_name)
           if not _ours(w, own, d)]
    if why:
        raise UnsafeError(f"{disk.node} could not be pulled after its cache is released: "
                          + "; ".join(why),
                          hint="replace-ssd takes out the whole disk (NVMe: the whole "
                               "controller); move what else lives on it first")
    table = with_threshold(d.table, d.status.migration_threshold)
    script = None
    if any(a["how"] == "partition" and a["disk"] == ssd_name for a in areas.values()):
        script = partitions.dump(disk.node) if sysfs.live else ""
    ends = [(a.get("start", a.get("offset", 0)) + a["sectors"]) * 512
            for a in areas.values() if a["disk"] == ssd_name]
    need = max(ends) + (TAIL_BYTES if script is not None else 0)
    if any(a["how"] == "disk" for a in areas.values()):
        need = disk.size_bytes or need
    dm = {"name": d.name, "table": table.line(), "length": d.table.length,
          "origin": d.table.origin_dev, "areas": areas, "partitions": script,
          "need_bytes": need, "mode": d.table.mode.value}
    shared.check_new_spec(sysfs, opts.new, disk, d.name, None, need)
    if opts.new == "any" and not opts.yes and not sys.stdin.isatty():
        raise UsageError("--new any needs an operator to swap the disk",
                         hint="run it on a terminal, or pass --yes once the disk is in")
    shared.old_match(disk)  # refuses an SSD with neither WWID nor serial
    return Journal(id=new_run_id(d.name[:24]), cset=d.name, options=asdict(opts),
                   old={**hotplug.record(disk), "bucket": None}, backings=[], kind="dmcache",
                   dm=dm)


def plan_claimed(sysfs: Sysfs, target: str, opts: Options, found: object) -> Journal:
    """:func:`plan` of the device :func:`claims` found."""
    assert isinstance(found, DmCacheDevice), found
    return plan(sysfs, target, opts, found)


def _ours(why: str, own: set[str], d: DmCacheDevice) -> bool:
    """A use of the SSD that is the cache's own: held by its dm areas, or by the cache
    device itself (its partitions, or the whole SSD)."""
    return any(why.endswith(f" (/dev/mapper/{n})") for n in (*own, d.name))


def head(j: Journal) -> list[str]:
    m = j.dm
    t = parse_table(m["table"])
    where = "; ".join(_area_words(r, m["areas"][r]) for r in ROLES)
    return [f"replace the cache SSD {shared.ssd_words(j.old)} of dm-cache /dev/mapper/{j.cset}",
            f"table: block {Size.exact(t.block_sectors * 512)}, mode {t.mode.value}, policy "
            f"{t.policy} {' '.join(t.policy_args)}".rstrip(),
            f"areas: {where}"]


def _area_words(role: str, a: dict[str, Any]) -> str:
    if a["how"] == "linear":
        return f"{role} /dev/mapper/{a['name']} (sectors {a['offset']}+{a['sectors']})"
    if a["how"] == "partition":
        return f"{role} partition {a['number']} (sectors {a['start']}+{a['sectors']})"
    if a["how"] == "kept":
        return f"{role} {a['node']} (on another disk: kept, zeroed)"
    return f"{role} the whole SSD"


# --------------------------------------------------------------------------------- steps


def _name(c: Ctx) -> str:
    return str(c.j.dm["name"])


def _live_table(c: Ctx) -> str:
    return command.read_table(_name(c)).strip()


def _is_linear(line: str) -> bool:
    f = line.split()
    return len(f) >= 3 and f[2] == "linear"


def s_drain(c: Ctx) -> None:
    cur = _live_table(c)
    if _is_linear(cur):
        return  # drained and switched by an earlier run
    d = discover.find(c.sysfs, _name(c))
    manage.remove(c.sysfs, d, keep_device=True, timeout=c.opts.drain_timeout,
                  stall_timeout=c.opts.stall_timeout, progress=shared.drain_reporter(c.say))
    c.say(f"{d.node}: clean; now a linear mapping of its origin (IO goes on)")


def _dm_exists(name: str) -> bool:
    return command.dmsetup("info", "--", name, check=False).returncode == 0


def s_release_old(c: Ctx) -> None:
    if not _is_linear(_live_table(c)):
        raise UnsafeError(f"/dev/mapper/{_name(c)} is not a linear mapping of its origin; "
                          "refusing to release the old SSD's areas")
    for role in ROLES:
        a = c.j.dm["areas"][role]
        if a["how"] == "linear" and _dm_exists(a["name"]):
            command.dmsetup("remove", "--retry", "--", a["name"], timeout=60)
            c.say(f"/dev/mapper/{a['name']} ({role} area) removed")
    if c.j.dm.get("partitions") is not None:
        d = shared.old_present(c)
        if d is not None and signatures.first(d.node) is not None:
            signatures.wipe(d.node)
            c.say(f"{d.node}: partition table wiped")


def _node_of(c: Ctx, role: str, disk: hotplug.Disk) -> str:
    a = c.j.dm["areas"][role]
    if a["how"] == "linear":
        return f"/dev/mapper/{a['name']}"
    if a["how"] == "partition":
        return f"/dev/{partitions.part_name(disk.name, int(a['number']))}"
    if a["how"] == "kept":
        return str(a["node"])
    return disk.node


def s_layout_new(c: Ctx) -> None:
    d = shared.new_disk(c)
    script = c.j.dm.get("partitions")
    if script is not None:
        want = [a for a in c.j.dm["areas"].values() if a["how"] == "partition"]
        if not all(c.sysfs.exists(f"block/{d.name}/{partitions.part_name(d.name, a['number'])}")
                   for a in want):
            partitions.write(d.node, partitions.for_disk(script, d.name))
            c.say(f"{d.node}: partition table made (the old SSD's layout)")
    for role in ROLES:
        a = c.j.dm["areas"][role]
        if a["how"] != "linear" or _dm_exists(a["name"]):
            continue
        command.dmsetup("create", "--table", f"0 {a['sectors']} linear {d.node} {a['offset']}",
                        "--", a["name"])
        c.say(f"/dev/mapper/{a['name']} ({role} area) made on {d.node}")
    nodes = [_node_of(c, role, d) for role in ROLES]
    if not wait_for(lambda: all(os.path.exists(n) for n in nodes), 30, 0.1):
        raise CacheMgrError(f"the cache and metadata areas {', '.join(nodes)} did not all "
                            "appear within 30 s")


def _rebuild(c: Ctx, disk: hotplug.Disk) -> None:
    """Zero the metadata and load the remembered cache table over the origin on ``disk``'s
    areas (nothing done when that table is live already)."""
    cur = _live_table(c)
    meta, cache = _node_of(c, "metadata", disk), _node_of(c, "cache", disk)
    old = parse_table(c.j.dm["table"])
    devno = {n: _devno(n) for n in (meta, cache)}
    if not _is_linear(cur):
        t = parse_table(cur)
        if (t.metadata_dev, t.cache_dev) == (devno[meta], devno[cache]):
            return
        raise UnsafeError(f"/dev/mapper/{_name(c)} is a cache on other devices "
                          f"({t.metadata_dev}, {t.cache_dev}); refusing to reload it")
    if cur.split()[3:5] != [old.origin_dev, "0"]:
        raise UnsafeError(f"/dev/mapper/{_name(c)} maps {cur.split()[3]}, not the origin "
                          f"{old.origin_dev}; refusing to put a cache over it")
    build.zero_superblock(meta)
    new = DmCacheTable(0, old.length, meta, cache, old.origin_dev, old.block_sectors,
                       old.features, old.policy, old.policy_args)
    switch_table(_name(c), cur, new.line())
    c.say(f"/dev/mapper/{_name(c)}: cache table loaded (metadata {meta}, cache {cache})")


def _devno(node: str) -> str:
    st = os.stat(node)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def s_rebuild(c: Ctx) -> None:
    _rebuild(c, shared.new_disk(c))


def s_verify(c: Ctx) -> None:
    d = discover.find(c.sysfs, _name(c))
    disk = shared.new_disk(c)
    old = parse_table(c.j.dm["table"])
    problems = []
    want = {r: _devno(_node_of(c, r, disk)) for r in ROLES}
    if (d.table.metadata_dev, d.table.cache_dev) != (want["metadata"], want["cache"]):
        problems.append(f"cache {d.table.cache_dev} and metadata {d.table.metadata_dev} are "
                        f"not the new SSD's areas ({want['cache']}, {want['metadata']})")
    if d.table.block_sectors != old.block_sectors:
        problems.append(f"block {d.table.block_sectors} sectors, not {old.block_sectors}")
    if d.table.mode != old.mode:
        problems.append(f"mode {d.table.mode.value}, not {old.mode.value}")
    if d.table.policy != old.policy:
        problems.append(f"policy {d.table.policy}, not {old.policy}")
    if d.failure or d.status is None:
        problems.append(f"the cache reads {d.failure or 'no status'}")
    if problems:
        raise CacheMgrError(f"verification failed: {d.node}: " + "; ".join(problems))
    c.say(f"verified: {d.node} caches on {disk.node} ({d.table.mode.value}, "
          f"{d.table.policy})")
    _record_moved(c, disk)


def _record_moved(c: Ctx, disk: hotplug.Disk) -> None:
    """The device's record (``create dm-cache`` wrote it; backends/dmcache/record.py) names
    the new SSD's areas from now on, so that the boot pass assembles the device on them. A
    record that cannot be written is said, not a failure: the device runs on its new SSD."""
    try:
        rec = dm_record.load(_name(c))
        if rec is None:
            return
        new = dm_record.moved(c.sysfs, rec, {r: _node_of(c, r, disk) for r in ROLES})
        if new != rec:
            c.say(f"{dm_record.save(new)}: the record names the new SSD's areas now")
    except CacheMgrError as exc:
        c.say(f"cachemgr: the record of /dev/mapper/{_name(c)} ({dm_record.records_dir()}) "
              f"still names the old SSD ({exc}): after a reboot the boot pass will not "
              "assemble the device on the new one")


def _rollback(c: Ctx) -> None:
    """Before release-old: the cache goes back on the old SSD's areas, cold (metadata
    zeroed: the origin was written past it), with its table; a drain that stopped half-way
    has put its own table back already (its journal restores it otherwise)."""
    cur = _live_table(c)
    if not _is_linear(cur):
        d = discover.find(c.sysfs, _name(c))
        flushing.recover(c.sysfs, d)
        c.say(f"/dev/mapper/{_name(c)}: still a cache; its table is the old one")
        return
    disk = shared.old_present(c)
    if disk is None:
        raise UnsafeError("the old SSD is not there; cannot put the cache back on it")
    _rebuild(c, disk)


FUNCS: dict[str, Callable[[Ctx], None]] = {
    "drain": s_drain,
    "release-old": s_release_old,
    "remove-old": shared.s_remove_old,
    "wait-new": shared.s_wait_new,
    "identify-new": shared.s_identify_new,
    "layout-new": s_layout_new,
    "rebuild": s_rebuild,
    "verify": s_verify,
    "warm": lambda c: shared.warm_step(c, [c.j.cset]),
}


def done_line(j: Journal) -> str:
    return f"{j.id}: done; dm-cache {j.cset} caches on {j.new.get('node')}"


KIND = Kind(
    STEPS, FUNCS, POINT_OF_NO_RETURN, _rollback, head, "dm-cache device",
    name="dm-cache device", tag="dm", tag_chars=None,
    stays_up="The dm-cache device stays up (a linear table over its origin while the SSD "
             "is out).",
    undoes="Put the cache back on the old SSD's areas with its old table (cold: the "
           "metadata is zeroed), or its table back if the drain stopped half-way.",
    done_line=done_line, interim_mode=False,
    claims=claims,
    names_run=lambda j, spec: spec.removeprefix("/dev/mapper/") == j.cset,
    plan=plan_claimed,
    json=lambda j: {"dm_name": j.cset, "dm": j.dm},
    run_keys=lambda cache, backings, lvs: {keys.dmcache_key(cache)},
    vm_nodes=lambda j, snap: {f"/dev/mapper/{j.cset}"})
