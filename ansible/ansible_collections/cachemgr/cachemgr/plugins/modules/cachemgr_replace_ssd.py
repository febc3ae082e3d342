#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: cachemgr developers
# GNU General Public License v2.0 or later, so also under v3.0+ (see LICENSE in the project)
# SPDX-License-Identifier: GPL-2.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: cachemgr_replace_ssd
short_description: Replace a cache SSD safely (cachemgr replace-ssd --yes)
description:
  - Runs the journaled replacement of the SSD under a bcache cache set, an LVM cache or a
    plain dm-cache device, on a SCSI or an NVMe SSD.
  - Keyed by the cache. If an earlier run on this cache stopped (a crash, a lost
    connection), that run is resumed instead of planning a new one; runs on other caches
    are left alone.
  - Not a change when the SSD in place is already the wanted one, that is when the newest
    run on this cache is done, the SSD it put in still caches it, and that SSD is the one
    O(new) names (V(same) and V(any) take whichever disk the run put in). To replace the same
    cache's SSD again later, name the new disk in O(new).
  - Use C(serial) in the play to go host by host (the collection's
    C(cachemgr.cachemgr.replace_ssd) playbook does).
version_added: "0.1.0"
extends_documentation_fragment:
  - cachemgr.cachemgr.cachemgr
  - cachemgr.cachemgr.cachemgr.changes
author:
  - cachemgr developers (@cachemgr)
options:
  cache:
    description:
      - The cache, any way C(cachemgr replace-ssd) takes it - its SSD (a /dev/disk/by-id link
        works), its cset UUID, a cached LV (C(VG/LV)) or a dm-cache device.
      - A run is found by the old SSD's WWID too, so a by-id C(wwn-) link still names the
        cache once that SSD is gone.
    type: str
    required: true
  new:
    description:
      - V(same) (the old SSD re-inserted), V(any) (the disk an operator puts in its slot), or
        the new disk (/dev/..., C(wwn:...), C(serial:...), H:C:T:L, a PCI address).
    type: str
    default: same
attributes:
  check_mode:
    description: Runs in check mode and tells whether it would change anything.
    support: full
    details: Prints the plan (C(replace-ssd --dry-run)) or names the run it would resume.
"""

EXAMPLES = r"""
- name: Replace the cache SSD named by its stable link, with the disk put in its slot
  cachemgr.cachemgr.cachemgr_replace_ssd:
    cache: /dev/disk/by-id/wwn-0x5000c500a1b2c3d4
    new: any

- name: Rebuild an LVM cache on a named NVMe disk
  cachemgr.cachemgr.cachemgr_replace_ssd:
    cache: vg0/vm1
    new: /dev/disk/by-id/nvme-eui.0025388b71b2c3d4
"""

RETURN = r"""
resume:
  description: The id of the unfinished run resumed (or, in check mode, to be resumed).
  returned: when an unfinished run on this cache was found
  type: str
  sample: 20261123-001502-vg0-vm1
plan:
  description: The plan's lines (C(replace-ssd --dry-run)).
  returned: in check mode, when a new run would start
  type: list
  elements: str
done:
  description: The id of the finished run that makes the task already so.
  returned: when not changed
  type: str
result:
  description: The run as C(cachemgr replace-ssd --json) prints it.
  returned: when changed and not in check mode
  type: dict
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cachemgr.cachemgr.plugins.module_utils.cachemgr_cli import (
    COMMON_ARGS,
    diff,
    names_of,
    run_json,
    status,
)

WWN_LINK = re.compile(r"^/dev/disk/by-id/wwn-(0x[0-9a-fA-F]+)$")


def _real(path):
    return os.path.realpath(path) if path and path.startswith("/dev/") else path


def _same_disk(disk, node):
    """``node`` (a cache device: a disk or one of its partitions) lies on ``disk``."""
    if not disk or not node:
        return False
    disk, node = _real(disk), _real(node)
    if node == disk:
        return True
    # partitions: sdc1 on sdc; nvme0n1p1 on nvme0n1 (a name ending in a digit takes a p)
    part = r"^p[0-9]+$" if disk[-1:].isdigit() else r"^[0-9]+$"
    return node.startswith(disk) and re.match(part, node[len(disk):]) is not None


def specs_of(cache):
    """The spellings to ask ``replace-ssd --list`` with: as given, and a by-id wwn link as
    ``wwn:`` (the journal remembers the old SSD's WWID, not its links)."""
    m = WWN_LINK.match(cache.strip())
    return [cache] + (["wwn:" + m.group(1)] if m else [])


def in_place(doc, run):
    """The SSD ``run`` put in still caches its cache."""
    new = run.get("new") or {}
    if run.get("kind") == "bcache":
        return bool(new.get("cset")) and any(
            c.get("uuid") == new["cset"] for c in doc.get("caches", []))
    name = run.get("lv") or run.get("dm_name")
    for dev in doc.get("devices", []):
        if name in names_of(dev):
            lvm = dev.get("lvm") or {}
            nodes = lvm.get("cache_pvs") or [dev.get("cache")]
            return any(_same_disk(new.get("node"), n) for n in nodes)
    return False


def names_new(run, want):
    """``want`` (the task's O(new)) is the disk ``run`` put in."""
    new = run.get("new") or {}
    if want in ("same", "any"):
        return True
    if want.startswith("/dev/"):
        return _same_disk(new.get("node"), want) and _same_disk(want, new.get("node"))
    if want.startswith("wwn:"):
        hexa = want[4:].lower().removeprefix("0x")
        return bool(hexa) and str(new.get("wwid") or "").lower().endswith(hexa)
    if want.startswith("serial:"):
        return want[7:] == new.get("serial")
    return want in (new.get("slot"), new.get("hctl"))


def ssd_diff(module, run, p):
    """The SSD under the cache before and after (the run's old SSD, the new one asked for)."""
    return diff(module, {"ssd": (run.get("old") or {}).get("node")},
                {"ssd": (run.get("new") or {}).get("node") or p["new"]})


def main() -> None:
    spec = dict(COMMON_ARGS)
    spec.update(cache={"type": "str", "required": True},
                new={"type": "str", "default": "same"})
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    runs = {}
    for s in specs_of(p["cache"]):
        doc = run_json(module, ["replace-ssd", s, "--list", "--json"], allow_already=False)[1]
        runs.update((r["id"], r) for r in (doc or {}).get("runs", []))
    ordered = [runs[k] for k in sorted(runs)]  # ids begin with the time they started
    pending = [r for r in ordered if r["status"] in ("running", "failed")]
    if pending:
        rid = pending[-1]["id"]
        changed_diff = diff(module, {"run": "%s %s" % (rid, pending[-1]["status"])},
                            {"run": "%s done" % rid})
        if module.check_mode:
            module.exit_json(changed=True, resume=rid, **changed_diff)
        res = run_json(module, ["replace-ssd", "--resume", rid, "--json"])[1]
        module.exit_json(changed=True, resume=rid, result=res, **changed_diff)
    last = ordered[-1] if ordered else None
    if last and last["status"] == "done" and names_new(last, p["new"]) \
            and in_place(status(module), last):
        module.exit_json(changed=False, done=last["id"])
    if module.check_mode:
        plan = run_json(module, ["replace-ssd", p["cache"], "--new", p["new"], "--dry-run",
                                 "--json"], allow_already=False)[1] or {}
        module.exit_json(changed=True, plan=plan.get("plan"), **ssd_diff(module, plan, p))
    res = run_json(module, ["replace-ssd", p["cache"], "--new", p["new"], "--yes", "--json"],
                   allow_already=False)[1] or {}
    module.exit_json(changed=True, result=res, **ssd_diff(module, res, p))


if __name__ == "__main__":
    main()
