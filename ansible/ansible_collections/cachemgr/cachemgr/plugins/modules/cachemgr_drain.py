#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: cachemgr developers
# GNU General Public License v2.0 or later, so also under v3.0+ (see LICENSE in the project)
# SPDX-License-Identifier: GPL-2.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: cachemgr_drain
short_description: Drain a cache until clean (fast; tunables restored)
description:
  - Runs C(cachemgr drain --json) on a bcache, dm-cache, LVM cache or dm-writecache device;
    it writes the dirty data back to the backing device as fast as it allows, then puts the
    writeback tunables (or the dm-cache policy) back.
  - A device with no dirty data is not a change (nothing is run). Dirty data the kernel
    cannot tell (a bcache device whose cache set is missing) is never taken as none.
  - The device is found by any name C(cachemgr) takes for it and by any link to the same
    node (/dev/disk/by-id/..., C(VG/LV)).
version_added: "0.1.0"
extends_documentation_fragment:
  - cachemgr.cachemgr.cachemgr
  - cachemgr.cachemgr.cachemgr.changes
author:
  - cachemgr developers (@cachemgr)
options:
  device:
    description:
      - The cached device (/dev/bcacheN, its backing device or UUID, /dev/mapper/NAME,
        C(VG/LV), a /dev/disk/by-id link).
    type: str
    required: true
  timeout:
    description: Seconds before giving up (the cache is left as it is, tunables restored).
    type: int
    default: 86400
"""

EXAMPLES = r"""
- name: Flush the cache in front of the VM disks before maintenance
  cachemgr.cachemgr.cachemgr_drain:
    device: /dev/bcache0
    timeout: 3600
"""

RETURN = r"""
device:
  description: The device as C(cachemgr status) names it.
  returned: always
  type: str
  sample: /dev/mapper/vmcache
dirty_bytes:
  description: The dirty data found before the drain (null when the kernel cannot tell).
  returned: always
  type: int
  sample: 4751360
result:
  description: What C(cachemgr drain --json) printed (clean, drained_bytes, seconds, restored).
  returned: when changed and not in check mode
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cachemgr.cachemgr.plugins.module_utils.cachemgr_cli import (
    ALREADY,
    COMMON_ARGS,
    cli_target,
    diff,
    find_device,
    run_json,
    status,
)


def main() -> None:
    spec = dict(COMMON_ARGS)
    spec.update(device={"type": "str", "required": True},
                timeout={"type": "int", "default": 86400})
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    dev = find_device(module, status(module), p["device"])
    dirty = dev.get("dirty_bytes")
    result = {"device": dev["device"], "dirty_bytes": dirty}
    if dirty == 0 and dev.get("state") != "dirty":
        module.exit_json(changed=False, **result)
    changed_diff = diff(module, {"dirty_bytes": dirty}, {"dirty_bytes": 0})
    if module.check_mode:
        module.exit_json(changed=True, **dict(result, **changed_diff))
    rc, doc = run_json(module, ["drain", cli_target(dev), "--json", "--timeout",
                                str(p["timeout"])])
    if rc == ALREADY:
        module.exit_json(changed=False, **result)
    module.exit_json(changed=True, result=doc, **dict(result, **changed_diff))


if __name__ == "__main__":
    main()
