# -*- coding: utf-8 -*-
# Copyright: cachemgr developers
# GNU General Public License v2.0 or later, so also under v3.0+ (see LICENSE in the project)
# SPDX-License-Identifier: GPL-2.0-or-later
"""Run the cachemgr CLI and read its JSON (schema 1, docs/json.md), and find the device a task
names the way the CLI does. Exit codes: 0 done, 1 failed, 2 bad usage, 3 refused as unsafe,
4 already so, 5 timed out."""

from __future__ import annotations

import json
import os

ALREADY = 4

COMMON_ARGS = {"cachemgr_bin": {"type": "str", "default": "cachemgr"}}

# the cache modes each kind has (cachemgr's bcache.BCACHE_MODES, dmcache DM_CACHE_MODES, lvm2's
# --cachemode); a dm-writecache is always writeback
MODES_OF_KIND = {
    "bcache": ("writethrough", "writeback", "writearound", "none"),
    "dm-cache": ("writethrough", "writeback", "passthrough"),
    "dm-writecache": ("writeback",),
}


def run_json(module, args, allow_already=True):
    """(exit code, the JSON document or None); a failure fails the task with the CLI's
    words. ``allow_already``: exit 4 (already so) is an answer, not a failure."""
    argv = [module.params["cachemgr_bin"]] + list(args)
    rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    if rc == ALREADY and allow_already:
        return rc, None
    if rc != 0:
        module.fail_json(msg="cachemgr failed (exit %d): %s" % (rc, err.strip()), rc=rc,
                         cmd=argv, stderr=err, stdout=out)
    try:
        return rc, json.loads(out) if out.strip() else None
    except ValueError as exc:
        module.fail_json(msg="cachemgr printed no JSON: %s" % exc, cmd=argv, stdout=out)
    return rc, None  # not reached: fail_json exits


def status(module):
    """``cachemgr status --json --no-vms`` (the modules never need libvirt's view)."""
    doc = run_json(module, ["status", "--json", "--no-vms"], allow_already=False)[1]
    return doc or {}


def _node(path):
    """The device node a /dev path leads to (by-id, by-uuid, /dev/VG/LV and /dev/mapper links
    followed); None for anything else or a path that is not there."""
    if not path or not path.startswith("/dev/") or not os.path.exists(path):
        return None
    return os.path.realpath(path)


def names_of(dev):
    """Every spelling the CLI takes for this device (docs/cli.md, TARGET)."""
    names = {dev.get("device"), dev.get("by_uuid"), dev.get("backing_uuid"), dev.get("dm_uuid")}
    if dev.get("kind") == "bcache":
        names.add(dev.get("backing"))  # a dm device's origin is not a name for it
    if dev.get("name"):
        names.update((dev["name"], "/dev/mapper/" + dev["name"]))
    lvm = dev.get("lvm") or {}
    if lvm.get("name"):
        names.update((lvm["name"], "/dev/" + lvm["name"], lvm.get("lv_uuid")))
    names.discard(None)
    names.discard("")
    return names


def find_device(module, doc, target):
    """The device of ``cachemgr status --json`` that ``target`` names: any spelling the CLI
    takes, and any link to the same node (/dev/disk/by-id/..., /dev/VG/LV). Fails the task
    when it names none, or more than one."""
    target = target.strip()
    devices = doc.get("devices", [])
    found = [d for d in devices if target in names_of(d)]
    node = _node(target)
    if not found and node is not None:
        found = [d for d in devices if node in {_node(n) for n in names_of(d)}]
    if not found:
        module.fail_json(msg="%s is not a cached device on this host (cachemgr status lists "
                             "them)" % target)
    if len(found) > 1:
        module.fail_json(msg="%s names %d cached devices: %s" % (
            target, len(found), ", ".join(str(d.get("device")) for d in found)))
    return found[0]


def cli_target(dev):
    """The name to hand the CLI for ``dev``: the one it reported (an LV by VG/LV; a stopped
    bcache device, whose /dev/bcacheN is gone, by its backing device)."""
    lvm = dev.get("lvm") or {}
    return lvm.get("name") or dev.get("device") or dev.get("backing")


def kind_of(dev):
    """The kind whose modes apply: bcache, dm-cache (LVM's cache too) or dm-writecache."""
    return dev.get("kind") or "bcache"


def diff(module, before, after):
    """The ``diff`` result (``--diff``), as lines of ``key: value``."""
    if not module._diff:
        return {}

    def text(d):
        return "".join("%s: %s\n" % (k, d[k]) for k in sorted(d))
    return {"diff": {"before": text(before), "after": text(after)}}
