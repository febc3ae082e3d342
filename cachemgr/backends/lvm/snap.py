"""LVM snapshots of an origin LV (lvcreate --snapshot), through the one lvm2 wrapper
(backends/lvm/command.py).

A thick snapshot needs room for its copy-on-write area (``-L SIZE``, or ``-l 100%ORIGIN``:
never overflows); a snapshot of a thin LV takes no size (lvcreate(8), "Create a thin
snapshot"). lvcreate suspends the origin while it loads the snapshot's tables: what the
origin holds at that moment is what the snapshot holds.
"""

from __future__ import annotations

import json
import os

from cachemgr.backends.lvm.command import _NAME, check_vg_lv, lvm
from cachemgr.core.errors import KernelFormatError, UsageError


def check_name(name: str) -> str:
    if not _NAME.match(name) or name in (".", "..") or name.startswith(("snapshot", "pvmove")):
        raise UsageError(f"{name!r} is not a name lvm2 takes for a new LV",
                         hint="letters, digits and + _ . - (lvm(8), 'VALID NAMES'); not "
                              "starting with - or 'snapshot'")
    return name


def lv_node(vg_lv: str) -> str:
    vg, lv = check_vg_lv(vg_lv)
    return f"/dev/{vg}/{lv}"


def same_device(vg_lv: str, node: str) -> bool:
    """Whether the active LV ``vg_lv`` is the block device ``node`` (their device numbers:
    an LV has several names, /dev/VG/LV, /dev/mapper/VG-LV, /dev/dm-N)."""
    try:
        a, b = os.stat(lv_node(vg_lv)), os.stat(node)
    except OSError:
        return False
    return a.st_rdev == b.st_rdev and a.st_rdev != 0


def segtype(vg_lv: str) -> str | None:
    """The LV's segment type (``linear``, ``striped``, ``thin``...); None when lvm2 does
    not know the LV."""
    check_vg_lv(vg_lv)
    out = lvm("lvs", "--reportformat", "json", "-o", "segtype", "--", vg_lv, check=False)
    if out.returncode != 0:
        return None
    try:
        rows = json.loads(out.stdout)["report"][0]["lv"]
        return str(rows[0]["segtype"]) if rows else None
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise KernelFormatError("lvs --reportformat json -o segtype", out.stdout[:2000]) \
            from None


def exists(vg_lv: str) -> bool:
    check_vg_lv(vg_lv)
    return lvm("lvs", "--", vg_lv, check=False).returncode == 0


def create(origin: str, name: str, *, size: str | None = None, thin: bool = False) -> str:
    """``lvcreate --snapshot`` of ``origin`` (VG/LV) named ``name``; its VG/LV. ``size``:
    the copy-on-write area (lvm2's size words: ``1G``, ``20%ORIGIN``...); none for a thin
    origin; 100%ORIGIN otherwise."""
    vg, _ = check_vg_lv(origin)
    check_name(name)
    if thin and size is None:
        room: list[str] = []
    elif size is not None and "%" in size:
        room = ["-l", size]
    elif size is not None:
        room = ["-L", size]
    else:
        room = ["-l", "100%ORIGIN"]
    lvm("lvcreate", "-y", "--snapshot", "-n", name, *room, "--", origin, timeout=300)
    return f"{vg}/{name}"
