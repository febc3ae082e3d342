#!/usr/bin/python
# GPL-2.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: cachemgr_replace_ssd
short_description: Replace a cache SSD safely (cachemgr replace-ssd --yes)
description:
  - Runs the journaled replacement of the SSD under a bcache cache set, an LVM cache or a
    plain dm-cache device, on a SCSI or an NVMe SSD.
  - If an earlier run on this cache stopped (a crash, a lost connection), that run is resumed
    instead of planning a new one; runs on other caches are left alone.
  - Use C(serial) in the play to go host by host.
options:
  cache:
    description: the cache SSD, its cset UUID, a cached LV (VG/LV) or a dm-cache device
    type: str
    required: true
  new:
    description: same, any, or the new disk (/dev/..., wwn:..., serial:..., H:C:T:L, PCI address)
    type: str
    default: same
  cachemgr_bin: {description: path of the cachemgr command, type: str, default: cachemgr}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cachemgr.cachemgr.plugins.module_utils.cachemgr_cli import (
    COMMON_ARGS,
    run_json,
)


def main() -> None:
    spec = dict(COMMON_ARGS)
    spec.update(cache={"type": "str", "required": True}, new={"type": "str", "default": "same"})
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    _, runs, _ = run_json(module, ["replace-ssd", p["cache"], "--list", "--json"],
                          allow_already=False)
    pending = [r for r in (runs or {}).get("runs", []) if r["status"] in ("running", "failed")]
    if module.check_mode:
        if pending:
            module.exit_json(changed=True, resume=pending[-1]["id"])
        _, plan, _ = run_json(module, ["replace-ssd", p["cache"], "--new", p["new"],
                                       "--dry-run", "--json"], allow_already=False)
        module.exit_json(changed=True, plan=plan.get("plan") if plan else None)
    if pending:
        _, res, _ = run_json(module, ["replace-ssd", "--resume", pending[-1]["id"], "--json"])
    else:
        _, res, _ = run_json(module, ["replace-ssd", p["cache"], "--new", p["new"], "--yes",
                                      "--json"], allow_already=False)
    module.exit_json(changed=True, result=res)


if __name__ == "__main__":
    main()
