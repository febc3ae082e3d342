"""A dm-cache record whose devices are known by their place only (issue #41 item 1): the
boot pass and the udev worker never assemble it (a same-size disk in the origin's slot
passes every check the place and the size can make: the lab's power cut wrote 32 MiB of
dirty blocks onto such a bystander); the health model says CRITICAL naming what to check
and ``cachemgr assemble NAME``, which asks, goes through the gate and journals; the boot
pass exits 3 when it refused something. And records another user could have written are
not used (as a policy file is not)."""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends.dmcache import command, record
from cachemgr.core.errors import AlreadyError, UnsafeError
from cachemgr.core.model import CacheMode, Snapshot, UnassembledDmCache
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import autoattach as autoattach_ops
from cachemgr.ops import cache as cache_ops
from cachemgr.ops.control import Control, Plan
from cachemgr.procedures import autoattach, health
from cachemgr.procedures.policy import Policy

FX = Path(__file__).resolve().parents[1] / "fixtures"
WB = FX / "dmcache-writeback-uml" / "sys"

# what create dm-cache records in the UML lab (its ubd disks have no WWN, serial or link):
# the slots, the sizes and what blkid saw
ORIGIN = record.DeviceId(256 << 20, "/dev/ubda", sys_path="devices/platform/uml-blkdev.0",
                         signature="no signature")
CACHE = record.DeviceId(64 << 20, "/dev/ubdb", sys_path="devices/platform/uml-blkdev.1")
META = record.DeviceId(16 << 20, "/dev/ubdc", sys_path="devices/platform/uml-blkdev.2")
REC = record.Record("vc", ORIGIN, CACHE, META, (256 << 20) // 512, 128, "smq",
                    CacheMode.WRITEBACK, 1.0)


def sb_ok(node: str) -> record.Superblock | None:
    return record.Superblock(128, (64 << 20) // (128 * 512))


def here(**kw: record.DeviceId) -> dict[str, record.DeviceId]:
    """The disks in their slots, as identities() reads them (place and size only)."""
    devs = {n: record.DeviceId(d.size_bytes, f"/dev/{n}", sys_path=d.sys_path)
            for n, d in (("ubda", ORIGIN), ("ubdb", CACHE), ("ubdc", META))}
    devs.update(kw)
    return devs


def swapped() -> dict[str, record.DeviceId]:
    """A same-size bystander in the origin's slot, the origin in a fourth slot."""
    return here(ubdd=record.DeviceId(256 << 20, "/dev/ubdd",
                                     sys_path="devices/platform/uml-blkdev.3"))


# --------------------------------------------------------------------------- resolve


def test_place_only_devices_are_found_but_not_proven() -> None:
    for devs in (here(), swapped()):  # the same answer: the place cannot tell them apart
        res = record.resolve(REC, devs, sb_ok)
        assert res.found and not res.ok, res
        assert dict(res.nodes) == {"origin": "/dev/ubda", "cache": "/dev/ubdb",
                                   "metadata": "/dev/ubdc"}
        assert [r for r, _ in res.unproven] == ["origin", "cache", "metadata"]
        why = dict(res.unproven)["origin"]
        assert why == ("/dev/ubda is known by its place only (sys-path "
                       "devices/platform/uml-blkdev.0): a disk of the same size there would "
                       "pass for it")


def test_a_key_stronger_than_the_place_is_proof_enough() -> None:
    wwn = record.DeviceId(256 << 20, "/dev/sda", wwn="naa.5000c500a1b2c3d4",
                          sys_path="devices/pci0000:00/0000:00:1f.2/ata1")
    serial = record.DeviceId(64 << 20, "/dev/vdb", serial="CACHE-1",
                             sys_path="devices/pci0000:00/0000:00:05.0/virtio3")
    by_id = record.DeviceId(16 << 20, "/dev/sdc", by_id="/dev/disk/by-id/ata-X_Y",
                            by_path="/dev/disk/by-path/pci-0000:00:1f.2-ata-3")
    rec = record.Record("vc", wwn, serial, by_id, REC.origin_sectors, 128)
    devs = {"sda": wwn, "vdb": serial, "sdc": by_id}
    assert record.resolve(rec, devs, sb_ok).ok
    # the same slots holding other disks (the serial's disk moved): refused as before
    devs["vdb"] = record.DeviceId(64 << 20, "/dev/vdb", serial="OTHER",
                                  sys_path=serial.sys_path)
    res = record.resolve(rec, devs, sb_ok)
    assert not res.found and "another device" in dict(res.problems)["cache"]


def test_a_dm_device_by_uuid_is_proven_by_name_only_is_not() -> None:
    lv = record.DeviceId(256 << 20, "/dev/dm-3", dm_uuid="LVM-abc", dm_name="vg-origin")
    named = record.DeviceId(256 << 20, "/dev/dm-3", dm_name="origin")
    for dev, proven in ((lv, True), (named, False)):
        rec = record.Record("vc", dev, REC.cache, REC.metadata, REC.origin_sectors, 128)
        devs = {**here(), "dm-3": dev}
        del devs["ubda"]
        res = record.resolve(rec, devs, sb_ok)
        assert res.found
        assert ("origin" not in dict(res.unproven)) is proven, res.unproven
    assert "known by its name only (dm-name origin)" in dict(res.unproven)["origin"]


def test_assemble_refuses_place_only_unless_the_admin_said_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(command, "dmsetup", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(record, "resolve", functools.partial(record.resolve, superblock=sb_ok))
    monkeypatch.setattr(record, "in_use", lambda sysfs, node: None)  # no /dev/ubd* here
    with pytest.raises(UnsafeError) as exc:
        record.assemble(Sysfs(WB), REC, swapped())
    assert exc.value.exit_code == 3 and calls == []
    assert "origin: /dev/ubda is known by its place only" in exc.value.message
    assert exc.value.hint is not None and exc.value.hint.endswith(
        "then: cachemgr assemble vc")
    assert "blkid at create: no signature" in exc.value.hint
    record.assemble(Sysfs(WB), REC, here(), admin=True)
    assert calls and calls[0][:2] == ("create", "vc")


# --------------------------------------------------------------------------- boot pass


def view_with(res: record.Resolution) -> autoattach.View:
    snap = Snapshot(kernel=None, bcache_loaded=True, cache_sets=(), backings=())
    return autoattach.View(snap, {}, dm_records=((REC, res),))


def test_decide_refuses_place_only_naming_the_command() -> None:
    acts = autoattach.decide(None, view_with(record.resolve(REC, swapped(), sb_ok)),
                             Policy())
    assert [a.kind for a in acts] == ["note"]
    note = acts[0]
    assert isinstance(note, autoattach.Note) and note.refused
    assert note.level == logging.ERROR
    assert note.message.startswith("dm-cache /dev/mapper/vc not assembled (writeback: its "
                                   "origin is stale; nothing may open it): origin /dev/ubda "
                                   "is known by its place only")
    assert note.message.endswith("then: cachemgr assemble vc")
    # the udev worker: an event on one of its disks gives the same refusal, no assembly
    ev = autoattach.Event("add", "/dev/ubda")
    acts = autoattach.decide(ev, view_with(record.resolve(REC, swapped(), sb_ok)), Policy())
    assert [(a.kind, getattr(a, "refused", None)) for a in acts] == [("note", True)]


def _pass(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, res: record.Resolution,
          bad: tuple[str, ...] = ()) -> Any:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    view = autoattach.View(Snapshot(kernel=None, bcache_loaded=True, cache_sets=(),
                                    backings=()), {}, dm_records=((REC, res),) if res else (),
                           dm_record_errors=bad)
    monkeypatch.setattr(autoattach, "take_view", lambda sysfs, **k: view)
    if os.geteuid() != 0:
        pytest.skip("the boot pass needs root")
    record.save(REC)  # a record makes a pass without a policy file run
    return autoattach_ops.boot_pass(Sysfs(WB), str(tmp_path / "none.toml"))


def test_boot_pass_exits_3_when_it_refused_and_0_when_it_assembled(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(autoattach_ops, "act", lambda sysfs, view, a: None)
    out = _pass(monkeypatch, tmp_path, record.resolve(REC, swapped(), sb_ok))
    assert out.exit_code == 3 and not out.failed
    assert out.lines[0].startswith("refused  dm-cache /dev/mapper/vc not assembled")
    assert any("refused 1 thing(s) as unsafe" in n for n in out.notes), out.notes
    assert [a["result"] for a in out.data["actions"]] == ["refused"]
    journal = (tmp_path / "state" / "autoattach" / "actions.jsonl").read_text().splitlines()
    assert json.loads(journal[-1])["result"] == "refused"
    # proven devices: assembled (by act), exit 0
    proven = record.Resolution({"origin": "/dev/sda", "cache": "/dev/sdb",
                                "metadata": "/dev/sdc"})
    out = _pass(monkeypatch, tmp_path, proven)
    assert out.exit_code == 0 and out.lines[0].startswith("done     assemble dm-cache")
    # a record it cannot use (untrusted, garbage): refused too, the rest still done
    out = _pass(monkeypatch, tmp_path, proven, bad=("/etc/cachemgr/dmcache/x.json: owned "
                                                    "by uid 1000, not root; ...",))
    assert out.exit_code == 3
    assert [a["result"] for a in out.data["actions"]] == ["refused", "done"]


# --------------------------------------------------------------------------- health, status


def unproven_snap(mode: CacheMode = CacheMode.WRITEBACK) -> Snapshot:
    res = record.resolve(REC, swapped(), sb_ok)
    u = UnassembledDmCache("vc", "/etc/cachemgr/dmcache/vc.json", mode, res.problems,
                           res.unproven, record.admin_checks(REC, res))
    return Snapshot(kernel=None, bcache_loaded=True, cache_sets=(), backings=(),
                    unassembled=(u,))


def test_health_is_critical_naming_the_command_and_what_to_check() -> None:
    f = health.assess(unproven_snap())
    assert [(x.level, x.code, x.device, x.next) for x in f] == [
        (health.Level.CRITICAL, "dmcache-unproven", "/dev/mapper/vc", "cachemgr assemble vc")]
    assert "the boot pass does not assemble it" in f[0].what
    assert ("check that /dev/ubda is its origin (recorded: sys-path "
            "devices/platform/uml-blkdev.0, 268435456 bytes (was /dev/ubda); blkid at "
            "create: no signature)") in f[0].what
    assert "blkid -p DEV" in f[0].what
    f = health.assess(unproven_snap(CacheMode.WRITETHROUGH))
    assert [(x.level, x.next) for x in f] == [(health.Level.WARNING, "cachemgr assemble vc")]


def test_status_names_the_command() -> None:
    from cachemgr.ops import render

    text = render.status_table(unproven_snap())
    assert ("unassembled dm-cache /dev/mapper/vc: writeback, recorded in "
            "/etc/cachemgr/dmcache/vc.json; its devices are present, known by their place "
            "only: check them, then cachemgr assemble vc") in text
    doc = cache_ops.status_json(unproven_snap())["unassembled"][0]
    assert [u["role"] for u in doc["unproven"]] == ["origin", "cache", "metadata"]
    assert doc["check"].startswith("check that /dev/ubda is its origin")


# --------------------------------------------------------------------------- the command


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, ...]]:
    """The record saved; this boot's disks as :func:`swapped`; dmsetup recorded."""
    if os.geteuid() != 0:
        pytest.skip("assemble needs root")
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    record.save(REC)
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(command, "dmsetup", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(record, "identities", lambda sysfs, idents=None: swapped())
    monkeypatch.setattr(record, "resolve", functools.partial(record.resolve, superblock=sb_ok))
    monkeypatch.setattr(record, "in_use", lambda sysfs, node: None)  # no /dev/ubd* here
    return calls


def test_assemble_asks_and_refuses_unconfirmed(host: list[tuple[str, ...]]) -> None:
    plans: list[Plan] = []

    def no(plan: Plan) -> bool:
        plans.append(plan)
        return False

    with pytest.raises(UnsafeError) as exc:
        autoattach_ops.assemble(Sysfs(WB), "/dev/mapper/vc", ctl=Control(confirm=no))
    assert exc.value.exit_code == 3 and host == []
    assert "nothing was changed" in exc.value.message
    (plan,) = plans
    assert plan.command == "assemble vc"
    assert plan.lines[1] == ("origin: /dev/ubda, sys-path devices/platform/uml-blkdev.0, "
                             "268435456 bytes; blkid at create: no signature; now: not read")
    assert "over another disk they overwrite it" in plan.lines[-1]


def test_assemble_confirmed_goes_through_the_gate_and_journals(
        host: list[tuple[str, ...]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cachemgr.ops import gate

    gated: list[str] = []
    real = gate.gate

    def spy(subject: gate.Subject, action: str, **kw: Any) -> Any:
        gated.append(f"{action}: {sorted(subject.keys)}")
        return real(subject, action, **kw)

    monkeypatch.setattr(gate, "gate", spy)
    out = autoattach_ops.assemble(Sysfs(WB), "vc", ctl=Control(confirm=lambda p: True))
    assert out.exit_code == 0
    assert host[0][:2] == ("create", "vc")
    assert host[0][3] == "0 524288 cache /dev/ubdc /dev/ubdb /dev/ubda 128 1 writeback smq 0"
    assert gated == ["assemble dm-cache: ['disk-ubda', 'disk-ubdb', 'disk-ubdc', "
                     "'dmcache-vc', 'replace-vc']"]
    entry = json.loads((tmp_path / "state" / "autoattach" / "actions.jsonl").read_text()
                       .splitlines()[-1])
    assert (entry["kind"], entry["by"], entry["result"]) == ("dmcache-assemble", "admin", "done")


def test_assemble_of_an_unknown_or_assembled_name(host: list[tuple[str, ...]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from cachemgr.core.errors import UsageError

    with pytest.raises(UsageError, match="no dm-cache record of 'nope'"):
        autoattach_ops.assemble(Sysfs(WB), "nope")
    monkeypatch.setattr(autoattach_ops.dm_discover, "dm_devices", lambda sysfs: {"vc": None})
    with pytest.raises(AlreadyError):
        autoattach_ops.assemble(Sysfs(WB), "vc")
    assert host == []


# --------------------------------------------------------------------------- trust


@pytest.mark.parametrize("change,why", [
    (lambda p: os.chown(p, 1234, 0), "owned by uid 1234, not root"),
    (lambda p: os.chmod(p, 0o620), "writable by group or others (mode 0620)"),
])
def test_a_record_another_user_could_write_is_not_used(change: Any, why: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("the check is root's (as the policy file's)")
    path = record.save(REC)
    change(path)
    recs, bad = record.load_all()
    assert recs == []
    assert bad == [f"{path}: {why}; cachemgr does not use this dm-cache record (whoever can "
                   "change it chooses the disks a cache is assembled over); fix: check what "
                   f"it says, then chown root:root {path} && chmod 0600 {path}"]
    # status lists it nowhere as a device to assemble, the boot pass refuses it
    assert cache_ops.status(Sysfs(WB)).unassembled == ()
