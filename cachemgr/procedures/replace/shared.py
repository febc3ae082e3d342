"""What every kind of replacement shares: the old SSD and the new one. At plan time, the SSD
as a disk that can be pulled (a SCSI disk or an NVMe namespace, nothing else on it or on its
controller) and found again (its WWID or serial), and a ``--new`` that can finish; in the
run, the steps remove-old, wait-new and identify-new (each kind lists them among its own),
the new SSD found again at every later step, the refusal of a wrong new disk, and a drain's
progress in words."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cachemgr.backends import bcache, hotplug, signatures
from cachemgr.backends.identity import looks_like_wwn, normalize_wwn
from cachemgr.core import runner
from cachemgr.core.errors import CacheMgrError, UnsafeError, UsageError
from cachemgr.core.model import DrainProgress, Size
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures.replace.base import Ctx, Say

# bcache refuses a cache with fewer buckets ("ca->sb.nbuckets is too small", 7.2 lab).
MIN_BUCKETS = 1024


# --------------------------------------------------------------------------------- planning


NEW_HINT = ("--new same (the old SSD re-inserted), any (the disk an operator puts in its slot), "
            "/dev/sdX or /dev/nvmeXnY (a disk that is there now), wwn:WWN, serial:SERIAL, "
            "H:C:T:L (a SCSI slot) or a PCI address (an NVMe slot)")


def hotplug_disk(sysfs: Sysfs, name: str, node: str) -> hotplug.Disk:
    """The SCSI disk or NVMe namespace the cache SSD ``name`` is; UsageError (exit 2) for
    any other device: replace-ssd pulls and re-inserts only those."""
    try:
        return hotplug.disk(sysfs, name)
    except CacheMgrError as exc:
        raise UsageError(f"{node} is neither a SCSI disk nor an NVMe namespace; replace-ssd "
                         "removes and re-inserts only those", hint=exc.hint) from exc


def refuse_unpullable(sysfs: Sysfs, disk: hotplug.Disk, member: str | None) -> None:
    """Refuse (exit 3, at plan time) an SSD that could not be pulled once its cache is
    released: another use of it or of its partitions (a mounted file system, swap, a
    holder), an NVMe controller that is not a PCIe function or carries another namespace.
    ``member``: the cache device (the disk or a partition); None: every use of the disk is
    the cache's (an LVM PV), only its controller is checked."""
    why = hotplug.removal_refusals_besides(sysfs, disk, member)
    if why:
        raise UnsafeError(f"{disk.node} could not be pulled after its cache is released: "
                          + "; ".join(why),
                          hint="replace-ssd takes out the whole disk (NVMe: the whole "
                               "controller); move what else lives on it first")


def old_match(old: hotplug.Disk | dict[str, Any]) -> hotplug.Match:
    """How the old SSD is found again after its cache set is gone (wipe-old, remove-old,
    --new same): its WWID, else its serial. Neither: refused (exit 3), as nothing would
    tell it from another disk once it is removed; no step is skipped for want of one."""
    wwid: str | None
    serial: str | None
    if not isinstance(old, dict):
        wwid, serial, node = old.wwid, old.serial, old.node
    else:
        wwid, serial, node = old.get("wwid"), old.get("serial"), str(old.get("node"))
    if wwid:
        return hotplug.Match("wwn", normalize_wwn(wwid) or wwid)
    if serial:
        return hotplug.Match("serial", serial)
    raise UnsafeError(f"{node} has neither a WWID nor a serial number: after its cache set is "
                      "gone nothing would tell it from another disk, so replace-ssd could not "
                      "find it again to wipe, remove or re-insert it",
                      hint="replace this SSD by hand (docs/admin-guide.md, the runbook)")


def new_match(new: str) -> hotplug.Match | None:
    """What ``--new`` names: None for same, any and /dev paths (checked apart), else the
    DiskMatch the new disk is waited for by. UsageError (exit 2) for a value that can never
    name a disk (empty, ``wwn:`` or ``serial:`` with nothing after, a wwn: that is no WWN)."""
    if new in ("same", "any") or new.startswith("/dev/"):
        return None
    t = new.strip()
    if not t:
        raise UsageError("--new is empty", hint=NEW_HINT)
    for prefix in ("wwn:", "serial:"):
        if t.lower().startswith(prefix):
            value = t[len(prefix):].strip()
            if not value:
                raise UsageError(f"--new {new} names no {prefix[:-1]}", hint=NEW_HINT)
            if prefix == "serial:":
                return hotplug.Match("serial", value)
            if not looks_like_wwn(value):
                raise UsageError(f"--new {new}: {value!r} is not a WWN (naa.…, eui.…, 0x…, "
                                 "t10.…, nvme.…)", hint=NEW_HINT)
            return hotplug.Match("wwn", normalize_wwn(value) or value)
    return hotplug.Match.parse(t)


def check_new_spec(sysfs: Sysfs, new: str, old: hotplug.Disk, cset: str,
                    bucket: int | None, need_bytes: int | None = None) -> None:
    """Refuse at plan time a --new that cannot finish: one that names nothing, the old SSD
    (but for same/any), several disks, or a disk there now that identify-new would refuse."""
    if new in ("same", "any"):
        return
    if new.startswith("/dev/"):
        name = _block_name(sysfs, new)
        if name is None:
            raise UsageError(f"--new {new}: no such block device",
                             hint="a /dev path must name a disk that is there now (kernel "
                                  "names change as disks come and go); for a disk not inserted "
                                  "yet use --new wwn:WWN, serial:SERIAL or any")
        if name == old.name:
            raise UsageError(f"--new {new} is the SSD being replaced",
                             hint="use --new same to re-insert the same SSD")
        try:
            disk = hotplug.disk(sysfs, name)
        except CacheMgrError as exc:
            raise UsageError(f"--new {new}: {exc.message}", hint=NEW_HINT) from None
        refuse_new_disk(sysfs, disk, same=False, old=_old_dict(old), cset=cset, bucket=bucket,
                        probe=sysfs.live, need_bytes=need_bytes)
        return
    match = new_match(new)
    assert match is not None
    found = hotplug.find(sysfs, match)
    if match.kind == "slot":  # the old SSD's slot: it is there until remove-old
        found = [d for d in found if d.name != old.name]
    if len(found) > 1:
        raise UsageError(f"--new {new} matches {len(found)} disks: "
                         + "; ".join(d.describe() for d in found), hint=NEW_HINT)
    if found:
        if found[0].name == old.name:
            raise UsageError(f"--new {new} is the SSD being replaced ({old.describe()})",
                             hint="use --new same to re-insert the same SSD")
        refuse_new_disk(sysfs, found[0], same=False, old=_old_dict(old), cset=cset,
                        bucket=bucket, probe=sysfs.live, need_bytes=need_bytes)


def _block_name(sysfs: Sysfs, path: str) -> str | None:
    """The kernel name of /dev path ``path``: /dev/NAME of a block device in sysfs is its
    node (devtmpfs; as the target resolvers, so a captured tree answers too), any other
    path by its major:minor."""
    base = path.removeprefix("/dev/")
    if "/" not in base and base in sysfs.block_names():
        return base
    return sysfs.block_name_of(path)


def _old_dict(d: hotplug.Disk) -> dict[str, Any]:
    return {"wwid": d.wwid, "serial": d.serial, "size_bytes": d.size_bytes}


def refuse_new_disk(sysfs: Sysfs, d: hotplug.Disk, *, same: bool, old: dict[str, Any],
                    cset: str, bucket: int | None, probe: bool = True,
                    need_bytes: int | None = None) -> None:
    """Refuse (exit 3) a disk that must not become the new cache: the old SSD when a new one
    was asked for, a disk in use, one carrying a signature (but for the old SSD's own
    bcache one when it is re-inserted), or one too small. At plan time and at identify-new.
    ``probe``: read its signatures (wipefs, bcache-super-show on its /dev node).
    ``need_bytes``: the size an LVM cache needs (else a bcache cache's bucket count)."""
    old_serial, old_wwid = old.get("serial"), old.get("wwid")
    if not same and ((old_wwid and d.wwid == old_wwid)
                     or (old_serial and d.serial == old_serial)):
        raise UnsafeError(f"{d.describe()} is the old SSD, but a new one was asked for",
                          hint="insert the new SSD, or use --new same to reuse the old one")
    reasons = hotplug.in_use(sysfs, d)
    if reasons:
        raise UnsafeError(f"{d.node} is in use: {'; '.join(reasons)}; refusing it as the new "
                          "cache")
    if probe:
        sig = signatures.first(d.node)
        if sig is not None and not (same and sig == "bcache"):
            raise UnsafeError(f"{d.node} carries a {sig} signature; refusing to format it",
                              hint="check it is the right disk; wipe it deliberately "
                                   "(wipefs -a)")
        if sig == "bcache" and same:
            sb = super_fields(d.node)
            if sb.get("cset.uuid") not in (None, cset):
                raise UnsafeError(f"{d.node} belongs to another cache set "
                                  f"{sb.get('cset.uuid')}")
    if need_bytes is not None:
        if d.size_bytes is None or d.size_bytes < need_bytes:
            raise UnsafeError(f"{d.node} ({d.size_bytes} bytes) is too small for the cache "
                              f"(it needs {need_bytes} bytes)")
        return
    bucket = int(bucket or 512 * 1024)
    if d.size_bytes is None or d.size_bytes < MIN_BUCKETS * bucket:
        raise UnsafeError(f"{d.node} ({d.size_bytes} bytes) is too small for a bcache cache "
                          f"with {bucket}-byte buckets (needs {MIN_BUCKETS} buckets)")


# --------------------------------------------------------------------------------- words


def ssd_words(old: dict[str, Any]) -> str:
    """The old SSD of a journal, for the plan's head: node, slot, identity."""
    return (f"{old['node']} ({hotplug.slot_words(old)}; {old['wwid']}, serial "
            f"{old['serial']})")


def drain_reporter(say: Say) -> Callable[[DrainProgress], None]:
    """A drain's progress callback that says the dirty amount and ETA every 2 s at most."""
    last = [0.0]

    def report(p: DrainProgress) -> None:
        if time.monotonic() - last[0] >= 2:
            last[0] = time.monotonic()
            say(f"drain {p.device}: dirty {Size.exact(p.dirty_bytes or 0)}"
                + (f", ETA {p.eta_s:.0f} s" if p.eta_s is not None else ""))

    return report


# --------------------------------------------------------------------------------- steps


def old_present(c: Ctx) -> hotplug.Disk | None:
    """The old SSD, if it is there now (found by :func:`old_match`)."""
    match = old_match(c.j.old)
    found = hotplug.find(c.sysfs, match)
    if len(found) > 1:
        raise UnsafeError(f"{len(found)} disks have the old SSD's {match}: "
                          + "; ".join(d.describe() for d in found),
                          hint="remove the one that is not the old SSD, then resume")
    return found[0] if found else None


def s_remove_old(c: Ctx) -> None:
    d = old_present(c)
    if d is None:
        c.say(f"the old SSD ({old_match(c.j.old)}) is not there any more: already removed")
        return
    # where it sits now (a SCSI address, a PCI function) is where its replacement is looked for
    bucket = c.j.old.get("bucket")
    c.j.old.update(hotplug.record(d), bucket=bucket)
    c.j.save()
    r = hotplug.remove(c.sysfs, d)
    c.say(f"{d.node} ({hotplug.where(d)}): {r.how}")


def wait_new_match(c: Ctx) -> hotplug.Match:
    """What wait-new waits for."""
    new = c.opts.new
    if new == "any":
        return hotplug.Match("slot", str(c.j.old.get("slot") or c.j.old["hctl"]))
    m = old_match(c.j.old) if new == "same" else new_match(new)
    assert m is not None
    return m


def find_new(c: Ctx) -> hotplug.Disk | None:
    """The new SSD, if it is there now: by the WWID identify-new recorded, else as --new
    names it."""
    if c.j.new.get("wwid"):
        want = c.j.new["wwid"]
        return next((d for d in hotplug.disks(c.sysfs) if d.wwid == want), None)
    new = c.opts.new
    if new.startswith("/dev/"):
        name = _block_name(c.sysfs, new)
        if name:
            try:
                return hotplug.disk(c.sysfs, name)
            except CacheMgrError as exc:
                raise UsageError(f"--new {new}: {exc.message}") from None
        return None
    found = hotplug.find(c.sysfs, wait_new_match(c))
    if len(found) > 1:
        raise UnsafeError(f"{len(found)} disks match --new {new}: "
                          + "; ".join(d.describe() for d in found),
                          hint="remove the ones that are not the new SSD, then resume")
    return found[0] if found else None


def s_wait_new(c: Ctx) -> None:
    if find_new(c) is not None:
        return
    if c.opts.new != "same" and not c.opts.yes:
        c.prompt(f"Insert the new SSD (slot of the old one: {hotplug.slot_words(c.j.old)}), "
                 "then press Enter")
    c.say(hotplug.rescan(c.sysfs, c.j.old))
    if c.opts.new.startswith("/dev/"):
        if not bcache.wait_for(lambda: find_new(c) is not None, c.opts.wait_timeout, 0.2):
            raise CacheMgrError(f"{c.opts.new} did not appear within {c.opts.wait_timeout:g} s")
        return
    d = hotplug.wait_for(c.sysfs, wait_new_match(c), c.opts.wait_timeout)
    c.say(f"found {d.describe()}")


def new_disk(c: Ctx) -> hotplug.Disk:
    """The new SSD, found as :func:`find_new` does; CacheMgrError if it is gone."""
    d = find_new(c)
    if d is None:
        raise CacheMgrError("the new SSD is not there any more",
                            hint=f"insert it and resume: cachemgr replace-ssd --resume {c.j.id}")
    return d


def s_identify_new(c: Ctx) -> None:
    d = new_disk(c)
    if c.j.new.get("wwid") == d.wwid and c.j.new.get("checked"):
        return
    refuse_new_disk(c.sysfs, d, same=c.opts.new == "same", old=c.j.old, cset=c.j.cset,
                    bucket=c.j.old.get("bucket"),
                    need_bytes=(c.j.lvm or c.j.dm).get("need_bytes"))
    if c.j.old.get("size_bytes") and d.size_bytes < c.j.old["size_bytes"]:
        c.say(f"note: {d.node} is smaller than the old SSD ({d.size_bytes} < "
              f"{c.j.old['size_bytes']} bytes)")
    c.j.new.update({**hotplug.record(d), "checked": True})
    c.j.save()
    c.say(f"new SSD: {d.describe()}")


def super_fields(node: str) -> dict[str, str]:
    """bcache-super-show's fields of ``node`` ({} when it shows none)."""
    out = runner.run(["bcache-super-show", node], check=False, timeout=30).stdout
    fields = {}
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            fields[parts[0]] = parts[1].strip()
    return fields


# --------------------------------------------------------------------------------- warming


def warm_step(c: Ctx, targets: list[str]) -> None:
    """The last step: ``cachemgr warm`` of each of ``targets`` (the cached devices of the
    run) that the ``--warm`` trace recorded, the cache's capacity shared between them. Its
    settings are journaled in an undo journal as warm's own are (core/undo.py): a run killed
    here is resumed by ``--resume``, whose gate puts them back first, and the step reads the
    hot blocks again (what is already in the cache hits)."""
    from cachemgr.backends import snapshot
    from cachemgr.procedures import kinds, warm
    from cachemgr.procedures import trace as tr

    path = c.opts.warm
    if not path:
        c.say("warm: skipped (no --warm trace)")
        return
    trace = tr.read(path)
    snap = snapshot.take(c.sysfs)
    found = []
    for t in targets:
        k = kinds.find(snap, t, c.sysfs, kinds.devices_only())
        if k is None:
            raise CacheMgrError(f"warm: {t} is not a cached device any more")
        below = k.warm_trace_below(c.sysfs)  # a bcache device's backing device
        names = k.warm_trace_names() | (below[0] if below is not None else set())
        if trace.header.devices and any(d.name in names or d.path in names
                                        for d in trace.header.devices):
            found.append(k)
        else:
            c.say(f"warm: the trace has no IO of {k.node}: it stays cold")
    if not found:
        raise UsageError(f"warm: the trace {path} is of none of the run's devices ("
                         + ", ".join(targets) + ")",
                         hint="record them with cachemgr trace, or resume without warming: "
                              "cachemgr warm can run later on its own")
    for k in found:
        p = warm.prepare(c.sysfs, k, trace, share=len(found))
        w = warm.run(c.sysfs, p, progress=lambda m: c.say(str(m)))
        for line in warm.summary(p, w):
            c.say(line)
