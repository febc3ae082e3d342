"""The IO scheduler command: ``cachemgr scheduler [DEVICE [NAME]]`` (and the policy's and the
bench's scheduler changes, which go through :func:`set_scheduler` and
:func:`cachemgr.backends.scheduler.set_scheduler`).

DEVICE is what an admin has at hand: ``/dev/sdb``, ``sdb``, ``/dev/nvme0n1``, a
``/dev/disk/by-id`` link, ``/dev/mapper/NAME``; a partition stands for its disk (the scheduler
is the disk's). A bio-based device (bcache, device-mapper) is shown with the disks under it,
and a change on it is refused naming them."""

from __future__ import annotations

import os
from typing import Any

from cachemgr.backends import scheduler as sched
from cachemgr.core import checks
from cachemgr.core.errors import UsageError, require_root
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import gate
from cachemgr.ops.control import Result


def kernel_name(sysfs: Sysfs, device: str) -> str:
    """The kernel name DEVICE stands for (a node, a link or a bare name); UsageError when it
    is no block device."""
    checks.plain_text(device, "device")
    d = device.strip()
    if not d:
        raise UsageError("empty device name")
    if "/" not in d:
        return sched.check_device_name(d)
    if os.path.exists(d):
        name = sysfs.block_name_of(d)
        if name is None:
            if sysfs.live:
                raise UsageError(f"{d} is not a block device")
            name = os.path.basename(os.path.realpath(d))
        return sched.check_device_name(name)
    parent, base = os.path.split(d)
    if parent == "/dev" and not sysfs.live:
        return sched.check_device_name(base)  # a captured tree: /dev/NAME names NAME
    raise UsageError(f"{d}: no such device",
                     hint="cachemgr scheduler lists the disks and their schedulers")


def resolve(sysfs: Sysfs, device: str) -> tuple[str, list[str]]:
    """(whole disk, notes): a partition becomes its disk, with a note saying so."""
    disk, part = sched.whole_disk(sysfs, kernel_name(sysfs, device))
    notes = [f"cachemgr: {part} is a partition of {disk}: the IO scheduler is the disk's"] \
        if part else []
    return disk, notes


def entry(sysfs: Sysfs, name: str, users: dict[str, list[str]] | None = None
          ) -> dict[str, Any]:
    """One device of ``scheduler --json`` (docs/json.md)."""
    q = sched.read(sysfs, name)
    u = users if users is not None else sched.users(sysfs)
    return {
        "device": f"/dev/{name}",
        "name": name,
        "label": sched.label(sysfs, name),
        "request_based": q.request_based,
        "scheduler": q.current,
        "available": list(q.available),
        "tunables": dict(q.tunables),
        "disks": [] if q.request_based else list(sched.disks_under(sysfs, name)),
        "used_by": u.get(name, []),
    }


def _table(rows: list[dict[str, Any]]) -> list[str]:
    head = ("DEVICE", "SCHEDULER", "AVAILABLE", "USED BY")
    body = []
    for e in rows:
        if e["request_based"]:
            body.append((e["name"], e["scheduler"], " ".join(e["available"]),
                         ", ".join(e["used_by"]) or "-"))
        else:
            disks = ", ".join(e["disks"]) or "none found"
            body.append((e["label"], "-", f"bio-based: set it on {disks}", "-"))
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(3)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)), r[3]])
            .rstrip() for r in [head, *body]]


def _detail(sysfs: Sysfs, e: dict[str, Any]) -> list[str]:
    if not e["request_based"]:
        under = [f"{d} ({sched.read(sysfs, d).current})" for d in e["disks"]]
        return [f"{e['label']}: bio-based, no IO scheduler of its own",
                "its IO is scheduled on: " + (", ".join(under) or "no disk found under it")]
    lines = [f"/dev/{e['name']}: IO scheduler {e['scheduler']}",
             f"available: {' '.join(e['available'])} (a scheduler built as a module is "
             "listed once loaded; naming it loads it)"]
    if e["tunables"]:
        lines.append(f"tunables (queue/iosched, {e['scheduler']}):")
        w = max(len(k) for k in e["tunables"])
        lines += [f"  {k.ljust(w)}  {v}" for k, v in e["tunables"].items()]
    else:
        lines.append("tunables: none")
    lines.append(f"used by: {', '.join(e['used_by']) or '-'}")
    return lines


def show(sysfs: Sysfs, device: str | None = None) -> Result:
    """Every listed device's scheduler (DEVICE None), or one disk's with its tunables."""
    users = sched.users(sysfs)
    if device is None:
        rows = [entry(sysfs, n, users) for n in sched.listed(sysfs)]
        return Result(lines=_table(rows), data={"schema": 1, "devices": rows})
    name, notes = resolve(sysfs, device)
    e = entry(sysfs, name, users)
    return Result(lines=_detail(sysfs, e), notes=notes, data={"schema": 1, "devices": [e]})


def set_scheduler(sysfs: Sysfs, device: str, name: str) -> Result:
    """Set DEVICE's (its disk's) IO scheduler to ``name``: exit 4 when it already is, 2 for
    a bio-based device (naming the disks under it) or a scheduler the kernel does not have.
    Checked before root is asked for; read back from sysfs after the write."""
    word = sched.check_name(name)
    disk, notes = resolve(sysfs, device)
    q = sched.read(sysfs, disk)
    if q.request_based and q.current != word:
        require_root("setting an IO scheduler")
    # the gate: a bench's hygiene or another scheduler set on this disk is refused
    with gate.gate(gate.of_disks([f"/dev/{disk}"]), "scheduler", detail={"to": word}):
        change = sched.set_scheduler(sysfs, disk, word)  # refusals, the write, the read-back
    return Result(changes=[change], notes=notes)
