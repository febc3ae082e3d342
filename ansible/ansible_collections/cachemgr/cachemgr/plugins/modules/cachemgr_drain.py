#!/usr/bin/python
# GPL-2.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: cachemgr_drain
short_description: Drain a cache until clean (fast; tunables restored)
description:
  - Runs C(cachemgr drain --json) on a bcache or dm-cache device; it writes the dirty data back
    to the backing device as fast as it allows, then puts the writeback tunables (or the
    dm-cache policy) back.
  - Already clean is not a change.
options:
  device:
    description: The cached device (/dev/bcacheN, its backing device or UUID, /dev/mapper/NAME).
    type: str
    required: true
  timeout:
    description: Seconds before giving up (the cache is left as it is, tunables restored).
    type: int
    default: 86400
  cachemgr_bin:
    description: Path of the cachemgr command.
    type: str
    default: cachemgr
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cachemgr.cachemgr.plugins.module_utils.cachemgr_cli import (
    ALREADY,
    COMMON_ARGS,
    find_device,
    run_json,
)


def main() -> None:
    spec = dict(COMMON_ARGS)
    spec.update(device={"type": "str", "required": True}, timeout={"type": "int",
                                                                   "default": 86400})
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    _, status, _ = run_json(module, ["status", "--json"], allow_already=False)
    dev = find_device(status, p["device"])
    if dev is None:
        module.fail_json(msg=f"{p['device']} is not a cached device on this host")
    if dev.get("dirty_bytes") == 0 and dev.get("state") in ("clean", "no cache"):
        module.exit_json(changed=False, device=dev["device"])
    if module.check_mode:
        module.exit_json(changed=True, device=dev["device"])
    rc, res, _ = run_json(module, ["drain", p["device"], "--json", "--timeout",
                                   str(p["timeout"])])
    module.exit_json(changed=rc != ALREADY, device=dev["device"], result=res)


if __name__ == "__main__":
    main()
