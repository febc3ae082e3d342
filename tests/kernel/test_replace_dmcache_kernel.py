"""SSD replacement under a plain dm-cache device (issue #17 item 4), on the lab kernel:
/dev/mapper/vc over a dm-delay "HDD", its cache and metadata on a scsi_debug SSD (two GPT
partitions, or two dm-linear areas), fio writing and verifying on /dev/mapper/vc throughout.
Checked: zero IO and verify errors, the region written before (part of it dirty on the SSD)
read back and verified after, the table (block size, policy, migration_threshold, mode) back,
the cache on the new SSD's areas; a kill after every step resumes to that same end state."""

from __future__ import annotations

import json
import os

import pytest

from cachemgr.backends import scsi
from cachemgr.backends.dmcache import command, discover
from cachemgr.backends.dmcache import record as dm_record
from cachemgr.core import runner
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import replace
from cachemgr.procedures.replace import dmcache as replace_dmcache
from tests.kernel.test_replace_kernel import (
    FIO_COMMON,
    cm,
    cm_here,
    report_times,
    start_load,
    stop_load,
    verify_pre,
)

THRESHOLD = "4096"  # not the kernel's default: the rebuilt table must carry it


def dm(*args: str) -> str:
    return runner.run(["dmsetup", *args], timeout=60).stdout


def setup(lab_disks: list[str], layout: str, hosts: int = 1
          ) -> tuple[Sysfs, list[scsi.ScsiDisk]]:
    sysfs = Sysfs()
    ssds = list(scsi.load_scsi_debug(sysfs, dev_size_mb=160, per_host_store=1,
                                     add_host=hosts))
    ssd = ssds[0]
    sectors = runner.run(["blockdev", "--getsz", lab_disks[0]]).stdout.strip()
    dm("create", "slowhdd", "--table", f"0 {sectors} delay {lab_disks[0]} 0 2")
    if layout == "partitions":
        runner.run(["sfdisk", "--quiet", ssd.node],
                   input="label: gpt\nsize=16MiB\nsize=128MiB\n", timeout=60)
        runner.run(["blockdev", "--rereadpt", ssd.node])
        meta, cache = f"{ssd.node}1", f"{ssd.node}2"
    else:
        dm("create", "vc-meta", "--table", f"0 32768 linear {ssd.node} 0")
        dm("create", "vc-cdata", "--table", f"0 262144 linear {ssd.node} 32768")
        meta, cache = "/dev/mapper/vc-meta", "/dev/mapper/vc-cdata"
    r = cm_here("create", "dm-cache", "vc", "--origin", "/dev/mapper/slowhdd", "--cache", cache,
                "--metadata", meta, "--mode", "writeback", "--block-size", "64k")
    assert r.returncode == 0, r.stderr
    dm("message", "vc", "0", "migration_threshold", "1")  # hold the dirty blocks
    runner.run(["fio", "--name=pre", "--filename=/dev/mapper/vc", "--rw=randwrite",
                "--offset=64M", "--size=32M", "--do_verify=0", *FIO_COMMON,
                "--output-format=json"], timeout=300)
    d = discover.find(sysfs, "vc")
    assert d.status is not None and d.status.dirty > 0, "no dirty data to protect"
    dm("message", "vc", "0", "migration_threshold", THRESHOLD)
    return sysfs, ssds


def devno(node: str) -> str:
    st = os.stat(node)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def table_words() -> list[str]:
    return command.read_table("vc").split()


def end_state(sysfs: Sysfs, before: list[str], areas: tuple[str, str],
              unproven: tuple[str, ...] = ("origin",)) -> None:
    """The same table but for the cache and metadata devices, which are ``areas`` now."""
    after = table_words()
    assert after[2] == "cache" and after[:3] == before[:3]
    # block size, features (mode), policy; the threshold set by a message is in the table now
    assert before[-1] == "0" and after[6:] == [*before[6:-1], "2", "migration_threshold",
                                               THRESHOLD], (before, after)
    assert after[3:5] == [devno(n) for n in areas], after
    d = discover.find(sysfs, "vc")
    assert d.status is not None and d.failure is None
    # the record (create dm-cache wrote it) names these areas: found as recorded. Areas on
    # the scsi_debug SSD's partitions are proven by its WWN; dm devices made here without a
    # UUID (the dm-delay origin, the linear areas) are known by their name only, which the
    # boot pass leaves to `cachemgr assemble vc` (backends/dmcache/record.py, issue #41)
    rec = dm_record.load("vc")
    assert rec is not None
    res = dm_record.resolve(rec, dm_record.identities(sysfs))
    assert res.found, res.problems
    assert [r for r, _ in res.unproven] == list(unproven), res.unproven
    assert [devno(res.nodes[r]) for r in ("metadata", "cache")] == after[3:5], res.nodes


def kill_and_resume(sysfs: Sysfs, step: str, before: list[str], wwid: str | None) -> None:
    """A run killed (SIGKILL) right after ``step`` is journaled, resumed to the end state."""
    r = cm("replace-ssd", "/dev/mapper/vc", "--yes", env={replace.KILL_AFTER_ENV: step})
    assert r.returncode == -9, (step, r.returncode, r.stderr)
    runs = [j for j in replace.list_runs() if j.status == "running"]
    assert len(runs) == 1 and runs[0].done[-1] == step and runs[0].kind == "dmcache"
    r = cm_here("replace-ssd", "--resume", runs[0].id, "--json")
    assert r.returncode == 0, (step, r.stderr)
    res = json.loads(r.stdout)
    assert res["status"] == "done" and res["new"]["wwid"] == wwid
    node = res["new"]["node"]
    end_state(sysfs, before, (f"{node}1", f"{node}2"))


@pytest.mark.kernel(disks="512M", timeout=1200, mem=2048)
def test_dmcache_partitions_replaced_killed_after_every_step(lab_disks: list[str]) -> None:
    """Under the verify load: the plan, and a run killed after its drain (the device linear
    over its origin while the load goes on) and resumed. Then, the load stopped (a drain of
    hot blocks under a zipf load takes ~40 s on UML; the steps after it do not care), a run
    killed after each of the other steps."""
    sysfs, ssds = setup(lab_disks, "partitions")
    before = table_words()
    load = start_load(["/dev/mapper/vc"])
    try:
        r = cm("replace-ssd", "vc", "--dry-run")
        assert r.returncode == 0, r.stderr
        assert "partition 2" in r.stdout and "release-old" in r.stdout, r.stdout
        assert table_words() == before and not replace.list_runs()
        kill_and_resume(sysfs, "drain", before, ssds[0].wwid)
    finally:
        stop_load(load)
    # every step after the drain but the last two (the check, and warm: skipped without
    # --warm)
    assert replace_dmcache.STEPS[-1][0] == "warm"
    for name, _ in replace_dmcache.STEPS[3:-2]:
        kill_and_resume(sysfs, name, before, ssds[0].wwid)
    verify_pre(["/dev/mapper/vc"])


@pytest.mark.kernel(disks="512M", timeout=900, mem=2048)
def test_dmcache_linear_areas_moved_to_another_disk_and_refusals(
        lab_disks: list[str]) -> None:
    sysfs, ssds = setup(lab_disks, "linear", hosts=2)
    before = table_words()
    # refused before any step: a third area on the SSD that something else uses
    dm("create", "squatter", "--table", f"0 2048 linear {ssds[0].node} 300000")
    r = cm("replace-ssd", "vc", "--yes")
    assert r.returncode == 3 and "could not be pulled" in r.stderr, r.stderr
    assert "/dev/mapper/squatter" in r.stderr and not replace.list_runs()
    dm("remove", "squatter")
    # the other SSD, in use: refused at plan
    dm("create", "hold", "--table", f"0 2048 linear {ssds[1].node} 0")
    r = cm("replace-ssd", "vc", "--new", ssds[1].node, "--yes")
    assert r.returncode == 3 and "in use" in r.stderr, r.stderr
    dm("remove", "hold")
    # a run killed after its drain (the device linear over its origin), rolled back: the
    # cache is back on the old SSD's areas, cold, with its table
    r = cm("replace-ssd", "vc", "--yes", env={replace.KILL_AFTER_ENV: "drain"})
    assert r.returncode == -9, r.stderr
    assert table_words()[2] == "linear"
    (run,) = replace.list_runs()
    r = cm_here("replace-ssd", "--rollback", run.id)
    assert r.returncode == 0, r.stderr
    end_state(sysfs, before, ("/dev/mapper/vc-meta", "/dev/mapper/vc-cdata"),
              ("origin", "cache", "metadata"))
    d = discover.find(sysfs, "vc")
    assert d.status is not None and d.status.dirty == 0 and d.status.used == 0  # cold
    assert replace.Journal.load(run.id).status == "rolled-back"
    load = start_load(["/dev/mapper/vc"])
    try:
        r = cm("replace-ssd", "vc", "--new", f"wwn:{ssds[1].wwid}", "--yes", "--json")
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["new"]["wwid"] == ssds[1].wwid != ssds[0].wwid
        report_times("dmcache-scsi-other-ssd", res)
        end_state(sysfs, before, ("/dev/mapper/vc-meta", "/dev/mapper/vc-cdata"),
                  ("origin", "cache", "metadata"))
        # the areas lie on the new SSD now, at their old offsets
        assert dm("table", "vc-cdata").split()[3:] == [devno(res["new"]["node"]), "32768"]
        assert ssds[0].wwid not in {d.wwid for d in scsi.disks(sysfs)}  # pulled
    finally:
        stop_load(load)
    verify_pre(["/dev/mapper/vc"])
