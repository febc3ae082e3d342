#!/usr/bin/python
# GPL-2.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: cachemgr_mode
short_description: Ensure the cache mode of a cached device (bcache or dm-cache)
description:
  - Switches the cache mode with C(cachemgr mode); a device already in that mode is not a
    change (cachemgr's exit code 4).
  - bcache modes are writethrough, writeback, writearound and none; dm-cache has writeback,
    writethrough and passthrough (none is taken as passthrough).
options:
  device:
    description: /dev/bcacheN, the backing device, its UUID, or /dev/mapper/NAME.
    type: str
    required: true
  mode:
    description: The cache mode to ensure.
    type: str
    required: true
    choices: [writethrough, writeback, writearound, none, passthrough]
  drain:
    description: After switching, drain until clean.
    type: bool
    default: false
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


MODES = ["writethrough", "writeback", "writearound", "none", "passthrough"]


def main() -> None:
    spec = dict(COMMON_ARGS)
    spec.update(device={"type": "str", "required": True}, mode={"type": "str", "required": True,
                                                              "choices": MODES},
                drain={"type": "bool", "default": False})
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    _, status, _ = run_json(module, ["status", "--json"], allow_already=False)
    dev = find_device(status, p["device"])
    if dev is None:
        module.fail_json(msg=f"{p['device']} is not a cached device on this host")
    before = dev["mode"]
    dirty = dev.get("dirty_bytes")
    needs_drain = p["drain"] and (dirty is None or dirty > 0)
    if before == p["mode"] and not needs_drain:
        module.exit_json(changed=False, mode=before, device=dev["device"])
    if module.check_mode:
        module.exit_json(changed=True, mode=p["mode"], before=before, device=dev["device"])
    args = ["mode", p["device"], p["mode"], "--json"] + (["--drain"] if p["drain"] else [])
    rc, _, _ = run_json(module, args)
    module.exit_json(changed=rc != ALREADY, mode=p["mode"], before=before,
                     device=dev["device"])


if __name__ == "__main__":
    main()
