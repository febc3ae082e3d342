#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: cachemgr developers
# GNU General Public License v2.0 or later, so also under v3.0+ (see LICENSE in the project)
# SPDX-License-Identifier: GPL-2.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: cachemgr_mode
short_description: Ensure the cache mode of a cached device (bcache, dm-cache, LVM cache)
description:
  - Switches the cache mode with C(cachemgr mode); a device already in that mode is not a
    change (nothing is run).
  - The device is found by any name C(cachemgr) takes for it, and by any link to the same
    node, so C(/dev/disk/by-id/...) links, C(/dev/bcache/by-uuid/...), C(VG/LV) and
    C(/dev/VG/LV) all work.
  - Each kind has its own modes. bcache has V(writethrough), V(writeback), V(writearound)
    and V(none); dm-cache and LVM caches have V(writeback), V(writethrough) and
    V(passthrough) (no V(none)); a dm-writecache is always V(writeback). Any other mode for
    the device's kind fails the task, in check mode too.
version_added: "0.1.0"
extends_documentation_fragment:
  - cachemgr.cachemgr.cachemgr
  - cachemgr.cachemgr.cachemgr.changes
author:
  - cachemgr developers (@cachemgr)
options:
  device:
    description:
      - The cached device, any way C(cachemgr mode) takes it, or a link to it.
      - /dev/bcacheN, its backing device or backing UUID, /dev/mapper/NAME, the dm name,
        C(VG/LV) or C(/dev/VG/LV), a /dev/disk/by-id link.
    type: str
    required: true
  mode:
    description: The cache mode to ensure (each kind has its own, see the description).
    type: str
    required: true
    choices: [writethrough, writeback, writearound, none, passthrough]
  drain:
    description:
      - After switching, drain until clean (C(cachemgr mode --drain)).
      - With V(true), a device that holds dirty data is a change even when the mode is
        already right.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Writeback on the VM disk cache, named by its backing disk's stable link
  cachemgr.cachemgr.cachemgr_mode:
    device: /dev/disk/by-id/wwn-0x5000c500a1b2c3d4
    mode: writeback

- name: An LVM cache to writethrough, draining first
  cachemgr.cachemgr.cachemgr_mode:
    device: vg0/vm1
    mode: writethrough
    drain: true
"""

RETURN = r"""
device:
  description: The device as C(cachemgr status) names it.
  returned: always
  type: str
  sample: /dev/bcache0
mode:
  description: The mode the device is in at the end (in check mode, the one it would be in).
  returned: always
  type: str
  sample: writeback
before:
  description: The mode the device was in.
  returned: always
  type: str
  sample: writethrough
changes:
  description: What C(cachemgr mode --json) changed (target, what, before, after).
  returned: when changed and not in check mode
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cachemgr.cachemgr.plugins.module_utils.cachemgr_cli import (
    ALREADY,
    COMMON_ARGS,
    MODES_OF_KIND,
    cli_target,
    diff,
    find_device,
    kind_of,
    run_json,
    status,
)


MODES = ["writethrough", "writeback", "writearound", "none", "passthrough"]


def main() -> None:
    spec = dict(COMMON_ARGS)
    spec.update(device={"type": "str", "required": True},
                mode={"type": "str", "required": True, "choices": MODES},
                drain={"type": "bool", "default": False})
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    dev = find_device(module, status(module), p["device"])
    kind = kind_of(dev)
    allowed = MODES_OF_KIND.get(kind, ())
    if p["mode"] not in allowed:
        hint = " (passthrough is its none)" if p["mode"] == "none" else ""
        module.fail_json(msg="%s is a %s device, which has no mode %s: its modes are %s%s" % (
            dev["device"], kind, p["mode"], ", ".join(allowed), hint))
    before = dev.get("mode")
    lvm_mode = (dev.get("lvm") or {}).get("cache_mode")
    dirty = dev.get("dirty_bytes")
    needs_drain = p["drain"] and dirty != 0  # null: unknown, never taken as clean
    result = {"device": dev["device"], "before": before, "mode": p["mode"]}
    if before == p["mode"] and lvm_mode in (None, p["mode"]) and not needs_drain:
        module.exit_json(changed=False, **result)
    changed_diff = diff(module, {"mode": before, "dirty_bytes": dirty},
                        {"mode": p["mode"], "dirty_bytes": 0 if p["drain"] else dirty})
    if module.check_mode:
        module.exit_json(changed=True, **dict(result, **changed_diff))
    # --yes: the task is the admin's decision; the CLI asks on a terminal only and refuses
    # without one (a mode that caches nothing: docs/cli.md, "Confirmations")
    args = ["mode", cli_target(dev), p["mode"], "--yes", "--json"] + (
        ["--drain"] if p["drain"] else [])
    rc, doc = run_json(module, args)
    if rc == ALREADY:
        module.exit_json(changed=False, **result)
    module.exit_json(changed=True, changes=(doc or {}).get("changes", []),
                     **dict(result, **changed_diff))


if __name__ == "__main__":
    main()
