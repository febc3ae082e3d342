# Copyright: cachemgr developers
# GNU General Public License v2.0 or later, so also under v3.0+ (see LICENSE in the project)
# SPDX-License-Identifier: GPL-2.0-or-later
"""ansible-test units: how the modules find the device a task names (run by
tests/unit/test_ansible_sanity.py in the cachemgr checkout)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.cachemgr.cachemgr.plugins.module_utils import cachemgr_cli as cli


class Failed(Exception):
    pass


class FakeModule:
    """Only what find_device uses: fail_json."""

    def fail_json(self, **kw):
        raise Failed(kw["msg"])


# the shapes of `cachemgr status --json` devices (docs/json.md in cachemgr)
BCACHE = {"kind": "bcache", "device": "/dev/bcache0", "backing": "/dev/ubda",
          "backing_uuid": "7643a213-caa1-4bce-8c4a-454fdbe3fa1c",
          "by_uuid": "/dev/bcache/by-uuid/7643a213-caa1-4bce-8c4a-454fdbe3fa1c",
          "mode": "writeback", "lvm": None}
LVM = {"kind": "dm-cache", "device": "/dev/mapper/vg0-vm1", "name": "vg0-vm1",
       "backing": "/dev/mapper/vg0-vm1_corig", "dm_uuid": "LVM-AU1o", "mode": "writeback",
       "lvm": {"name": "vg0/vm1", "lv_uuid": "abc", "cache_pvs": ["/dev/ubdb"]}}
DMCACHE = {"kind": "dm-cache", "device": "/dev/mapper/vmcache", "name": "vmcache",
           "backing": "/dev/mapper/slow", "dm_uuid": None, "mode": "writeback", "lvm": None}
DOC = {"devices": [BCACHE, LVM, DMCACHE]}


@pytest.mark.parametrize("target, device", [
    ("/dev/bcache0", "/dev/bcache0"), ("/dev/ubda", "/dev/bcache0"),
    ("7643a213-caa1-4bce-8c4a-454fdbe3fa1c", "/dev/bcache0"),
    ("vg0/vm1", "/dev/mapper/vg0-vm1"), ("/dev/vg0/vm1", "/dev/mapper/vg0-vm1"),
    ("vg0-vm1", "/dev/mapper/vg0-vm1"), ("vmcache", "/dev/mapper/vmcache"),
    (" /dev/mapper/vmcache ", "/dev/mapper/vmcache"),
])
def test_every_spelling_the_cli_takes(target, device):
    assert cli.find_device(FakeModule(), DOC, target)["device"] == device


@pytest.mark.parametrize("target", ["/dev/mapper/slow", "/dev/bcache1", "vg0/vm2", "bcache0",
                                    "/dev/mapper/vg0-vm1_corig", ""])
def test_what_names_no_cached_device_fails(target):
    """A dm-cache device's origin is not a name for it (the CLI refuses it too)."""
    with pytest.raises(Failed, match="not a cached device"):
        cli.find_device(FakeModule(), DOC, target)


def test_a_link_to_the_same_node_names_the_device(tmp_path, monkeypatch):
    """/dev/disk/by-id/... links: followed to the node, compared with the nodes the CLI
    printed (followed too)."""
    node = tmp_path / "sdb"
    node.write_text("")
    link = tmp_path / "wwn-0x5000c500a1b2c3d4"
    link.symlink_to(node)
    real = os.path.realpath

    def fake_node(path):
        # the test's files stand for /dev nodes
        if path == "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4":
            return real(str(link))
        if path == "/dev/sdb":
            return real(str(node))
        return None
    monkeypatch.setattr(cli, "_node", fake_node)
    doc = {"devices": [dict(BCACHE, backing="/dev/sdb")]}
    found = cli.find_device(FakeModule(), doc, "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4")
    assert found["device"] == "/dev/bcache0"
    assert cli.cli_target(found) == "/dev/bcache0"


def test_two_devices_for_one_name_fail():
    twin = dict(DMCACHE, device="/dev/mapper/other")
    with pytest.raises(Failed, match="names 2 cached devices"):
        cli.find_device(FakeModule(), {"devices": [DMCACHE, twin]}, "vmcache")


def test_modes_per_kind():
    assert "none" in cli.MODES_OF_KIND["bcache"]
    assert "none" not in cli.MODES_OF_KIND["dm-cache"]
    assert "passthrough" in cli.MODES_OF_KIND["dm-cache"]
    assert cli.MODES_OF_KIND["dm-writecache"] == ("writeback",)
    assert cli.kind_of(LVM) == "dm-cache"


def test_the_cli_is_handed_the_lv_name_or_the_device():
    assert cli.cli_target(LVM) == "vg0/vm1"
    assert cli.cli_target(DMCACHE) == "/dev/mapper/vmcache"
    assert cli.cli_target(dict(BCACHE, device=None)) == "/dev/ubda"  # stopped: no bcacheN
