"""A poller's reads of the state directory (issue #34 item 3): ``ops.cache.status`` with a
ScanCache walks the state directory once a poll and keeps what did not change since the last
one (core/state.py ``Kept``, ``polled``), and says what a one-shot ``status`` says at every
poll: a lock holder that dies shows as interrupted at the next poll (its liveness is read
from /proc/locks every time: a death changes no file), and a journal, a protect record or a
dm-cache record made or removed shows at the next poll.

Every poll here is compared with ``status`` without a ScanCache (which keeps nothing: the
code before this change). The Kept keeps nothing that changed in the last 2 s (a second
change within the file system's timestamp tick would leave the times as they were), so the
tests run twice: ``recent``, as the files are (every poll reads them again), and ``kept``,
the wall clock an hour on so that everything is kept, each change given timestamps of its
own (as a change a tick later has): what a poller meets once its state directory has been
left alone for a while."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachemgr.backends.dmcache import record
from cachemgr.core import state, undo
from cachemgr.core.model import CacheMode, Snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.procedures import replace

REPO = Path(__file__).resolve().parents[2]
FX = REPO / "tests" / "fixtures"
WB = Sysfs(FX / "dmcache-writeback-uml" / "sys")  # vmcache; its records dir: conftest's
UUID = "0d6d0a6c-0000-0000-0000-000000000000"
CSET = "c2958027-0000-0000-0000-000000000000"
DEV = record.DeviceId(1 << 30, "/dev/sdx", wwn="0x5000c500a1b2c3d4")
REC = record.Record("vc", DEV, DEV, DEV, (1 << 30) // 512, 128, "smq", CacheMode.WRITEBACK,
                    1.0)
STAMPS = itertools.count(1_700_000_000 * 10**9, 10**9)  # a timestamp of its own, per change


@pytest.fixture(autouse=True)
def sd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


@pytest.fixture(params=["recent", "kept"])
def kept(request: pytest.FixtureRequest) -> bool:
    return request.param == "kept"


@pytest.fixture
def cache(kept: bool) -> cache_ops.ScanCache:
    c = cache_ops.ScanCache(keep=3600)
    if kept:
        c.state.wall = lambda: time.time_ns() + 3600 * 10**9
    return c


def changed(kept: bool, *paths: Path) -> None:
    """In ``kept`` runs: each of ``paths`` and its directory get timestamps of their own."""
    if not kept:
        return
    for p in paths:
        for q in (p, p.parent):
            if q.exists() and not q.is_symlink():
                n = next(STAMPS)
                os.utime(q, ns=(n, n), follow_symlinks=False)


def poll(cache: cache_ops.ScanCache) -> Snapshot:
    """A poll, checked against a one-shot status of the same moment."""
    snap = cache_ops.status(WB, stats=False, cache=cache)
    alone = cache_ops.status(WB, stats=False)
    assert (snap.owners, snap.protected, snap.unassembled) == (
        alone.owners, alone.protected, alone.unassembled)
    return snap


def owners(snap: Snapshot) -> list[tuple[str, str, bool]]:
    return sorted((o.procedure, o.device, o.running) for o in snap.owners)


@pytest.fixture
def holder() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes holding a lock (:func:`hold`), killed at the end."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(30)


def hold(procs: list[subprocess.Popen[str]], key: str, sd: Path,
         procedure: str = "drain") -> subprocess.Popen[str]:
    """Another process takes ``key``'s lock (as a drain does) and keeps it."""
    code = ("import sys\nfrom cachemgr.core import state\n"
            "with state.locked(sys.argv[1], '/dev/bcache0', holder={'procedure': "
            "sys.argv[2]}):\n    print('held', flush=True)\n    sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code, key, procedure], cwd=REPO, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env={**os.environ, "CACHEMGR_STATE_DIR": str(sd),
                              "PYTHONPATH": str(REPO)})
    procs.append(p)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def drain_journal(sd: Path, kept: bool) -> Path:
    path = state.journal_path("drain", UUID)
    state.write_json(path, {"uuid": UUID, "device": "/dev/bcache0", "started": 1.0})
    changed(kept, path)
    return path


# ------------------------------------------------------------------- liveness, every poll


def test_a_holder_that_dies_between_two_polls_shows_as_interrupted_at_the_next(
        sd: Path, kept: bool, cache: cache_ops.ScanCache,
        holder: list[subprocess.Popen[str]]) -> None:
    """A drain running (its journal, its lock held), then SIGKILLed: nothing in the state
    directory changes, only the kernel's list of locks; the next poll says interrupted."""
    drain_journal(sd, kept)
    p = hold(holder, UUID, sd)
    assert owners(poll(cache)) == [("drain", "/dev/bcache0", True)]
    assert owners(poll(cache)) == [("drain", "/dev/bcache0", True)]
    p.send_signal(signal.SIGKILL)
    p.wait(30)
    snap = poll(cache)
    assert owners(snap) == [("drain", "/dev/bcache0", False)]
    assert snap.owners[0].resume == "cachemgr drain /dev/bcache0 --resume"


def test_a_lock_taken_and_released_between_two_polls_shows_at_the_next(
        sd: Path, kept: bool, cache: cache_ops.ScanCache,
        holder: list[subprocess.Popen[str]]) -> None:
    """A mode switch on a device whose lock file is there from an earlier change: taking
    the lock rewrites the file in place (the directory does not change)."""
    with state.locked("disk-sdb", "/dev/sdb"):
        pass
    changed(kept, sd / "locks" / "disk-sdb.lock")
    assert poll(cache).owners == ()
    p = hold(holder, "disk-sdb", sd, procedure="mode")
    assert owners(poll(cache)) == [("mode", "/dev/bcache0", True)]
    p.kill()
    p.wait(30)
    assert poll(cache).owners == ()


def test_a_lock_file_that_got_another_inode_is_still_found(
        sd: Path, kept: bool, cache: cache_ops.ScanCache,
        holder: list[subprocess.Popen[str]]) -> None:
    """The poller keeps each lock file's inode number to find the held ones in /proc/locks.
    A file can get another without its directory changing (overlayfs copies a lower file up
    when it is opened to write: the lab's root): a flock on an inode number the poller does
    not know makes it look again."""
    with state.locked("disk-sdb", "/dev/sdb"):
        pass
    changed(kept, sd / "locks" / "disk-sdb.lock")
    poll(cache)
    if kept:  # what the poller knows of the file: another inode number than it has now
        inos = cache.state._inos[("state", "locks")]
        assert set(inos) == {"disk-sdb.lock"}
        inos["disk-sdb.lock"] = 1
    hold(holder, "disk-sdb", sd, procedure="mode")
    assert owners(poll(cache)) == [("mode", "/dev/bcache0", True)]


# ------------------------------------------------------ what is made or removed, next poll


def test_journals_made_and_removed_show_at_the_next_poll(
        sd: Path, kept: bool, cache: cache_ops.ScanCache) -> None:
    assert poll(cache).owners == ()
    drain = drain_journal(sd, kept)
    assert owners(poll(cache)) == [("drain", "/dev/bcache0", False)]
    other = state.journal_path("drain", "bcache7")  # a second one, beside the first
    state.write_json(other, {"backing": "/sys/block/sdh", "device": "/dev/bcache7"})
    changed(kept, other)
    assert owners(poll(cache)) == [("drain", "/dev/bcache0", False),
                                   ("drain", "/dev/bcache7", False)]
    other.unlink()
    changed(kept, other)
    assert owners(poll(cache)) == [("drain", "/dev/bcache0", False)]
    flush = state.journal_path("dmcache-flush", "vmcache")
    state.write_json(flush, {"name": "vmcache", "device": "/dev/mapper/vmcache"})
    lvm = state.journal_path("lvm-drain", "vg0/vm1")
    state.write_json(lvm, {"lv": "vg0/vm1"})
    changed(kept, flush, lvm)
    assert owners(poll(cache)) == [("dm-cache flush", "/dev/mapper/vmcache", False),
                                   ("drain", "/dev/bcache0", False),
                                   ("lvm drain", "vg0/vm1", False)]
    j = undo.Journal("bench", "/dev/bcache1", frozenset({"disk-sdc"}))
    j.remember("mode", "block/bcache1/bcache/cache_mode", "writeback")
    assert j.path is not None
    changed(kept, j.path)
    run = replace.Journal(id="r-poll", cset=CSET, options={}, old={}, backings=[
        {"uuid": UUID, "name": "sdb", "node": "/dev/sdb", "device": "/dev/bcache0",
         "mode": "writeback"}])
    run.save()
    changed(kept, state.journal_path("replace", "r-poll"))
    got = owners(poll(cache))
    assert ("bench", "/dev/bcache1", False) in got and ("replace-ssd", CSET, False) in got
    assert len(got) == 5
    for p in (drain, flush, lvm, j.path, state.journal_path("replace", "r-poll")):
        p.unlink()
        changed(kept, p)
        assert len(poll(cache).owners) == len(got) - 1
        got = owners(poll(cache))
    assert got == []


def test_a_journal_rewritten_in_place_shows_at_the_next_poll(
        sd: Path, kept: bool, cache: cache_ops.ScanCache) -> None:
    """Not how cachemgr writes (it renames a new file into place), but an admin's editor
    may: the directory does not change, the file's own times do."""
    path = drain_journal(sd, kept)
    assert owners(poll(cache)) == [("drain", "/dev/bcache0", False)]
    before = os.stat(path.parent)
    with path.open("r+") as f:
        text = f.read()
        f.seek(0)
        f.write(text.replace("/dev/bcache0", "/dev/bcache9"))
    if kept:  # the file's own times, a tick on; not its directory's
        n = next(STAMPS)
        os.utime(path, ns=(n, n))
    assert os.stat(path.parent) == before
    assert owners(poll(cache)) == [("drain", "/dev/bcache9", False)]


def test_a_protect_record_made_and_removed_shows_at_the_next_poll(
        sd: Path, kept: bool, cache: cache_ops.ScanCache) -> None:
    assert poll(cache).protected == ()
    path = sd / "protect" / "state.json"
    state.write_json(path, {"counts": {}, "protected": {"dev:/dev/sdc": {
        "ssd": "/dev/sdc", "why": "wear 93 %", "devices": {"/dev/bcache0": "done"}}}})
    changed(kept, path)
    assert [s for s, _ in poll(cache).protected] == ["/dev/sdc"]
    path.unlink()
    changed(kept, path)
    assert poll(cache).protected == ()


def test_a_dm_cache_record_made_and_removed_shows_at_the_next_poll(
        kept: bool, cache: cache_ops.ScanCache) -> None:
    assert poll(cache).unassembled == ()
    path = Path(record.save(REC))
    changed(kept, path)
    snap = poll(cache)
    assert [u.name for u in snap.unassembled] == ["vc"]
    assert {r for r, _ in snap.unassembled[0].problems} == {"origin", "cache", "metadata"}
    second = Path(record.save(dataclasses.replace(REC, name="vd")))
    changed(kept, second)
    assert [u.name for u in poll(cache).unassembled] == ["vc", "vd"]
    assert record.delete("vc")
    changed(kept, path)
    assert [u.name for u in poll(cache).unassembled] == ["vd"]
    assert record.delete("vd")
    changed(kept, second)
    assert poll(cache).unassembled == ()


# ------------------------------------------------------------------- what is kept, and not


@pytest.fixture
def no_flocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/locks lists no flock (the host's other processes take and release theirs
    between two polls, and a poller then looks at its lock files' inode numbers again)."""
    monkeypatch.setattr(state, "_flocks", lambda: {})


def test_what_did_not_change_is_not_read_again(sd: Path, kept: bool,
                                               cache: cache_ops.ScanCache,
                                               no_flocks: None) -> None:
    """The point of it: once the state directory has been left alone, a poll lists no
    directory and reads no file of it again (the lock files' inode numbers included); while
    it has just changed, every poll reads it again."""
    drain_journal(sd, kept)
    for key in ("disk-sdb", "disk-sdc", UUID):
        with state.locked(key, key):
            pass
        changed(kept, sd / "locks" / f"{key}.lock")
    path = Path(record.save(REC))
    changed(kept, path)
    poll(cache)
    before = cache.state.reads
    for _ in range(3):
        poll(cache)
    assert (cache.state.reads == before) is kept


def test_nothing_is_kept_longer_than_keep_seconds(sd: Path, no_flocks: None) -> None:
    now = [0.0]
    cache = cache_ops.ScanCache(keep=30, clock=lambda: now[0])
    cache.state.wall = lambda: time.time_ns() + 3600 * 10**9
    drain_journal(sd, True)
    poll(cache)
    before = cache.state.reads
    now[0] = 29.0
    poll(cache)
    assert cache.state.reads == before
    now[0] = 31.0
    poll(cache)
    assert cache.state.reads > before


def test_a_poll_refuses_a_state_directory_gone_unsafe(sd: Path, kept: bool,
                                                      cache: cache_ops.ScanCache) -> None:
    """The checks every command makes (core/safefs.py) are made at every poll: a state
    directory others can write to is refused, whatever was kept."""
    if os.geteuid() != 0:
        pytest.skip("the checks are root's")
    drain_journal(sd, kept)
    poll(cache)
    sd.chmod(0o777)
    with pytest.raises(state.UnsafeStateError, match="writable by group or others"):
        cache_ops.status(WB, stats=False, cache=cache)
    sd.chmod(0o700)
    (sd / "drain").chmod(0o777)
    with pytest.raises(state.UnsafeStateError, match="writable by group or others"):
        cache_ops.status(WB, stats=False, cache=cache)
    (sd / "drain").chmod(0o700)
    assert owners(poll(cache)) == [("drain", "/dev/bcache0", False)]


def test_a_journal_replaced_by_a_link_is_not_read_through(
        sd: Path, kept: bool, cache: cache_ops.ScanCache, tmp_path: Path) -> None:
    path = drain_journal(sd, kept)
    assert owners(poll(cache)) == [("drain", "/dev/bcache0", False)]
    planted = tmp_path / "planted.json"
    planted.write_text('{"uuid": "x", "device": "/dev/evil"}')
    path.unlink()
    path.symlink_to(planted)
    changed(kept, path)
    assert poll(cache).owners == ()


def test_status_without_a_scan_cache_keeps_nothing(sd: Path, kept: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-shot status (and status without a poller's cache) reads as before: no Kept,
    no view of a poll."""
    drain_journal(sd, kept)

    def refused(*a: object, **kw: object) -> None:
        raise AssertionError("a poller's reads in a one-shot status")

    monkeypatch.setattr(state, "polled", refused)
    monkeypatch.setattr(state.Kept, "listing", refused)
    monkeypatch.setattr(state.Kept, "file", refused)
    assert owners(cache_ops.status(WB, stats=False)) == [("drain", "/dev/bcache0", False)]
    assert owners(cache_ops.status(WB)) == [("drain", "/dev/bcache0", False)]


def test_a_read_that_failed_for_now_is_read_again_at_the_next_poll(tmp_path: Path) -> None:
    """EMFILE, EIO...: not the file's content. Kept, the journal would count as unreadable
    (and its owner's claim be gone from the TUI) until ``keep`` ran out."""
    from cachemgr.core import state

    k = state.Kept(keep=3600, wall=lambda: 2**62)  # everything old enough to keep
    (tmp_path / "j.json").write_text("{}")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        calls: list[int] = []

        def failing() -> bytes:
            calls.append(1)
            raise state.Transient("Too many open files")

        k.begin()
        assert k.file("d", fd, "j.json", failing) == "Too many open files"
        k.begin()
        assert k.file("d", fd, "j.json", lambda: b"{}") == b"{}"  # read again
        assert k.file("d", fd, "j.json", failing) == b"{}"  # now kept: unchanged file
        assert len(calls) == 1
    finally:
        os.close(fd)
