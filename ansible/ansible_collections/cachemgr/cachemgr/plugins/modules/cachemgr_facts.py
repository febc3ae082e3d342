#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: cachemgr developers
# GNU General Public License v2.0 or later, so also under v3.0+ (see LICENSE in the project)
# SPDX-License-Identifier: GPL-2.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: cachemgr_facts
short_description: Gather bcache/dm-cache state as facts (cachemgr status --json)
description:
  - Sets the fact C(cachemgr) to the document C(cachemgr status --json) prints (schema 1),
    with every cached device, its mode, state, dirty data and hit ratio, the cache sets, and
    (unless O(vms=false)) the libvirt VMs above the caches.
  - Changes nothing.
version_added: "0.1.0"
extends_documentation_fragment:
  - cachemgr.cachemgr.cachemgr
author:
  - cachemgr developers (@cachemgr)
options:
  vms:
    description: Ask libvirt which VM disks each cache serves (C(status) without C(--no-vms)).
    type: bool
    default: true
attributes:
  check_mode:
    description: Runs in check mode and tells whether it would change anything.
    support: full
  diff_mode:
    description: Returns details on what has changed with C(--diff).
    support: none
    details: Facts change nothing.
  facts:
    description: Returns C(ansible_facts) that update the host's facts.
    support: full
"""

EXAMPLES = r"""
- name: Gather the caches
  cachemgr.cachemgr.cachemgr_facts:

- name: Name the dirty devices
  ansible.builtin.debug:
    msg: "{{ ansible_facts.cachemgr.devices | selectattr('state', 'eq', 'dirty')
             | map(attribute='device') | list }}"
"""

RETURN = r"""
ansible_facts:
  description: The facts set.
  returned: always
  type: dict
  contains:
    cachemgr:
      description: C(cachemgr status --json), schema 1 (docs/json.md in cachemgr).
      returned: always
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cachemgr.cachemgr.plugins.module_utils.cachemgr_cli import (
    COMMON_ARGS,
    run_json,
)


def main() -> None:
    spec = dict(COMMON_ARGS)
    spec.update(vms={"type": "bool", "default": True})
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    args = ["status", "--json"] + ([] if module.params["vms"] else ["--no-vms"])
    doc = run_json(module, args, allow_already=False)[1]
    module.exit_json(changed=False, ansible_facts={"cachemgr": doc})


if __name__ == "__main__":
    main()
