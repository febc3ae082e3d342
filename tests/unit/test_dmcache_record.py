"""dm-cache records (issue #31 item 4): written at create, read back, matched against the
devices present at boot (refused when one is missing or is another disk), deleted at
remove; an unassembled record in status, its JSON and the health model (``check`` exit 2)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends.dmcache import record
from cachemgr.core.errors import UnsafeError
from cachemgr.core.model import CacheMode, Snapshot, UnassembledDmCache
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import autoattach as autoattach_ops
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import health as health_ops
from cachemgr.ops import render
from cachemgr.procedures import autoattach, health
from cachemgr.procedures.policy import Policy

FX = Path(__file__).resolve().parents[1] / "fixtures"
WB = FX / "dmcache-writeback-uml" / "sys"  # vmcache: origin dm-0 (delay), cache ubdb, md ubdc

ORIGIN = record.DeviceId(1 << 30, "/dev/sdb", wwn="0x5000c500a1b2c3d4",
                         by_path="/dev/disk/by-path/pci-0000:00:1f.2-ata-2")
CACHE = record.DeviceId(256 << 20, "/dev/sdc", serial="S3Z9NB0K123456",
                        sys_path="devices/pci0000:00/0000:00:1f.2/ata3")
META = record.DeviceId(16 << 20, "/dev/sdd", serial="S3Z9NB0K654321",
                       sys_path="devices/platform/uml-blkdev.2")
FOUND = type("Found", (), {"table": None})()  # what discover.find gives create (its table)
REC = record.Record("vc", ORIGIN, CACHE, META, (1 << 30) // 512, 128, "smq",
                    CacheMode.WRITEBACK, 1.0)


def sb(block_sectors: int = 128, blocks: int = (256 << 20) // (128 * 512)) -> bytes:
    head = bytearray(4096)
    head[32:40] = (0o6142003).to_bytes(8, "little")
    head[232:236] = block_sectors.to_bytes(4, "little")
    head[240:244] = blocks.to_bytes(4, "little")
    return bytes(head)


def now(**kw: record.DeviceId) -> dict[str, record.DeviceId]:
    devs = {"sdx": record.DeviceId(ORIGIN.size_bytes, "/dev/sdx", wwn=ORIGIN.wwn),
            "sdy": record.DeviceId(CACHE.size_bytes, "/dev/sdy", serial=CACHE.serial),
            "ubdc": record.DeviceId(META.size_bytes, "/dev/ubdc", serial=META.serial,
                                    sys_path=META.sys_path)}
    devs.update(kw)
    return devs


def superblock_ok(node: str) -> record.Superblock | None:
    return record.parse_superblock(sb())


# --------------------------------------------------------------------------- the file


def test_record_written_and_read_back(tmp_path: Path) -> None:
    path = record.save(REC)
    assert path == os.environ["CACHEMGR_DMCACHE_DIR"] + "/vc.json"
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    data = json.loads(Path(path).read_text())
    assert data["origin"]["wwn"] == ORIGIN.wwn and data["block_sectors"] == 128
    assert data["mode"] == "writeback" and data["policy"] == "smq"
    recs, bad = record.load_all()
    assert bad == [] and recs == [REC] and recs[0].path == path
    assert [n for n in os.listdir(os.path.dirname(path))] == ["vc.json"]  # no temporary left
    assert record.delete("vc") and not record.delete("vc")
    assert record.load_all() == ([], [])


def test_record_dir_through_a_link_is_refused(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("CACHEMGR_DMCACHE_DIR", str(tmp_path / "link"))
    with pytest.raises(record.RecordError, match="symbolic link"):
        record.save(REC)
    assert list(real.iterdir()) == []
    recs, bad = record.load_all()
    assert recs == [] and "symbolic link" in bad[0]


def test_a_record_file_that_is_a_link_or_garbage_is_not_read(tmp_path: Path) -> None:
    record.save(REC)
    d = Path(os.environ["CACHEMGR_DMCACHE_DIR"])
    (tmp_path / "other.json").write_text(json.dumps(REC.to_json()))
    (d / "evil.json").symlink_to(tmp_path / "other.json")
    (d / "junk.json").write_text("{")
    recs, bad = record.load_all()
    assert [r.name for r in recs] == ["vc"]
    assert any("evil.json" in b and "symbolic link" in b for b in bad), bad
    assert any("junk.json" in b for b in bad), bad


# --------------------------------------------------------------------------- matching


def test_all_three_present_resolve_to_their_nodes_this_boot() -> None:
    res = record.resolve(REC, now(), superblock_ok)
    assert res.ok
    assert dict(res.nodes) == {"origin": "/dev/sdx", "cache": "/dev/sdy",
                               "metadata": "/dev/ubdc"}
    assert REC.table(res.nodes).line() == \
        "0 2097152 cache /dev/ubdc /dev/sdy /dev/sdx 128 1 writeback smq 0"


def test_a_missing_device_is_named() -> None:
    devs = now()
    del devs["sdy"]
    res = record.resolve(REC, devs, superblock_ok)
    assert not res.ok and res.missing
    assert res.problems == (("cache", "missing (serial S3Z9NB0K123456, 268435456 bytes "
                                      "(was /dev/sdc))"),)


def test_another_disk_in_the_slot_is_refused() -> None:
    # the cache's slot holds a disk with another serial; the origin has its WWN but another
    # size (a different LUN behind a reused WWN is a mistake to stop at, not to guess over)
    devs = now(sdy=record.DeviceId(CACHE.size_bytes, "/dev/sdy", serial="OTHER",
                                   sys_path=CACHE.sys_path),
               sdx=record.DeviceId(2 << 30, "/dev/sdx", wwn=ORIGIN.wwn))
    res = record.resolve(REC, devs, superblock_ok)
    assert not res.ok and not res.missing
    why = dict(res.problems)
    assert "another device" in why["cache"] and "serial OTHER" in why["cache"]
    assert "not the recorded device" in why["origin"]


def test_metadata_without_its_superblock_is_refused() -> None:
    res = record.resolve(REC, now(), lambda node: None)
    assert dict(res.problems)["metadata"].startswith("/dev/ubdc carries no dm-cache superblock")
    res = record.resolve(REC, now(), lambda node: record.parse_superblock(sb(block_sectors=256)))
    assert "256-sector blocks" in dict(res.problems)["metadata"]
    res = record.resolve(REC, now(), lambda node: record.parse_superblock(sb(blocks=7)))
    assert "7 blocks" in dict(res.problems)["metadata"]
    # not committed yet (0 cache blocks): the block size alone decides
    assert record.resolve(REC, now(), lambda node: record.parse_superblock(sb(blocks=0))).ok


def test_no_stable_identity_is_never_guessed_by_size() -> None:
    rec = record.Record("vc", ORIGIN, CACHE, record.DeviceId(META.size_bytes, "/dev/loop0"),
                        REC.origin_sectors, 128)
    res = record.resolve(rec, now(loop0=record.DeviceId(META.size_bytes, "/dev/loop0")),
                         superblock_ok)
    assert "without a stable identity" in dict(res.problems)["metadata"]


def test_assemble_refuses_a_mismatch_and_creates_nothing(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from cachemgr.backends.dmcache import command

    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(command, "dmsetup", lambda *a, **k: calls.append(a))
    devs = now()
    del devs["sdx"]
    with pytest.raises(UnsafeError, match=r"origin: missing \(wwn 0x5000c500a1b2c3d4"):
        record.assemble(Sysfs(WB), REC, devs)
    assert calls == []


def test_sys_path_of_the_lab_disks() -> None:
    sysfs = Sysfs(WB)
    assert record.sys_path(sysfs, "ubdb") == "devices/platform/uml-blkdev.1"
    assert record.sys_path(sysfs, "dm-0") is None  # virtual: no place of its own
    # qemu lab's NVMe namespaces have no block/ directory: the controller's PCI place and
    # the namespace id (nvme0/nvme0n1 are the kernel's probe order)
    nvme = Sysfs(FX / "nvme-pair-qemu" / "sys")
    assert record.sys_path(nvme, "nvme0n1") == "devices/pci0000:00/0000:00:02.0/0000:01:00.0:ns1"
    assert record.sys_path(nvme, "nvme1n1") == "devices/pci0000:00/0000:00:03.0/0000:02:00.0:ns1"


def test_a_partition_is_its_disks_wwn_and_serial_with_its_number() -> None:
    """udev copies a disk's serial onto its partitions: a partition is recorded by its
    disk's WWN and serial with -partN (the qemu lab's NVMe partitions had no other stable
    key without udevd); the capture's virtio disk has none, given here."""
    import dataclasses

    from cachemgr.backends import identity

    sysfs = Sysfs(FX / "schedulers-qemu" / "sys")
    disk = identity.identify(sysfs, "vda", udev=None, probe=None)
    part = identity.identify(sysfs, "vda1", udev=None, probe=None)
    assert part.partition_of == "vda"
    named = dataclasses.replace(disk, serial="QM00001", wwn="0x5000c500a1b2c3d4")
    d = record.device_id(sysfs, dataclasses.replace(part, serial="QM00001"),
                         "block/vda/vda1", {"vda": named})
    w = identity.normalize_wwn("0x5000c500a1b2c3d4")  # the kernel's form: naa.5000...
    assert (d.wwn, d.serial) == (f"{w}-part1", "QM00001-part1")
    assert d.sys_path == "devices/pci0000:00/0000:00:02.0/virtio0:part1"
    assert d.strongest() == ("wwn", f"{w}-part1")
    whole = record.device_id(sysfs, named, "block/vda")
    assert (whole.wwn, whole.serial) == (w, "QM00001")
    # a disk without them: nothing made up
    bare = record.device_id(sysfs, part, "block/vda/vda1",
                            {"vda": dataclasses.replace(disk, serial=None, wwn=None)})
    assert (bare.wwn, bare.serial) == (None, None)


# --------------------------------------------------------------------------- create / remove


def test_create_records_and_remove_deletes(monkeypatch: pytest.MonkeyPatch) -> None:
    from cachemgr.backends import dmcache
    from cachemgr.ops import gate as gate_mod
    from cachemgr.procedures import kinds

    made: dict[str, Any] = {}

    def make(sysfs: Sysfs, name: str, nodes: dict[str, str], table: Any, t: float
             ) -> record.Record:
        made.update(nodes)
        return REC

    monkeypatch.setattr(dmcache, "create", lambda *a, **k: [])
    monkeypatch.setattr(cache_ops.dm_discover, "find", lambda sysfs, name: FOUND)
    monkeypatch.setattr(record, "make", make)
    monkeypatch.setattr(gate_mod, "gate", lambda *a, **k: contextlib.nullcontext())
    res = cache_ops.create_dmcache(Sysfs(WB), name="vc", origin="/dev/sdb", cache="/dev/sdc",
                                   metadata="/dev/sdd", mode="writeback")
    assert made == {"origin": "/dev/sdb", "cache": "/dev/sdc", "metadata": "/dev/sdd"}
    assert any("recorded in" in n for n in res.notes), res.notes
    assert [r.name for r in record.load_all()[0]] == ["vc"]

    class Dev:
        name = "dm-cache"
        cached_device = True
        root_in_backend = True
        obj = type("D", (), {"name": "vc"})()

        def remove(self, sysfs: Sysfs, **kw: Any) -> list[Any]:
            return []

        forget = kinds.DmCache.forget  # its kind's: the record goes

    monkeypatch.setattr(cache_ops, "status", lambda *a, **k: None)
    monkeypatch.setattr(kinds, "resolve", lambda *a, **k: Dev())
    monkeypatch.setattr(gate_mod, "of_kind", lambda dev: None)
    out = cache_ops.remove(Sysfs(WB), "vc", keep_device=True)
    assert any("record" in n and "removed" in n for n in out.notes), out.notes
    assert record.load_all() == ([], [])


def test_create_whose_record_fails_says_so(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    from cachemgr.backends import dmcache
    from cachemgr.ops import gate as gate_mod

    (tmp_path / "f").write_text("")
    monkeypatch.setenv("CACHEMGR_DMCACHE_DIR", str(tmp_path / "f" / "dmcache"))
    monkeypatch.setattr(dmcache, "create", lambda *a, **k: [])
    monkeypatch.setattr(cache_ops.dm_discover, "find", lambda sysfs, name: FOUND)
    monkeypatch.setattr(record, "make", lambda *a: REC)
    monkeypatch.setattr(gate_mod, "gate", lambda *a, **k: contextlib.nullcontext())
    res = cache_ops.create_dmcache(Sysfs(WB), name="vc", origin="/dev/sdb", cache="/dev/sdc",
                                   metadata="/dev/sdd")
    assert any("is NOT recorded" in n for n in res.notes), res.notes


# --------------------------------------------------------------------------- status / health


def snap_with(mode: CacheMode) -> Snapshot:
    u = UnassembledDmCache("vc", "/etc/cachemgr/dmcache/vc.json", mode,
                           (("cache", "missing (serial X)"),))
    return Snapshot(kernel=None, bcache_loaded=True, cache_sets=(), backings=(),
                    unassembled=(u,))


def test_health_of_an_unassembled_record() -> None:
    f = health.assess(snap_with(CacheMode.WRITEBACK))
    assert [(x.level, x.code, x.device) for x in f] == [
        (health.Level.CRITICAL, "dmcache-unassembled", "/dev/mapper/vc")]
    assert "origin is stale" in f[0].what and "cache: missing (serial X)" in f[0].what
    f = health.assess(snap_with(CacheMode.WRITETHROUGH))
    assert [(x.level, x.code) for x in f] == [(health.Level.WARNING, "dmcache-unassembled")]


def test_status_text_and_json_list_an_unassembled_record() -> None:
    snap = snap_with(CacheMode.WRITEBACK)
    text = render.status_table(snap)
    assert ("unassembled dm-cache /dev/mapper/vc: writeback, recorded in "
            "/etc/cachemgr/dmcache/vc.json; cache missing (serial X)") in text
    assert "CRITICAL: /dev/mapper/vc: recorded writeback dm-cache" in text
    doc = cache_ops.status_json(snap)
    assert doc["unassembled"] == [{
        "kind": "dm-cache", "name": "vc", "device": "/dev/mapper/vc",
        "record": "/etc/cachemgr/dmcache/vc.json", "mode": "writeback", "stale_origin": True,
        "problems": [{"role": "cache", "why": "missing (serial X)"}], "unproven": [],
        "check": None}]


def test_check_exits_2_for_a_writeback_record_whose_disks_are_gone() -> None:
    record.save(REC)  # none of its disks is in the captured tree
    snap = cache_ops.status(Sysfs(WB))
    assert [u.name for u in snap.unassembled] == ["vc"]
    assert {r for r, _ in snap.unassembled[0].problems} == {"origin", "cache", "metadata"}
    res = health_ops.check(Sysfs(WB))
    assert res.value == health.Level.CRITICAL and int(res.value) == 2
    assert res.lines[0].startswith("CACHEMGR CRITICAL - ")
    assert "/dev/mapper/vc" in res.lines[0]


def test_an_assembled_record_is_not_listed() -> None:
    rec = record.Record("vmcache", ORIGIN, CACHE, META, REC.origin_sectors, 64)
    record.save(rec)
    assert cache_ops.status(Sysfs(WB)).unassembled == ()


# --------------------------------------------------------------------------- boot pass


def view_with(res: record.Resolution) -> autoattach.View:
    snap = Snapshot(kernel=None, bcache_loaded=True, cache_sets=(), backings=())
    return autoattach.View(snap, {}, dm_records=((REC, res),))


def test_decide_assembles_a_complete_record_and_notes_a_missing_device() -> None:
    ok = record.resolve(REC, now(), superblock_ok)
    acts = autoattach.decide(None, view_with(ok), Policy())
    assert [a.kind for a in acts] == ["dmcache-assemble"]
    a = acts[0]
    assert isinstance(a, autoattach.AssembleDmCache)
    assert (a.device, a.origin, a.cache, a.metadata) == ("vc", "/dev/sdx", "/dev/sdy",
                                                         "/dev/ubdc")
    devs = now()
    del devs["ubdc"]
    acts = autoattach.decide(None, view_with(record.resolve(REC, devs, superblock_ok)),
                             Policy())
    assert [a.kind for a in acts] == ["note"]
    note = acts[0]
    assert isinstance(note, autoattach.Note) and note.level == logging.WARNING
    assert note.message.startswith("dm-cache /dev/mapper/vc not assembled (writeback: its "
                                   "origin is stale; nothing may open it): metadata missing")


def test_boot_pass_without_a_policy_reports_the_missing_devices(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    nopolicy = str(tmp_path / "none.toml")
    with pytest.raises(Exception, match="no such file"):  # no policy, no record: as before
        autoattach_ops.boot_pass(Sysfs(WB), nopolicy, dry_run=True)
    record.save(REC)
    res = autoattach_ops.boot_pass(Sysfs(WB), nopolicy, dry_run=True)
    assert not res.failed
    # the capture's ubdc sits in the metadata's slot with no serial: another device, refused
    # (exit 3), named with the missing ones
    assert any(line.startswith("refused") and "dm-cache /dev/mapper/vc not assembled" in line
               and "origin missing (wwn 0x5000c500a1b2c3d4" in line
               and "metadata /dev/ubdc sits where it was but is another device" in line
               for line in res.lines), res.lines
    assert res.exit_code == 3
