# -*- coding: utf-8 -*-
# Copyright: cachemgr developers
# GNU General Public License v2.0 or later, so also under v3.0+ (see LICENSE in the project)
# SPDX-License-Identifier: GPL-2.0-or-later
"""What every module documents alike: cachemgr_bin, root, and (CHANGES) full check mode and
diff support."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  cachemgr_bin:
    description: Path of the cachemgr command.
    type: str
    default: cachemgr
notes:
  - Needs root on the managed host (C(become)).
"""

    CHANGES = r"""
attributes:
  check_mode:
    description: Runs in check mode and tells whether it would change anything.
    support: full
  diff_mode:
    description: Returns details on what has changed (or would change in check mode) with C(--diff).
    support: full
"""
