#!/usr/bin/python
# GPL-2.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: cachemgr_facts
short_description: Gather bcache/dm-cache state as facts (cachemgr status --json)
description:
  - Sets the fact C(cachemgr) to the document C(cachemgr status --json) prints (schema 1),
    with every cached device, its mode, state, dirty data and hit ratio, the cache sets, and the
    libvirt VMs above the caches.
  - Changes nothing.
options:
  cachemgr_bin:
    description: Path of the cachemgr command.
    type: str
    default: cachemgr
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cachemgr.cachemgr.plugins.module_utils.cachemgr_cli import (
    COMMON_ARGS,
    run_json,
)


def main() -> None:
    module = AnsibleModule(argument_spec=dict(COMMON_ARGS), supports_check_mode=True)
    _, status, _ = run_json(module, ["status", "--json"], allow_already=False)
    module.exit_json(changed=False, ansible_facts={"cachemgr": status})


if __name__ == "__main__":
    main()
