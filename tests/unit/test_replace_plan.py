"""replace.plan on a captured lab tree (a bcache set whose SSD is a scsi_debug disk)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core import state
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import replace
from cachemgr.procedures.replace import bcache as replace_bcache
from cachemgr.procedures.replace import shared as replace_shared

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "scsi-ssd-in-use-uml" / "sys"


def test_two_runs_in_one_second_get_their_own_journal(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20261122-040812")
    sysfs = Sysfs(ROOT)
    ssd = snapshot.take(sysfs).cache_sets[0].caches[0].identity.node
    first = replace.plan(sysfs, ssd, replace.Options(yes=True))
    path = state.journal_path("replace", first.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")  # the first run's journal exists
    second = replace.plan(sysfs, ssd, replace.Options(yes=True))
    assert first.id == "20261122-040812-c2958027"
    assert second.id == first.id + "-2"


# --------------------------------------------------------------------------------------
# issue #15 item 4: everything checked at plan time, no step skipped silently


def _refused_before_any_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             root: Path, argv: list[str]) -> tuple[int, str]:
    """``cachemgr replace-ssd ARGV`` as root on ``root``: (exit code, stderr); asserts that
    nothing was written, run or journaled."""
    from tests.unit.guards import mutations_refused
    from tests.unit.test_state_files import cli
    from tests.unit.tui_helpers import kernel_writes

    state_dir = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(state_dir))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    writes = kernel_writes(monkeypatch)
    commands = mutations_refused(monkeypatch)
    rc, _out, err = cli(root, ["replace-ssd", *argv])
    assert "Traceback" not in err
    assert writes == [] and commands == [], (writes, commands)
    assert not list((state_dir / "replace").glob("*")) if (state_dir / "replace").is_dir() \
        else True
    assert "[1/" not in err  # no step started
    return rc, err


@pytest.mark.parametrize("new,says", [
    ("serial:", "--new serial: names no serial"),
    ("wwn:", "--new wwn: names no wwn"),
    ("wwn:  ", "names no wwn"),
    ("", "--new is empty"),
    ("   ", "--new is empty"),
    ("wwn:not-a-wwn", "'not-a-wwn' is not a WWN"),
    ("/dev/cachemgr-no-such-disk", "--new /dev/cachemgr-no-such-disk: no such block device"),
    ("/dev/ubda", "--new /dev/ubda: /dev/ubda is neither a SCSI disk nor an NVMe namespace"),
    ("/dev/sda", "--new /dev/sda is the SSD being replaced"),
    ("serial:2000", "is the SSD being replaced"),
    ("wwn:0x33333330000007d0", "is the SSD being replaced"),
])
def test_a_new_disk_that_cannot_be_used_is_refused_at_plan(
        new: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: these passed the plan and failed at step 9 (wait-new), after the old SSD was
    wiped and removed; --resume cannot change --new."""
    from tests.unit.tui_helpers import copy_capture

    root = copy_capture(tmp_path, "scsi-ssd-in-use")
    rc, err = _refused_before_any_step(tmp_path, monkeypatch, root,
                                       ["/dev/sda", "--new", new, "--yes"])
    assert rc == 2, err
    assert says in err


@pytest.mark.parametrize("new", ["/dev/sdb", "serial:3000", "wwn:naa.3333333000000bb8",
                                 "0:0:1:0"])
def test_a_new_disk_there_now_and_in_use_is_refused_at_plan(
        new: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sdb is held by a dm device: identify-new (step 10) would refuse it; the plan does."""
    from tests.unit.tui_helpers import copy_capture

    root = copy_capture(tmp_path, "scsi-ssd-in-use")
    rc, err = _refused_before_any_step(tmp_path, monkeypatch, root,
                                       ["/dev/sda", "--new", new, "--yes"])
    assert rc == 3, err
    assert "/dev/sdb is in use: /dev/sdb is held by dm-0" in err


def _without(root: Path, disk: str, *names: str) -> None:
    for n in names:
        (root / "block" / disk / "device" / n).unlink(missing_ok=True)


def test_an_old_ssd_without_wwid_and_serial_is_refused_at_plan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 3 (refused as unsafe, not bad input: the command is right, the disk is the
    problem): once its cache set is gone nothing tells the old SSD from another disk, so
    wipe-old and remove-old could not find it (they were skipped silently) and --new same
    could not wait for it."""
    from tests.unit.tui_helpers import copy_capture

    root = copy_capture(tmp_path, "scsi-ssd-in-use")
    _without(root, "sda", "wwid", "vpd_pg83", "serial", "vpd_pg80")
    rc, err = _refused_before_any_step(tmp_path, monkeypatch, root,
                                       ["/dev/sda", "--yes"])
    assert rc == 3, err
    assert "/dev/sda has neither a WWID nor a serial number" in err


def test_an_old_ssd_without_wwid_is_followed_by_its_serial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.tui_helpers import copy_capture

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    root = copy_capture(tmp_path, "scsi-ssd-in-use")
    _without(root, "sda", "wwid", "vpd_pg83")
    sysfs = Sysfs(root)
    j = replace.plan(sysfs, "/dev/sda", replace.Options(yes=True))
    assert (j.old["wwid"], j.old["serial"]) == (None, "2000")
    said: list[str] = []
    c = replace.Ctx(sysfs, j, replace.Options(**j.options), said.append, lambda t: None)
    old = replace_shared.old_present(c)
    assert old is not None and old.name == "sda"
    assert replace_shared.wait_new_match(c).words() == "serial:2000"


def test_an_old_ssd_that_is_gone_is_said_not_skipped_silently(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = Sysfs(ROOT)
    j = replace.plan(sysfs, "/dev/sda", replace.Options(yes=True))
    j.old["wwid"] = "naa.0000000000000001"  # no disk has it: removed by an earlier run
    said: list[str] = []
    c = replace.Ctx(sysfs, j, replace.Options(**j.options), said.append, lambda t: None)
    replace_bcache.s_wipe_old(c)
    replace_shared.s_remove_old(c)
    assert said == [
        "the old SSD (wwn naa.0000000000000001) is not there any more: nothing to wipe",
        "the old SSD (wwn naa.0000000000000001) is not there any more: already removed"]
    c.opts.wipe_old = False
    replace_bcache.s_wipe_old(c)
    assert said[-1] == "/dev/sda: bcache signature kept (--keep-old-signature)"


def test_a_good_new_spec_passes_the_plan(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Not yet inserted (nothing matches now) is fine for wwn:, serial: and H:C:T:L."""
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path))
    sysfs = Sysfs(ROOT)
    for new in ("same", "any", "wwn:naa.5000000000000001", "serial:NEW1", "0:0:0:0",
                "naa.5000000000000001"):
        j = replace.plan(sysfs, "/dev/sda", replace.Options(new=new, yes=True))
        assert j.options["new"] == new


# --------------------------------------------------------------------------------------
# issue #17 item 3: an NVMe cache SSD (capture nvme-pair-qemu: nvme0n1 the cache device of a
# registered set, nvme1n1 blank, each namespace alone on its controller)

NVME = Path(__file__).resolve().parents[1] / "fixtures" / "nvme-pair-qemu" / "sys"


def test_an_nvme_cache_ssd_is_planned_with_its_pci_slot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path))
    sysfs = Sysfs(NVME)
    j = replace.plan(sysfs, "/dev/nvme0n1", replace.Options(yes=True))
    assert (j.old["bus"], j.old["slot"], j.old["controller"], j.old["serial"]) == (
        "nvme", "0000:01:00.0", "nvme0", "CMLABNVME00")
    plan = "\n".join(replace.describe(j))
    assert "/dev/nvme0n1 (PCI 0000:01:00.0; nvme.1b36-" in plan
    # the method it will use, recorded for --resume (slot power: never, docs/kernel-notes.md)
    assert j.old["method"] == "pci-remove-rescan"
    assert "hotplug: PCI remove/rescan (PCI function 0000:01:00.0 removed" in plan
    assert " 8. remove-old " in plan
    c = replace.Ctx(sysfs, j, replace.Options(**j.options), lambda m: None, lambda t: None)
    assert replace_shared.wait_new_match(c) == replace_shared.old_match(j.old)
    assert replace_shared.wait_new_match(c).kind == "wwn"
    found = replace_shared.old_present(c)
    assert found is not None and found.name == "nvme0n1"
    # --new any waits for a drive in the same PCIe slot
    j2 = replace.plan(sysfs, "/dev/nvme0n1", replace.Options(new="any", yes=True))
    c2 = replace.Ctx(sysfs, j2, replace.Options(**j2.options), lambda m: None, lambda t: None)
    assert replace_shared.wait_new_match(c2).words() == "0000:01:00.0"
    assert "a new disk in the same slot (PCI 0000:01:00.0)" in replace.new_words(j2)
    # a drive not inserted yet, by serial or WWID, or whatever goes into the old slot
    for new in ("serial:CMLABNVME09", "wwn:eui.0025385b71b07a3c", "0000:01:00.0"):
        assert replace.plan(sysfs, "/dev/nvme0n1",
                            replace.Options(new=new, yes=True)).options["new"] == new


@pytest.mark.parametrize("new,rc,says", [
    ("/dev/vda", 2, "/dev/vda is neither a SCSI disk nor an NVMe namespace"),
    ("serial:CMLABNVME00", 2, "is the SSD being replaced"),
    # the other controller's namespace, named any way: 64 MiB, too small for the old
    # cache's 128 KiB buckets
    ("/dev/nvme1n1", 3, "/dev/nvme1n1 (67108864 bytes) is too small"),
    ("serial:CMLABNVME01", 3, "/dev/nvme1n1 (67108864 bytes) is too small"),
    ("0000:02:00.0", 3, "/dev/nvme1n1 (67108864 bytes) is too small"),
])
def test_a_wrong_new_nvme_spec_is_refused_at_plan(
        new: str, rc: int, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.tui_helpers import copy_capture

    root = copy_capture(tmp_path, "nvme-pair")
    got, err = _refused_before_any_step(tmp_path, monkeypatch, root,
                                        ["/dev/nvme0n1", "--new", new, "--yes"])
    assert got == rc and says in err, err


def test_a_shared_nvme_controller_is_refused_at_plan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second namespace on the cache SSD's controller (the capture's nvme0n1 files again,
    nsid 2): pulling the controller would take it too."""
    import os
    import shutil

    from tests.unit.tui_helpers import copy_capture

    root = copy_capture(tmp_path, "nvme-pair")
    src = Path(os.path.realpath(root / "block" / "nvme0n1"))
    sib = src.parent / "nvme0n2"
    shutil.copytree(src, sib, symlinks=True)
    shutil.rmtree(sib / "bcache")
    for h in (sib / "holders").iterdir():
        h.unlink()
    (sib / "nsid").write_text("2\n")
    os.symlink(os.path.relpath(sib, root / "block"), root / "block" / "nvme0n2")
    rc, err = _refused_before_any_step(tmp_path, monkeypatch, root, ["/dev/nvme0n1", "--yes"])
    assert rc == 3, err
    assert "/dev/nvme0n1 could not be pulled after its cache is released" in err
    assert "controller nvme0 also carries /dev/nvme0n2" in err


def test_a_journal_of_an_earlier_version_reads_its_scsi_remove_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path))
    j = replace.plan(Sysfs(ROOT), "/dev/sda", replace.Options(yes=True))
    j.save()
    data = json.loads(j.path.read_text())
    for k in ("bus", "slot"):
        del data["old"][k]
    data["done"] = ["preflight", "remember", "mode-interim", "drain", "detach", "unregister",
                    "wipe-old", "scsi-remove"]
    j.path.write_text(json.dumps(data))
    back = replace.Journal.load(j.id)
    assert back.done[-1] == "remove-old"
    c = replace.Ctx(Sysfs(ROOT), back, replace.Options(new="any", yes=True), lambda m: None,
                    lambda t: None)
    assert replace_shared.wait_new_match(c).kind == "slot"
    assert replace_shared.wait_new_match(c).value == data["old"]["hctl"]


# --------------------------------------------------------------------------------------
# issue #17 item 5: a second plan on a cache with an unfinished run is refused; --list CACHE
# and the Ansible module find that run by the cache's name alone


def _unfinished_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> replace.Journal:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    j = replace.plan(Sysfs(ROOT), "/dev/sda", replace.Options(yes=True))
    j.mark("preflight")
    j.mark("remember")
    j.mark("mode-interim")  # killed here: the set's mode is none now
    return j


def test_a_second_plan_on_a_cache_with_an_unfinished_run_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cachemgr.core.errors import UnsafeError
    from cachemgr.ops import replace as ops

    j = _unfinished_run(tmp_path, monkeypatch)
    for spec in ("/dev/sda", j.cset, j.cset.upper()):
        with pytest.raises(UnsafeError) as e:
            ops.plan(Sysfs(ROOT), spec, replace.Options(yes=True))
        assert f"run {j.id} on cset {j.cset} is unfinished" in e.value.message
        assert "last step done: mode-interim" in e.value.message
        assert e.value.hint == f"cachemgr replace-ssd --resume {j.id} (or --rollback {j.id})"
    j.status = "rolled-back"
    j.save()
    assert ops.plan(Sysfs(ROOT), "/dev/sda", replace.Options(yes=True)).cset == j.cset


def test_a_run_is_named_by_its_cache_or_old_ssd_after_the_ssd_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j = _unfinished_run(tmp_path, monkeypatch)
    wwid = j.old["wwid"]
    assert wwid.startswith("naa.")
    for spec in (j.cset, "/dev/sda", "sda", wwid, "wwn:0x" + wwid[4:], " /dev/sda "):
        assert replace.named_by(j, spec), spec
    for spec in ("", "/dev/sdb", j.cset[:8], "vg0/lv", "naa.5000000000000001"):
        assert not replace.named_by(j, spec), spec
    lvm = replace.Journal(id="x", cset="vg0/vm1", options={}, old={}, backings=[], kind="lvm")
    assert replace.named_by(lvm, "/dev/vg0/vm1") and replace.named_by(lvm, "/dev/mapper/vg0-vm1")
    assert not replace.named_by(lvm, "vg0/vm2")
    dm = replace.Journal(id="y", cset="vc", options={}, old={}, backings=[], kind="dmcache")
    assert replace.named_by(dm, "vc") and replace.named_by(dm, "/dev/mapper/vc")
    assert not replace.named_by(dm, "vc2")


def test_list_with_a_cache_shows_only_that_caches_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cachemgr.ops import replace as ops

    j = _unfinished_run(tmp_path, monkeypatch)
    other = replace.Journal(id="20261123-000000-vc", cset="vc", options={}, old={},
                            backings=[], kind="dmcache")
    other.save()
    assert [r["id"] for r in ops.list_runs("/dev/sda").data["runs"]] == [j.id]
    assert [r["id"] for r in ops.list_runs("/dev/mapper/vc").data["runs"]] == [other.id]
    assert {r["id"] for r in ops.list_runs().data["runs"]} == {j.id, other.id}
    assert ops.list_runs("/dev/sdz").data["runs"] == []


def test_ansible_module_resumes_the_run_on_its_cache_not_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Check mode (nothing run): the module asks the real CLI for the cache's runs."""
    import subprocess
    import sys

    j = _unfinished_run(tmp_path, monkeypatch)
    later = replace.Journal(id="20991231-235959-vc", cset="vc", options={}, old={},
                            backings=[], kind="dmcache", status="failed")
    later.save()  # newer, unfinished, on another cache
    repo = Path(__file__).resolve().parents[2]
    wrapper = tmp_path / "cachemgr"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m cachemgr --sysfs-root {ROOT} "
                       '"$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(repo / "ansible"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "al"), "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ar"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
           "PYTHONPATH": str(repo)}
    out = {}
    for cache in ("/dev/sda", "vc"):
        r = subprocess.run(
            [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,",
             "-c", "local", "-C", "-m", "cachemgr.cachemgr.cachemgr_replace_ssd",
             "-a", f"cache={cache} cachemgr_bin={wrapper}"],
            capture_output=True, text=True, env=env, timeout=120, cwd=repo)
        assert r.returncode == 0, r.stdout + r.stderr
        out[cache] = r.stdout
    assert f'"resume": "{j.id}"' in out["/dev/sda"]
    assert f'"resume": "{later.id}"' in out["vc"]
