# Copyright: cachemgr developers
# GNU General Public License v2.0 or later, so also under v3.0+ (see LICENSE in the project)
# SPDX-License-Identifier: GPL-2.0-or-later
"""ansible-test units: what cachemgr_policy takes as cachemgr being there, and a file's
bytes and mode as it compares them."""

from __future__ import annotations

import os

from ansible_collections.cachemgr.cachemgr.plugins.modules import cachemgr_policy as m


def test_a_path_is_there_only_as_an_executable_file(tmp_path):
    exe = tmp_path / "cachemgr"
    exe.write_text("#!/bin/sh\n")
    assert not m.have(str(exe))  # not executable
    exe.chmod(0o755)
    assert m.have(str(exe))
    assert not m.have(str(tmp_path / "missing"))
    assert not m.have(str(tmp_path))  # a directory


def test_a_name_is_looked_up_on_path(tmp_path, monkeypatch):
    exe = tmp_path / "cachemgr-probe"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert m.have("cachemgr-probe")
    assert not m.have("cachemgr-elsewhere")


def test_current_is_the_bytes_and_mode_or_nothing(tmp_path):
    f = tmp_path / "cachemgr.toml"
    assert m.current(str(f)) == (None, None)
    f.write_bytes(b"version = 1\n")
    os.chmod(f, 0o640)
    assert m.current(str(f)) == (b"version = 1\n", 0o640)
