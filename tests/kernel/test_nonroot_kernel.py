"""Monitoring as a user other than root, on a real kernel (issue #41 item 3): ``check``,
``status``, ``status --json`` and ``metrics --textfile`` run as uid 65534 (``setpriv``, as a
Nagios/Icinga agent or node_exporter's user would run them) on a dirty bcache with an
interrupted drain, on a bcache device whose cache set is gone while dirty, and on a dirty
dm-cache with an interrupted flush. Each gives root's verdict or UNKNOWN with one line that
says what it could not read; no traceback; nothing written (no file of that user's outside
the textfile's directory, nothing changed under the state and record directories). The unit
tests (tests/unit/test_nonroot.py) cover the rules on captured trees."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import bcache
from cachemgr.core import runner
from tests.kernel import clirun, scenarios

NOBODY = 65534
STATE = Path("/var/lib/cachemgr")  # the lab's: CACHEMGR_STATE_DIR is not set in the guest
RECORDS = Path("/etc/cachemgr/dmcache")
# where a stray write would land: the state and record directories' parents, the runtime
# directories (4 levels: a walk of the guest's whole /var took minutes on UML)
WATCHED = ("/var/lib", "/var/tmp", "/etc", "/run", "/tmp")


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory every user may enter (pytest's tmp_path is under a 0700 one)."""
    d = Path(tempfile.mkdtemp(prefix="cachemgr-nonroot-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def as_user(*args: str, uid: int | None = NOBODY) -> subprocess.CompletedProcess[str]:
    """``python -m cachemgr ARGS`` as its own process, as ``uid`` (None: root)."""
    argv = [sys.executable, "-m", "cachemgr", *args]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


def tree(*roots: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every path under ``roots`` with its inode, size, mode and mtime (nothing may change)."""
    out = {}
    for root in roots:
        for p in [root, *root.rglob("*")] if root.exists() else []:
            st = p.lstat()
            out[str(p)] = (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns)
    return out


def theirs(since: Path, allowed: Path) -> list[str]:
    """Files and directories uid 65534 made or changed after ``since`` (outside
    ``allowed``: the textfile's directory)."""
    r = runner.run(["find", *WATCHED, "-xdev", "-maxdepth", "4", "-uid", str(NOBODY),
                    "-newer", str(since)], check=False, timeout=120)
    return [p for p in r.stdout.split() if not p.startswith(str(allowed))]


def no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr + r.stdout, r.stderr


def unseen_line(err: str) -> str:
    """The one line a status run without root says on stderr."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cachemgr: not root: not read: "), err
    return lines[0]


def rows(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(d["kind"], d["device"], d.get("backing"), d["mode"], d["state"], d["dirty_bytes"])
            for d in doc["devices"]]


def textfile(dirpath: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    """``metrics --textfile`` as uid 65534 into ``dirpath`` (made theirs, as
    node_exporter's textfile directory would be), and what it wrote."""
    dirpath.mkdir(exist_ok=True)
    os.chown(dirpath, NOBODY, NOBODY)
    prom = dirpath / "cachemgr.prom"
    r = as_user("metrics", "--textfile", str(prom), "--no-vms")
    return r, prom.read_text() if prom.exists() else ""


@pytest.mark.kernel(disks="1G,512M", timeout=600)
def test_bcache_check_status_and_metrics_as_another_user(lab_disks: list[str],
                                                         base: Path) -> None:
    hdd, ssd = lab_disks
    sysfs = scenarios.bcache_holding_dirty(hdd, ssd, bucket="128k", size="128M",
                                           io_size="64M")
    # a drain killed outright: its journal (root's, mode 0600 in a 0700 directory) owns it
    drain = clirun.process("drain", "/dev/bcache0")
    deadline = time.monotonic() + 60
    while not list((STATE / "drain").glob("*.json")):
        assert time.monotonic() < deadline and drain.poll() is None, drain.communicate()
        time.sleep(0.02)
    drain.send_signal(signal.SIGKILL)
    drain.wait()
    sysfs.write("block/bcache0/bcache/writeback_running", "0")

    root = as_user("check", "--json", uid=None)
    assert root.returncode == 1, root.stdout  # WARNING: the interrupted drain
    assert [f["code"] for f in json.loads(root.stdout)["findings"]] == ["interrupted-drain"]
    root_status = json.loads(as_user("status", "--json", uid=None).stdout)
    assert root_status["unseen"] == []

    marker = base / "marker"
    marker.write_text("")
    time.sleep(0.05)
    before = tree(STATE, RECORDS)

    # check: UNKNOWN (3), one line naming the state directory; never WARNING or OK
    r = as_user("check")
    no_traceback(r)
    assert r.returncode == 3 and r.stderr == "", r
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout
    assert lines[0].startswith("CACHEMGR UNKNOWN - not root: not read: state-directory "
                               f"{STATE} (Permission denied)"), lines[0]
    r = as_user("check", "--json")
    no_traceback(r)
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and doc["status"] == "UNKNOWN" and doc["exit_code"] == 3
    assert [u["what"] for u in doc["unseen"]] == ["state-directory"]

    # status: root's rows, and one line on stderr
    r = as_user("status")
    no_traceback(r)
    assert r.returncode == 0 and "state-directory" in unseen_line(r.stderr)
    assert "/dev/bcache0" in r.stdout and "writeback" in r.stdout
    r = as_user("status", "--json")
    no_traceback(r)
    assert r.returncode == 0
    unseen_line(r.stderr)
    doc = json.loads(r.stdout)
    assert rows(doc) == rows(root_status) and doc["devices"][0]["dirty_bytes"] > 0
    assert [(u["what"], u["path"]) for u in doc["unseen"]] == [("state-directory", str(STATE))]

    # metrics --textfile: what it could read, the unseen label and UNKNOWN as the health
    r, text = textfile(base / "prom")
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert "not root: not read: state-directory" in r.stderr
    assert f'cachemgr_unseen{{path="{STATE}",what="state-directory"}} 1.0' in text
    assert "cachemgr_health_status 3.0" in text
    assert 'cachemgr_cache_state{device="bcache0",kind="bcache",path="/dev/bcache0",' \
           'state="dirty"} 1.0' in text

    assert theirs(marker, base / "prom") == []
    assert tree(STATE, RECORDS) == before

    # the cache set gone while the backing device is dirty: CRITICAL as root, and the same
    # CRITICAL (the unseen said after it) without root
    cset = Path(os.path.realpath("/sys/block/bcache0/bcache/cache")).name
    Path(f"/sys/fs/bcache/{cset}/stop").write_text("1")
    name = os.path.basename(hdd)
    # the set's stop stops its backing devices after the set's directory has gone, and the
    # disk's exclusive open is released after its directories have gone: the product's
    # register waits for that (a raw write to /sys/fs/bcache/register here failed with EBUSY)
    deadline = time.monotonic() + 30
    while any(Path(p).exists() for p in (f"/sys/fs/bcache/{cset}", "/sys/block/bcache0",
                                          f"/sys/block/{name}/bcache")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    bcache.register(sysfs, hdd)
    assert Path(f"/sys/block/{name}/bcache/state").read_text().strip() == "dirty"
    root = as_user("check", uid=None)
    assert root.returncode == 2, root.stdout
    # root's check keeps the dirty backing devices it saw (health.remember): what the other
    # user's runs must leave alone is the tree as root's run left it
    before = tree(STATE, RECORDS)
    r = as_user("check")
    no_traceback(r)
    assert r.returncode == 2, r.stdout
    head, first = root.stdout.splitlines()[0], r.stdout.splitlines()[0]
    assert head.startswith(f"CACHEMGR CRITICAL - 1 critical, 1 warning: {hdd}: its state "
                           "says dirty"), head
    assert first.startswith(f"CACHEMGR CRITICAL - 1 critical, 0 warning: {hdd}: its state "
                            "says dirty"), first
    assert r.stdout.splitlines()[-1].startswith("not root: not read: ")
    assert theirs(marker, base / "prom") == []
    assert tree(STATE, RECORDS) == before


@pytest.mark.kernel(disks="512M,128M,16M", timeout=600)
def test_dmcache_check_and_status_as_another_user(lab_disks: list[str],
                                                  base: Path) -> None:
    from tests.kernel import test_dmcache_kernel as dmk

    hdd = lab_disks[0]
    dmk.make(lab_disks)
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    dmk.fill()
    dmk.hold_writeback()
    assert dmk.dirty() > 0
    # the origin's writes take 2 s each: the flush cannot finish; then it is killed
    dmk.dm("suspend", "hdd")
    dmk.dm("load", "hdd", "--table", f"0 {sectors} delay {hdd} 0 0 {hdd} 0 2000")
    dmk.dm("resume", "hdd")
    p = clirun.process("drain", "vc")
    deadline = time.monotonic() + 30
    while "cleaner" not in dmk.table():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    p.send_signal(signal.SIGKILL)
    p.wait()
    dmk.dm("suspend", "hdd")
    dmk.dm("load", "hdd", "--table", f"0 {sectors} delay {hdd} 0 5")
    dmk.dm("resume", "hdd")

    root = as_user("check", "--json", uid=None)
    assert root.returncode in (1, 2), root.stdout
    assert "interrupted-dm-cache-flush" in [f["code"] for f in
                                            json.loads(root.stdout)["findings"]], root.stdout
    marker = base / "marker"
    marker.write_text("")
    time.sleep(0.05)
    before = tree(STATE, RECORDS)

    r = as_user("check")
    no_traceback(r)
    if root.returncode == 2:
        assert r.returncode == 2, r.stdout
    else:
        assert r.returncode == 3, r.stdout
        assert r.stdout.startswith("CACHEMGR UNKNOWN - not root: not read: "), r.stdout
        assert "dmsetup /dev/mapper/control (dmsetup needs root)" in r.stdout
    assert r.stderr == ""
    r = as_user("check", "--json")
    no_traceback(r)
    # and the unclaimed dm-cache device itself: no superblock of it could be probed
    assert {u["what"] for u in json.loads(r.stdout)["unseen"]} == {
        "dmsetup", "state-directory", "dmcache-records", "superblocks"}

    r = as_user("status")
    no_traceback(r)
    assert r.returncode == 0
    line = unseen_line(r.stderr)
    for words in ("dmsetup /dev/mapper/control (dmsetup needs root)",
                  f"state-directory {STATE}", f"dmcache-records {RECORDS}"):
        assert words in line, line
    r = as_user("status", "--json")
    no_traceback(r)
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["devices"] == []  # not guessed: said unseen
    assert {u["what"] for u in doc["unseen"]} == {"dmsetup", "state-directory",
                                                 "dmcache-records", "superblocks"}
    r, text = textfile(base / "prom")
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert 'cachemgr_unseen{path="/dev/mapper/control",what="dmsetup"} 1.0' in text
    assert "cachemgr_health_status 3.0" in text
    assert theirs(marker, base / "prom") == []
    assert tree(STATE, RECORDS) == before

    rc, _, err = clirun.run_process("drain", "vc", "--resume")
    assert rc == 0, err


@pytest.mark.kernel(systemd=True, disks="256M,64M,64M,32M,16M", timeout=400)
def test_metrics_unit_as_a_dynamic_user(lab_disks: list[str]) -> None:
    """The listener's unit with the drop-in systemd/README.md gives for a user of its own
    (``DynamicUser=yes``, no capability, ``--no-vms``), under systemd 252 in the lab: it
    serves bcache's metrics as root's listener reads them, says ``cachemgr_unseen`` for the
    state directory and dmsetup, health 3, and logs that once."""
    from tests.kernel import test_systemd_kernel as sd

    scenarios.bcache_holding_dirty(lab_disks[0], lab_disks[1], bucket="64k", size="32M",
                                   io_size="4M")
    sd.sh(sys.executable, "-m", "cachemgr", "create", "dm-cache", "vc", "--origin",
          lab_disks[2], "--cache", lab_disks[3], "--metadata", lab_disks[4], "--mode",
          "writethrough")
    unit = "cachemgr-metrics.service"
    d = Path(f"/run/systemd/system/{unit}.d")
    d.mkdir(parents=True, exist_ok=True)
    (d / "checkout.conf").write_text(f"[Service]\nEnvironment=PYTHONPATH={sd.ROOT}\n")
    (d / "user.conf").write_text(
        "[Service]\nDynamicUser=yes\nCapabilityBoundingSet=\nExecStart=\n"
        f"ExecStart={sys.executable} -m cachemgr metrics --listen :9563 --no-vms\n")
    cursor = sd.journal_cursor()
    sd.install("--metrics")
    text = ""

    def scrape() -> bool:
        nonlocal text
        try:
            with urllib.request.urlopen("http://127.0.0.1:9563/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return False
        return True

    sd.wait(scrape, 30, "the listener on :9563")
    main_pid = int(sd.show(unit, "MainPID")["MainPID"])
    assert Path(f"/proc/{main_pid}").stat().st_uid != 0  # its own user
    got = sd.samples(text)
    root = json.loads(as_user("status", "--json", uid=None).stdout)
    b = next(x for x in root["devices"] if x["kind"] == "bcache")
    labels = (("device", os.path.basename(b["device"])), ("kind", "bcache"),
              ("path", b["device"]))
    assert got[("cachemgr_dirty_bytes", labels)] == b["dirty_bytes"] > 0
    assert got[("cachemgr_unseen", (("path", str(STATE)), ("what", "state-directory")))] == 1
    assert got[("cachemgr_unseen", (("path", "/dev/mapper/control"), ("what", "dmsetup")))] == 1
    assert got[("cachemgr_health_status", ())] == 3
    assert not any(k[0] == "cachemgr_dirty_bytes" and ("kind", "dm-cache") in k[1]
                   for k in got)  # not guessed
    with urllib.request.urlopen("http://127.0.0.1:9563/metrics", timeout=5) as r:
        r.read()
    said = [line for line in sd.unit_journal(unit, cursor) if "not root: not read" in line]
    assert len(said) == 1, sd.unit_journal(unit, cursor)  # once, for three scrapes
