"""``check`` never says OK while data is at risk (issue #41 items 2, 6, 7): the failed
requests the kernel logged for a device-mapper cache's SSD (backends/kernlog.py), an
unreadable or untrusted dm-cache record, a bcache backing device gone while dirty, the
scan's warnings; the disk a drain blames; the ERR cell of a bcache device; ENOSPC in the
state directory naming its file. On captured lab trees (tests/fixtures/dmcache-ssd-errors-uml:
a writeback dm-cache whose scsi_debug SSD fails reads, with the kernel log of that boot)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import json
import logging
import os
from pathlib import Path

import pytest

from cachemgr.backends import kernlog, snapshot
from cachemgr.cli.main import main
from cachemgr.core.model import CacheState, GoneBacking, Size
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import render
from cachemgr.procedures import drain, health
from tests.unit.tui_helpers import copy_capture

SSD_ERRORS = "dmcache-ssd-errors"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def run(root: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--sysfs-root", str(root), *argv])
    logging.root.handlers.clear()
    return rc, out.getvalue(), err.getvalue()


def findings(root: Path) -> tuple[int, list[dict[str, str]]]:
    rc, out, _ = run(root, "check", "--json")
    return rc, json.loads(out)["findings"]


# -- the kernel log ---------------------------------------------------------------------


@pytest.mark.parametrize(("message", "want"), [
    # 7.2 (the lab: tests/fixtures/dmcache-ssd-errors-uml/kmsg.txt)
    ("critical medium error, dev sda, sector 512 op 0x0:(READ) flags 0x800 phys_seg 16 prio "
     "class 2", ("sda", "critical medium", "READ")),
    # before 5.18: blk_update_request's prefix
    ("blk_update_request: I/O error, dev sdb, sector 2048 op 0x1:(WRITE) flags 0x0 phys_seg 1 "
     "prio class 0", ("sdb", "I/O", "WRITE")),
    # before 5.0: no operation
    ("print_req_error: I/O error, dev nvme0n1, sector 8", ("nvme0n1", "I/O", None)),
    ("Buffer I/O error on dev sda, logical block 40944, async page read", None),
    ("sd 0:0:0:0: [sda] tag#131 Sense Key : 0x3 [current]", None),
    ("blk_print_req_error: 8 callbacks suppressed", None),
])
def test_the_block_layer_s_failed_requests_and_nothing_else(message: str,
                                                           want: tuple[str, str, str] | None
                                                           ) -> None:
    got = kernlog.parse(1.0, message)
    assert (None if got is None else (got.disk, got.what, got.op)) == want


def test_a_kmsg_record_s_clock_and_message() -> None:
    x = kernlog.parse_record("3,125,9180000,-;critical medium error, dev sda, sector 0 op "
                             "0x0:(READ) flags 0x800 phys_seg 16 prio class 2\n SUBSYSTEM=x")
    assert x is not None and (x.at, x.disk, x.op) == (9.18, "sda", "READ")
    assert kernlog.parse_record("no header") is None


def test_the_capture_s_log_smartctl_logged_nothing_the_reads_did(tmp_path: Path) -> None:
    """The capture ran smartctl before the reads failed: its probing raised the disk's
    ioerr_cnt (0x3: 2 of smartctl's, 1 failed read) but logged no failed request."""
    root = copy_capture(tmp_path, SSD_ERRORS)
    sysfs = Sysfs(str(root))
    reader = kernlog.Reader(sysfs)
    logged = reader.read()
    assert logged and {x.disk for x in logged} == {"sda"}
    assert {x.op for x in logged} == {"READ"}
    (errs,) = kernlog.summarise(logged, ["sda"], reader.now)
    assert errs.disk == "/dev/sda" and errs.count == len(logged)
    ioerr = sysfs.read("block/sda/device/ioerr_cnt")
    assert int(ioerr, 16) > 0  # the counter a check would misread


def test_an_error_older_than_the_window_no_longer_counts() -> None:
    old = kernlog.parse(10.0, "I/O error, dev sdc, sector 1 op 0x0:(READ) flags 0")
    new = kernlog.parse(10.0 + kernlog.RECENT - 5, "I/O error, dev sdc, sector 1 op 0x0:(READ)")
    assert old is not None and new is not None
    (e,) = kernlog.summarise([old, new], ["sdc"], now=10.0 + kernlog.RECENT + 1)
    assert e.count == 2  # summarise counts what it is given: the reader drops the old one

    class Fixed(kernlog.Reader):
        def _records(self):  # type: ignore[no-untyped-def]
            yield "3,1,10000000,-;I/O error, dev sdc, sector 1 op 0x0:(READ) flags 0"
            yield f"3,2,{int((10 + kernlog.RECENT - 5) * 1e6)},-;I/O error, dev sdc, sector 1"

    got = Fixed(Sysfs("/nonexistent")).read(now=10.0 + kernlog.RECENT + 1)
    assert [x.at for x in got] == [10 + kernlog.RECENT - 5]


def test_disks_under_a_dm_device_are_its_slaves(tmp_path: Path) -> None:
    sysfs = Sysfs(str(copy_capture(tmp_path, SSD_ERRORS)))
    snap = snapshot.take(sysfs)
    (d,) = snap.dmcaches
    assert d.cache is not None and kernlog.disks_under(sysfs, d.cache.name) == ["sda"]
    assert sorted(kernlog.disks_under(sysfs, d.kernel_name)) == ["sda", "ubda", "ubdc"]


# -- the health model: dm-cache SSD errors ------------------------------------------------


def test_a_dm_cache_whose_ssd_fails_reads_while_dirty_is_critical(tmp_path: Path) -> None:
    root = copy_capture(tmp_path, SSD_ERRORS)
    rc, found = findings(root)
    assert rc == 2, found
    (f,) = found
    assert (f["level"], f["code"], f["device"]) == ("CRITICAL", "failing-cache-dirty",
                                                    "/dev/mapper/vmcache")
    assert "cache SSD /dev/sda, which fails IO" in f["what"] and "READ" in f["what"]
    assert f["next"] == "cachemgr mode /dev/mapper/vmcache writethrough --drain"
    rc, out, _ = run(root, "status", "--no-vms")
    assert "CRITICAL: /dev/mapper/vmcache: " in out and "/dev/sda" in out


def test_without_the_log_s_lines_the_same_ssd_is_ok(tmp_path: Path) -> None:
    """What makes it CRITICAL is the failed requests, not the counter smartctl raised."""
    root = copy_capture(tmp_path, SSD_ERRORS)
    kmsg = root.parent / "kmsg.txt"
    kmsg.write_text("".join(line + "\n" for line in kmsg.read_text().splitlines()
                            if " error, dev " not in line))
    rc, found = findings(root)
    assert (rc, found) == (0, [])


def test_a_clean_dm_cache_on_a_failing_ssd_is_a_warning(tmp_path: Path) -> None:
    sysfs = Sysfs(str(copy_capture(tmp_path, SSD_ERRORS)))
    snap = cache_ops.status(sysfs)
    assert snap.cache_errors and snap.cache_errors[0][0] == "/dev/mapper/vmcache"
    (d,) = snap.dmcaches
    assert d.status is not None
    clean = dataclasses.replace(snap, dmcaches=(
        dataclasses.replace(d, status=dataclasses.replace(d.status, dirty=0)),))
    (f,) = health.assess(clean)
    assert (f.level, f.code, f.device) == (health.Level.WARNING, "cache-io-errors", "/dev/sda")
    assert f.next == "cachemgr replace-ssd /dev/mapper/vmcache --dry-run"


# -- records ------------------------------------------------------------------------------


def _records_dir() -> Path:
    d = Path(os.environ["CACHEMGR_DMCACHE_DIR"])
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


@pytest.mark.parametrize("how", ["truncated", "symlink"])
def test_an_unreadable_record_is_critical(tmp_path: Path, how: str) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    d = _records_dir()
    if how == "truncated":
        (d / "vc.json").write_text('{"name": "vc", "mode": "writeb')
        os.chmod(d / "vc.json", 0o600)
    else:
        target = tmp_path / "elsewhere.json"
        target.write_text("{}")
        os.symlink(target, d / "vc.json")
    rc, found = findings(root)
    assert rc == 2, found
    (f,) = [f for f in found if f["code"] == "bad-record"]
    assert f["level"] == "CRITICAL" and f["device"] == str(d / "vc.json")
    assert "/dev/mapper/vc is not assembled" in f["what"]
    assert f["next"].startswith(f"look at {d / 'vc.json'}") and "cachemgr autoattach" in \
        f["next"]


def test_an_unreadable_record_of_an_assembled_device_is_a_warning(tmp_path: Path) -> None:
    root = copy_capture(tmp_path, "dmcache-writeback")
    d = _records_dir()
    (d / "vmcache.json").write_text("")
    os.chmod(d / "vmcache.json", 0o600)
    rc, found = findings(root)
    assert rc == 1, found
    (f,) = found
    assert (f["level"], f["code"]) == ("WARNING", "bad-record")
    assert "boot pass will not assemble it again" in f["what"]


# -- a bcache backing device gone while dirty ---------------------------------------------


def test_check_remembers_dirty_backing_devices_and_forgets_clean_ones(tmp_path: Path) -> None:
    snap = snapshot.take(Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty"))))
    (b,) = snap.backings
    assert b.uuid and b.cset_uuid and (b.dirty_bytes or 0) > 0
    kept = health.remember(snap, [], 100.0)
    assert [(g.uuid, g.node, g.device, g.dirty_bytes) for g in kept] == [
        (b.uuid, b.identity.node, b.device, b.dirty_bytes)]
    gone_snap = dataclasses.replace(snap, backings=())
    assert health.gone(gone_snap, kept) == kept
    assert health.remember(gone_snap, kept, 200.0) == kept  # kept while gone
    clean = dataclasses.replace(snap, backings=(dataclasses.replace(
        b, dirty=Size.exact(0), rate_debug=None, state=CacheState.CLEAN),))
    # seen again: no longer gone; clean: forgotten
    assert health.gone(clean, kept) == []
    assert health.remember(clean, kept, 300.0) == []


def test_a_backing_device_gone_while_dirty_is_critical(tmp_path: Path) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    snap = snapshot.take(Sysfs(str(root)))
    (c,) = snap.cache_sets
    health.save_remembered([GoneBacking("0b1e2f00-0000-4000-8000-00000000abcd", "/dev/sdq",
                                        "/dev/bcache7", c.uuid, 32 << 20, 1.0)])
    rc, found = findings(root)
    assert rc == 2, found
    (f,) = found
    assert (f["level"], f["code"], f["device"]) == ("CRITICAL", "backing-gone-dirty",
                                                    "/dev/sdq")
    ssd = c.caches[0].identity.node
    assert "of /dev/bcache7 gone; 32.0 MiB of its data was dirty on cache set " \
        f"{c.uuid[:8]} (SSD {ssd})" in f["what"]
    assert f["next"] == "bring /dev/sdq back (reseat it, rescan its bus), then cachemgr " \
        "register /dev/sdq"
    # a poll's scan (no superblocks read) cannot tell gone from unregistered: says nothing
    assert cache_ops.status(Sysfs(str(root)), probe_unregistered=False).gone == ()


# -- the scan's warnings ------------------------------------------------------------------


def test_a_scan_warning_is_never_ok(tmp_path: Path) -> None:
    snap = snapshot.take(Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty"))))
    assert health.assess(snap) == []
    found = health.assess(dataclasses.replace(snap, warnings=(
        "bcache0: dirty_data: bad", "LVM's view not read (lvs): no lvm")))
    assert [(f.level, f.code, f.device, f.what) for f in found] == [
        (health.Level.WARNING, "scan-warning", "bcache0", "dirty_data: bad"),
        (health.Level.WARNING, "scan-warning", "host",
         "not read: LVM's view not read (lvs): no lvm")]
    # a device another finding is about: that finding says it (dmcache-failed: the kernel
    # failed the cache, and the scan warns of the same)
    failed = snapshot.take(Sysfs(str(copy_capture(tmp_path, "dmcache-failed"))))
    assert failed.warnings
    assert [f.code for f in health.assess(failed)] == ["failed-cache"]


# -- the right disk -----------------------------------------------------------------------


def test_a_backing_row_shows_its_ssd_s_errors(tmp_path: Path) -> None:
    from tui import view

    snap = snapshot.take(Sysfs(str(copy_capture(tmp_path, "bcache-writeback-dirty"))))
    c = snap.cache_sets[0]
    sick = dataclasses.replace(c, caches=tuple(dataclasses.replace(x, io_errors=4)
                                               for x in c.caches))
    snap = dataclasses.replace(snap, cache_sets=(sick,))
    table = render.status_table(snap)
    row = next(line for line in table.splitlines() if line.startswith("└/dev/bcache0"))
    assert " 0+4 SSD " in row, table
    rows = view.rows(snap)
    (b,) = [r for r in rows if r.device.endswith("bcache0")]
    assert b.errors == "0+4 SSD" and b.alert
    # bcache counted the SSD's failed reads of dirty data on the backing device too: the
    # finding says so instead of blaming the backing disk alone
    (bb,) = snap.backings
    both = dataclasses.replace(snap, backings=(dataclasses.replace(bb, io_errors=3),))
    (f,) = [f for f in health.assess(both) if f.code == "backing-io-errors"]
    assert f.what == (f"3 IO errors on its backing device {bb.identity.node}, or failed reads "
                      f"of its dirty data on cache SSD {c.caches[0].identity.node} (bcache "
                      "counts those there too)")


def test_a_stopped_drain_names_the_ssd_the_log_names(tmp_path: Path) -> None:
    """bcache counts a failed read of dirty data from the SSD as a backing device error and
    says "too many IO errors on backing device"; the drain names the disk the block layer
    logged failing (here the capture's /dev/sda)."""
    sysfs = Sysfs(str(copy_capture(tmp_path, SSD_ERRORS)))
    b = snapshot.take(Sysfs(str(copy_capture(tmp_path / "b", "bcache-writeback-dirty")))
                      ).backings[0]
    b = dataclasses.replace(b, identity=dataclasses.replace(b.identity, name="ubda",
                                                            node="/dev/ubda"))
    err = drain._gone(sysfs, b, "/dev/bcache0", "f00", ["/dev/sda"])
    assert "its cache SSD /dev/sda fails" in err.message and "repair" not in err.message
    assert err.hint is not None and "cachemgr register /dev/sda /dev/ubda" in err.hint
    assert "repair /dev/ubda" not in err.hint
    # no failed request logged for the SSD: the backing device, as before
    err = drain._gone(sysfs, b, "/dev/bcache0", None, ["/dev/sdz"])
    assert err.hint is not None and err.hint.startswith("repair /dev/ubda")


def test_a_stalled_flush_names_the_failing_cache_device(tmp_path: Path) -> None:
    sysfs = Sysfs(str(copy_capture(tmp_path, SSD_ERRORS)))
    hint = kernlog.stall_hint(sysfs, "sda", "ubda", "check the origin")
    assert hint.startswith("its cache device /dev/sda fails (") and "origin" not in hint
    assert kernlog.stall_hint(sysfs, "sdz", "ubda", "check the origin") == "check the origin"


# -- ENOSPC in the state directory ----------------------------------------------------------


def test_enospc_in_the_state_directory_names_the_file(tmp_path: Path, state_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    rc, _, err = run(root, "tune", "/dev/bcache0", "writeback_percent=20")
    assert rc == 1, err
    first = err.splitlines()[0]
    assert first.startswith(f"cachemgr: {state_dir}/locks/") and first.endswith(
        ".lock: No space left on device"), err
    assert "hint: free space on the filesystem holding " + str(state_dir) in err
