# Copyright: cachemgr developers
# GNU General Public License v2.0 or later, so also under v3.0+ (see LICENSE in the project)
# SPDX-License-Identifier: GPL-2.0-or-later
"""ansible-test units: when a finished replacement makes cachemgr_replace_ssd already so."""

from __future__ import annotations

from ansible_collections.cachemgr.cachemgr.plugins.modules import cachemgr_replace_ssd as m

# runs as `cachemgr replace-ssd --list --json` prints them (docs/json.md in cachemgr)
BCACHE_RUN = {"id": "20261123-001502-fb5b", "kind": "bcache", "status": "done",
              "cset": "fb5bd09d", "new_cset": "0d1e2f3a", "lv": None, "dm_name": None,
              "new": {"node": "/dev/sdc", "wwid": "naa.5000c500a1b2c3d4", "serial": "S1",
                      "slot": "0:0:2:0", "cset": "0d1e2f3a"}}
LVM_RUN = {"id": "20261123-001502-vg0-vm1", "kind": "lvm", "status": "done", "cset": None,
           "lv": "vg0/vm1", "dm_name": None,
           "new": {"node": "/dev/nvme1n1", "wwid": "eui.0025388b71b2c3d4", "serial": "N1"}}


def status_with(cset=None, cache_pvs=None):
    devices = []
    if cache_pvs is not None:
        devices.append({"kind": "dm-cache", "device": "/dev/mapper/vg0-vm1", "name": "vg0-vm1",
                        "lvm": {"name": "vg0/vm1", "cache_pvs": cache_pvs}})
    caches = [{"uuid": cset, "cache_devices": ["/dev/sdc"]}] if cset else []
    return {"devices": devices, "caches": caches}


def test_a_bcache_run_is_in_place_while_its_new_cache_set_is_there():
    assert m.in_place(status_with(cset="0d1e2f3a"), BCACHE_RUN)
    assert not m.in_place(status_with(cset="fb5bd09d"), BCACHE_RUN)
    assert not m.in_place(status_with(), BCACHE_RUN)


def test_an_lvm_run_is_in_place_while_its_new_ssd_caches_the_lv():
    assert m.in_place(status_with(cache_pvs=["/dev/nvme1n1p1"]), LVM_RUN)
    assert m.in_place(status_with(cache_pvs=["/dev/nvme1n1"]), LVM_RUN)
    assert not m.in_place(status_with(cache_pvs=["/dev/nvme1n11"]), LVM_RUN)  # another disk
    assert not m.in_place(status_with(cache_pvs=["/dev/sdb"]), LVM_RUN)
    assert not m.in_place(status_with(), LVM_RUN)


def test_the_new_disk_asked_for_is_the_one_the_run_put_in():
    for want in ("same", "any", "/dev/sdc", "wwn:0x5000c500a1b2c3d4", "wwn:5000C500A1B2C3D4",
                 "serial:S1", "0:0:2:0"):
        assert m.names_new(BCACHE_RUN, want), want
    for want in ("/dev/sdd", "/dev/sdc1", "wwn:0x5000c500a1b2c3d5", "serial:S2", "0:0:3:0",
                 "wwn:"):
        assert not m.names_new(BCACHE_RUN, want), want


def test_a_by_id_wwn_link_is_asked_about_by_its_wwn_too():
    assert m.specs_of("/dev/disk/by-id/wwn-0x5000c500a1b2c3d4") == [
        "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", "wwn:0x5000c500a1b2c3d4"]
    assert m.specs_of("vg0/vm1") == ["vg0/vm1"]


# a plain dm-cache device moved to an NVMe SSD (issue #17 item 5): its cache and metadata
# are partitions of the new namespace, in the slot the run recorded (a PCI function)
DMCACHE_NVME_RUN = {"id": "20261125-031502-vc", "kind": "dmcache", "status": "done",
                    "cset": None, "lv": None, "dm_name": "vc",
                    "new": {"node": "/dev/nvme1n1", "bus": "nvme", "slot": "0000:02:00.0",
                            "wwid": "eui.525400c0ffee0002", "serial": "CMLABNVME01"}}


def dm_status(cache):
    return {"devices": [{"kind": "dm-cache", "device": "/dev/mapper/vc", "name": "vc",
                         "cache": cache}], "caches": []}


def test_a_dmcache_run_is_in_place_while_a_partition_of_its_new_nvme_ssd_caches_it():
    assert m.in_place(dm_status("/dev/nvme1n1p2"), DMCACHE_NVME_RUN)
    assert m.in_place(dm_status("/dev/nvme1n1"), DMCACHE_NVME_RUN)
    assert not m.in_place(dm_status("/dev/nvme1n11p2"), DMCACHE_NVME_RUN)  # another namespace
    assert not m.in_place(dm_status("/dev/nvme1n12"), DMCACHE_NVME_RUN)
    assert not m.in_place(dm_status("/dev/nvme0n1p2"), DMCACHE_NVME_RUN)  # the old SSD
    assert not m.in_place({"devices": [], "caches": []}, DMCACHE_NVME_RUN)


def test_an_nvme_ssd_asked_for_by_node_eui_serial_or_pci_slot():
    for want in ("same", "any", "/dev/nvme1n1", "wwn:525400c0ffee0002", "serial:CMLABNVME01",
                 "0000:02:00.0"):
        assert m.names_new(DMCACHE_NVME_RUN, want), want
    for want in ("/dev/nvme1n1p1", "/dev/nvme0n1", "wwn:525400c0ffee0001",
                 "serial:CMLABNVME00", "0000:01:00.0"):
        assert not m.names_new(DMCACHE_NVME_RUN, want), want
