#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: cachemgr developers
# GNU General Public License v2.0 or later, so also under v3.0+ (see LICENSE in the project)
# SPDX-License-Identifier: GPL-2.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: cachemgr_policy
short_description: Write the auto-attach policy after cachemgr policy check accepted it
description:
  - Checks the policy text with C(cachemgr policy check) on the host, in check mode too (where
    M(ansible.builtin.copy) skips its C(validate), so that a bad policy would only show as a
    change); a policy it refuses fails the task with its line-precise message, and nothing
    is written.
  - Writes the text to O(path) (its directory made if missing, mode 0755) only when it
    differs, atomically, with O(mode); the same text and mode are no change.
  - In check mode on a host without cachemgr yet (a run that installs it comes first), the
    policy cannot be checked there; the task says so in a warning.
version_added: "0.1.0"
extends_documentation_fragment:
  - cachemgr.cachemgr.cachemgr
  - cachemgr.cachemgr.cachemgr.changes
author:
  - cachemgr developers (@cachemgr)
options:
  content:
    description: The policy, TOML text (the admin guide's "Auto-attach at boot and on hotplug").
    type: str
    required: true
  path:
    description: Where the policy goes (the udev rule and the boot unit read it there).
    type: path
    default: /etc/cachemgr/cachemgr.toml
  mode:
    description: The file's mode (root-owned and not writable by others, or cachemgr refuses it).
    type: str
    default: "0644"
"""

EXAMPLES = r"""
- name: The auto-attach policy
  cachemgr.cachemgr.cachemgr_policy:
    content: "{{ lookup('ansible.builtin.file', 'cachemgr.toml') }}"
    cachemgr_bin: /usr/bin/cachemgr
"""

RETURN = r"""
path:
  description: The policy file.
  returned: always
  type: str
  sample: /etc/cachemgr/cachemgr.toml
checked:
  description: Whether C(cachemgr policy check) accepted the text (false only in check mode
    on a host without cachemgr).
  returned: always
  type: bool
"""

import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible_collections.cachemgr.cachemgr.plugins.module_utils.cachemgr_cli import COMMON_ARGS


def have(binary):
    """Whether ``binary`` (a path, or a name looked up on PATH) is there to run."""
    if os.sep in binary:
        return os.path.isfile(binary) and os.access(binary, os.X_OK)
    return shutil.which(binary) is not None


def current(path):
    """The file's bytes and mode, or (None, None) when it is not there."""
    try:
        with open(path, "rb") as f:
            return f.read(), os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None, None


def check(module, text, directory):
    """Run cachemgr policy check on ``text`` written to a file of its own (in the policy's
    directory when it exists, which cachemgr trusts as it will trust the policy; removed
    again); fails the task when the policy is refused."""
    fd, tmp = tempfile.mkstemp(prefix=".cachemgr-policy-", suffix=".toml", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        argv = [module.params["cachemgr_bin"], "policy", "check", "--policy", tmp]
        rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"})
        if rc != 0:
            module.fail_json(msg="cachemgr policy check refused the policy (exit %d): %s"
                             % (rc, err.strip().replace(tmp, "<policy>")), rc=rc,
                             stdout=out, stderr=err)
    finally:
        os.unlink(tmp)


def main():
    spec = dict(COMMON_ARGS)
    spec.update(content={"type": "str", "required": True},
                path={"type": "path", "default": "/etc/cachemgr/cachemgr.toml"},
                mode={"type": "str", "default": "0644"})
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    path = p["path"]
    try:
        mode = int(p["mode"], 8)
    except ValueError:
        module.fail_json(msg="mode=%r: not an octal mode such as 0644" % p["mode"])
    if not 0 <= mode <= 0o7777:
        module.fail_json(msg="mode=%r: not an octal mode such as 0644" % p["mode"])
    text = to_bytes(p["content"])
    directory = os.path.dirname(path) or "."
    result = {"path": path, "checked": False}

    if have(p["cachemgr_bin"]):
        check(module, text, directory if os.path.isdir(directory) else module.tmpdir)
        result["checked"] = True
    elif module.check_mode:
        module.warn("%s is not on the host yet: the policy is checked once cachemgr is "
                    "installed" % p["cachemgr_bin"])
    else:
        module.fail_json(msg="cachemgr_bin=%s: not on the host (no such file, or not on PATH)"
                         % p["cachemgr_bin"], **result)

    before, before_mode = current(path)
    if before == text and before_mode == mode:
        module.exit_json(changed=False, **result)
    if module._diff:
        result["diff"] = {"before_header": path, "after_header": path,
                          "before": to_text(before or b""), "after": to_text(text)}
    if module.check_mode:
        module.exit_json(changed=True, **result)

    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    if before != text:
        fd, tmp = tempfile.mkstemp(prefix=".cachemgr-policy-", suffix=".toml", dir=directory)
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        os.chmod(tmp, mode)
        module.atomic_move(tmp, path)
    os.chmod(path, mode)
    module.exit_json(changed=True, **result)


if __name__ == "__main__":
    main()
