"""The systemd units under a real systemd (PID 1 in the lab guest: ``kernel(systemd=True)``).

* Boot: the disks carry bcache superblocks (a backing device and a cache, not attached), the
  policy, the udev rule, the boot unit and a stand-in for libvirtd are installed with
  ``scripts/install-udev.sh`` before systemd starts (``setup=``: this module run as a
  script, like an image being built: systemctl enables offline). The stand-in records what it
  finds when it starts; the boot pass must have attached the device by then.
* Hotplug: a scsi_debug hot-add after boot goes udev -> 90-cachemgr.rules -> ``systemd-run``
  (a transient unit, not the fork fallback) and ends attached as the policy says.
* Metrics: ``install-udev.sh --metrics --textfile`` on the running system (over an earlier
  version's enabled textfile timer, which it removes) starts the listener (/metrics matches
  ``status --json``) and the textfile service, one process that rewrites the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cachemgr.backends import bcache
from cachemgr.core import runner
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from tests.kernel import measure, scenarios
from tests.unit.test_metrics import listening

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install-udev.sh"
STATE = Path("/var/lib/cachemgr")
POLICY = Path("/etc/cachemgr/cachemgr.toml")
SAW = Path("/run/libvirtd-stand-in.json")
TEXTFILE = Path("/var/lib/prometheus/node-exporter/cachemgr.prom")
SETUP = [sys.executable, "-m", "tests.kernel.test_systemd_kernel"]

# What libvirtd would find: every bcache device, its cache set and mode, when it starts.
LIBVIRTD_STAND_IN = f"""\
[Unit]
Description=stand-in for libvirtd (records the bcache devices it finds at start)
After=network.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={sys.executable} -c 'import glob, json, os; \\
json.dump({{os.path.basename(d): {{"cache": os.path.exists(d + "/bcache/cache"), \\
"mode": open(d + "/bcache/cache_mode").read().strip()}} \\
for d in glob.glob("/sys/block/bcache*")}}, open("{SAW}", "w"))'

[Install]
WantedBy=multi-user.target
"""


def sh(*argv: str, check: bool = True) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                       env={**os.environ, "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"})
    if check and r.returncode != 0:
        raise AssertionError(f"{argv} exited {r.returncode}: {r.stdout}{r.stderr}")
    return r.stdout


def show(unit: str, *props: str) -> dict[str, str]:
    out = sh("systemctl", "show", unit, *(f"--property={p}" for p in props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait(pred: Callable[[], bool], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n"
                                 + sh("journalctl", "-b", "--no-pager", "-n", "60",
                                      check=False)
                                 + sh("systemctl", "status", "--no-pager", "--full", "-n", "20",
                                      "cachemgr-*", check=False))
        time.sleep(0.1)
    return time.monotonic() - t0


def super_field(node: str, field: str) -> str:
    out = runner.run(["bcache-super-show", node]).stdout
    return next(line.split()[1] for line in out.splitlines() if line.startswith(field))


def install(*opts: str) -> None:
    runner.run([str(INSTALL), "--python", sys.executable, *opts], timeout=120)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def status_json() -> dict:  # type: ignore[type-arg]
    out = sh(sys.executable, "-m", "cachemgr", "status", "--json")
    return json.loads(out)  # type: ignore[no-any-return]


def journal(*match: str) -> list[dict[str, str]]:
    out = sh("journalctl", "-b", "--no-pager", "-o", "json", *match, check=False)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def report(name: str, **values: object) -> None:
    """Print what was measured (and append it to $CACHEMGR_SYSTEMD_REPORT when set)."""
    measure.report("CACHEMGR_SYSTEMD_REPORT", name, **values)


def actions() -> list[dict[str, object]]:
    p = STATE / "autoattach" / "actions.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line] if p.exists() else []


# ------------------------------------------------------------------------------ boot


def boot_setup() -> None:
    """Before systemd starts (no udevd yet): what a host has when it boots."""
    backing, cache = os.environ["LAB_DISKS"].split()[:2]
    bcache.make_bcache(cache=cache, bucket="64k")
    bcache.make_bcache(backing=[backing])
    sysfs = Sysfs()
    assert not sysfs.exists(f"block/{os.path.basename(backing)}/bcache"), "registered early"
    POLICY.parent.mkdir(parents=True, exist_ok=True)
    POLICY.write_text(f"""version = 1

[cache.ssd0]
cset = "{super_field(cache, 'cset.uuid')}"

[backing.vm-disks]
device = "uuid:{super_field(backing, 'dev.uuid')}"
cache = "ssd0"
mode = "writeback"
writeback_percent = 20
""")
    Path("/etc/systemd/system/libvirtd.service").write_text(LIBVIRTD_STAND_IN)
    sh("systemctl", "enable", "libvirtd.service")
    install("--metrics")  # systemd is not running: enabled offline, nothing started
    wants = Path("/etc/systemd/system/sysinit.target.wants/cachemgr-autoattach.service")
    assert wants.is_symlink(), "install-udev.sh did not enable the boot unit"


@pytest.mark.kernel(systemd=True, disks="256M,64M", setup=SETUP, timeout=240)
def test_boot_pass_attaches_before_libvirtd() -> None:
    assert sh("systemctl", "is-system-running", check=False).strip() == "running", \
        sh("systemctl", "--failed", "--no-legend", check=False)
    aa = show("cachemgr-autoattach.service", "Result", "ExecMainStatus",
              "ExecMainStartTimestampMonotonic", "ExecMainExitTimestampMonotonic")
    lv = show("libvirtd.service", "ActiveState", "ExecMainStartTimestampMonotonic")
    assert aa["Result"] == "success" and aa["ExecMainStatus"] == "0", aa
    # the pass waited for udev's coldplug (the by-id links a policy may name) first
    pre = show("cachemgr-autoattach.service", "ExecStartPre")["ExecStartPre"]
    assert "udevadm settle" in pre and "code=exited ; status=0 }" in pre, pre
    assert lv["ActiveState"] == "active", lv
    # ordered: the boot pass had ended when the stand-in started
    assert 0 < int(aa["ExecMainExitTimestampMonotonic"]) <= \
        int(lv["ExecMainStartTimestampMonotonic"]), (aa, lv)
    saw = json.loads(SAW.read_text())
    assert saw == {"bcache0": {"cache": True,
                               "mode": "writethrough [writeback] writearound none"}}, saw
    sysfs = Sysfs()
    assert sysfs.read("block/bcache0/bcache/writeback_percent") == "20"
    # the boot pass's decisions are in the journal under its own unit
    logged = journal("-t", "cachemgr-autoattach")
    units = {e.get("_SYSTEMD_UNIT", "") for e in logged}
    assert "cachemgr-autoattach.service" in units or any(
        u.startswith("cachemgr-autoattach-") for u in units), logged
    # each decision once in the journal (syslog), not again through stderr
    dup = [e["MESSAGE"] for e in journal("_SYSTEMD_UNIT=cachemgr-autoattach.service")
           if "INFO: " in e.get("MESSAGE", "")]
    assert not dup, dup
    assert not [a for a in actions() if a.get("result") == "failed"], actions()
    # the listener installed before boot came up with it
    assert show("cachemgr-metrics.service", "ActiveState")["ActiveState"] == "active"
    report("boot", boot_pass=aa, libvirtd=lv, log_units=sorted(units),
           actions=[(a["kind"], a.get("result")) for a in actions()],
           startup=sh("systemd-analyze", check=False).splitlines()[:1])


# ------------------------------------------------------------------------------ hotplug


@pytest.mark.kernel(systemd=True, timeout=240)
def test_hot_add_runs_the_worker_as_a_transient_unit() -> None:
    from tests.kernel.test_udev_kernel import backing_ok, policy_text, prepare, rescan

    sysfs, ssd, backs = prepare(1)
    POLICY.parent.mkdir(parents=True, exist_ok=True)
    POLICY.write_text(policy_text(ssd, backs))
    install()  # the rule and the boot unit, udev rules reloaded, on a running systemd
    assert show("cachemgr-autoattach.service", "UnitFileState")["UnitFileState"] == "enabled"
    t0 = time.monotonic()
    for d in (ssd, *backs):
        rescan(sysfs, d)
    took = wait(lambda: all(backing_ok(sysfs, b) for b in backs), 20,
                "the policy's attachment and mode")
    runner.run(["udevadm", "settle", "--timeout=30"], timeout=40)
    # the worker ran as a transient unit started by systemd-run (not the forked fallback)
    logged = journal("-t", "cachemgr-autoattach")
    units = {e.get("_SYSTEMD_UNIT", "") for e in logged}
    transient = sorted(u for u in units if u.startswith("cachemgr-autoattach-"))
    assert transient, logged
    assert not (STATE / "autoattach" / "worker.log").exists()
    # systemd's own word on those units: none failed (--collect unloads them when they end)
    runs = [e.get("MESSAGE", "") for e in journal("-u", "cachemgr-autoattach-*")]
    assert not [m for m in runs if "Failed with result" in m or "status=" in m], runs
    # each decision logged once (syslog), not a second time through stderr -> journal
    attaches = [e for e in logged if "attach " in e.get("MESSAGE", "") and ": done" in
                e.get("MESSAGE", "")]
    dup = [e["MESSAGE"] for e in journal(*(f"_SYSTEMD_UNIT={u}" for u in transient))
           if "INFO: " in e.get("MESSAGE", "")]
    assert attaches and not dup, (attaches, dup)
    assert not [a for a in actions() if a.get("result") == "failed"], actions()
    report("hot_add", seconds_from_rescan=round(time.monotonic() - t0, 3),
           waited=round(took, 3), transient_units=transient)


# ------------------------------------------------------------------------------ metrics


def cap_bounding_set(unit: str) -> int:
    pid = show(unit, "MainPID")["MainPID"]
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(x.split()[1] for x in status.splitlines() if x.startswith("CapBnd:")), 16)


def textfile_runs(n: int, timeout: float) -> tuple[int, str]:
    """Wait for ``n`` more rewrites of the textfile (each replaces the file: a new inode);
    returns (rewrites seen, the journal cursor from before the first)."""
    cursor = journal_cursor()
    seen, ino = 0, TEXTFILE.stat().st_ino
    t0 = time.monotonic()
    while seen < n and time.monotonic() - t0 < timeout:
        time.sleep(0.2)
        with contextlib.suppress(FileNotFoundError):
            if TEXTFILE.stat().st_ino != ino:
                seen, ino = seen + 1, TEXTFILE.stat().st_ino
    return seen, cursor


def journal_cursor() -> str:
    """Now, in the journal's microseconds (__REALTIME_TIMESTAMP): what :func:`unit_journal`
    holds is what came after."""
    return str(time.time_ns() // 1000)


def unit_journal(unit: str, cursor: str) -> list[str]:
    """What the journal holds about ``unit`` after ``cursor`` (:func:`journal_cursor`): PID
    1's lines about it and its own output (journalctl -u matches both)."""
    sh("journalctl", "--sync", check=False)
    out = sh("journalctl", "-u", unit, f"--since=@{int(cursor) // 1_000_000 - 1}", "-o",
             "json", "--no-pager", check=False)
    entries = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return [e.get("MESSAGE", "") for e in entries
            if int(e.get("__REALTIME_TIMESTAMP", 0)) > int(cursor)]


TEXTFILE_INTERVAL_S = 2  # cachemgr-textfile.service's --interval once its start is checked

# what earlier versions installed for the textfile: a oneshot service and its 15 s timer
OLD_TEXTFILE_SERVICE = """[Service]
Type=oneshot
ExecStart={cachemgr} metrics --textfile {path}
"""
OLD_TEXTFILE_TIMER = """[Timer]
OnBootSec=30s
OnUnitActiveSec=15s
AccuracySec=1s

[Install]
WantedBy=timers.target
"""


@pytest.mark.kernel(systemd=True, disks="256M,64M,64M,32M,16M", timeout=400)
def test_metrics_listener_and_textfile_service(lab_disks: list[str]) -> None:
    scenarios.bcache_holding_dirty(lab_disks[0], lab_disks[1], bucket="64k", size="32M",
                                   io_size="4M")
    # a dm-cache too: the sandboxed units read it with dmsetup (CAP_SYS_ADMIN, the ioctl)
    sh(sys.executable, "-m", "cachemgr", "create", "dm-cache", "vc", "--origin", lab_disks[2],
       "--cache", lab_disks[3], "--metadata", lab_disks[4], "--mode", "writethrough")
    # an upgrade: an earlier version's oneshot and its timer, enabled and running
    etc = Path("/etc/systemd/system")
    TEXTFILE.parent.mkdir(parents=True, exist_ok=True)
    (etc / "cachemgr-textfile.service").write_text(OLD_TEXTFILE_SERVICE.format(
        cachemgr=f"{sys.executable} -m cachemgr", path=TEXTFILE))
    (etc / "cachemgr-textfile.timer").write_text(OLD_TEXTFILE_TIMER)
    sh("systemctl", "daemon-reload")
    sh("systemctl", "enable", "--now", "cachemgr-textfile.timer")
    assert show("cachemgr-textfile.timer", "ActiveState")["ActiveState"] == "active"
    # the units run the cachemgr of this checkout, whichever checkout the venv was made for
    # (a git worktree's tests against the main tree's editable install)
    for u in ("cachemgr-metrics.service", "cachemgr-textfile.service"):
        d = Path(f"/run/systemd/system/{u}.d")
        d.mkdir(parents=True, exist_ok=True)
        (d / "checkout.conf").write_text(f"[Service]\nEnvironment=PYTHONPATH={ROOT}\n")
    install("--metrics", "--textfile")
    assert show("cachemgr-metrics.service", "ActiveState")["ActiveState"] == "active"
    # the sandbox is in force: two capabilities left (CAP_SYS_ADMIN = 21 for dmsetup,
    # CAP_SYSLOG = 34 for the kernel log: capability.h)
    assert cap_bounding_set("cachemgr-metrics.service") == (1 << 21) | (1 << 34)
    # the earlier version's timer is gone: not loaded, no link left
    timer = show("cachemgr-textfile.timer", "LoadState", "ActiveState")
    assert timer == {"LoadState": "not-found", "ActiveState": "inactive"}, timer
    assert not list(etc.rglob("cachemgr-textfile.timer"))
    tf_unit = show("cachemgr-textfile.service", "ActiveState", "Type", "UnitFileState")
    assert tf_unit == {"ActiveState": "active", "Type": "exec", "UnitFileState": "enabled"}, (
        tf_unit, sh("journalctl", "-b", "--no-pager", "-n", "40", "-u",
                    "cachemgr-textfile.service", check=False))
    # the shipped unit rewrites the file every 15 s; the rest of the test runs the same
    # process with --interval TEXTFILE_INTERVAL_S (a drop-in, as an admin sets another
    # interval), so that its rewrites, its failed write and its recovery, each an interval
    # apart, are waited out in seconds: what is proven is per interval, not per 15 s
    exe = show("cachemgr-textfile.service", "ExecStart")["ExecStart"]
    shipped = exe.split("argv[]=")[1].split(" ;")[0]
    assert shipped.endswith(" --interval 15"), exe
    with (Path("/run/systemd/system/cachemgr-textfile.service.d") / "checkout.conf").open(
            "a") as f:
        f.write(f"ExecStart=\nExecStart={shipped.removesuffix(' 15')} "
                f"{TEXTFILE_INTERVAL_S}\n")
    sh("systemctl", "daemon-reload")
    sh("systemctl", "restart", "cachemgr-textfile.service")
    text = ""

    def scrape() -> bool:
        nonlocal text
        try:
            with urllib.request.urlopen("http://127.0.0.1:9563/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return False
        return True

    wait(scrape, 30, "the listener on :9563")
    # the sandbox lets the scrape read the kernel log (a dm-cache SSD's failed requests, as
    # check reads them): nothing said unseen, the health model's verdict OK
    assert 'cachemgr_unseen{' not in text, text
    assert "cachemgr_health_status 0.0" in text, [x for x in text.splitlines()
                                                  if "health" in x]
    # the shipped unit's --listen :9563 is loopback only (issue #15): never 0.0.0.0 or [::]
    assert listening(9563) == {"127.0.0.1", "::1"}
    with urllib.request.urlopen("http://[::1]:9563/metrics", timeout=5) as r:
        assert "cachemgr_dirty_bytes" in r.read().decode()
    status = status_json()
    d = status["devices"][0]
    got = samples(text)
    # device: the kernel name (node_exporter's node_disk_* label); path: the node
    labels = (("device", os.path.basename(d["device"])), ("kind", "bcache"),
              ("path", d["device"]))
    # writeback is off: the dirty amount cannot change between the two reads
    assert got[("cachemgr_dirty_bytes", labels)] == d["dirty_bytes"] > 0
    assert got[("cachemgr_cache_mode", (*labels[:2], ("mode", "writeback"), labels[2]))] == 1.0
    assert got[("cachemgr_cache_state", (*labels, ("state", "dirty")))] == 1.0
    dm = next(x for x in status["devices"] if x["kind"] == "dm-cache")
    dm_mode = next(k for k in got if k[0] == "cachemgr_cache_mode"
                   and ("path", dm["device"]) in k[1] and ("mode", "writethrough") in k[1])
    assert got[dm_mode] == 1.0 and dict(dm_mode[1])["device"].startswith("dm-")
    # the service writes the file, and goes on rewriting it: one process, every interval
    took = wait(lambda: b"cachemgr_dirty_bytes{" in (
        TEXTFILE.read_bytes() if TEXTFILE.exists() else b""), 45, f"{TEXTFILE} from the service")
    tf = samples(TEXTFILE.read_text())
    assert tf[("cachemgr_dirty_bytes", labels)] == d["dirty_bytes"]
    assert tf[dm_mode] == 1.0
    assert cap_bounding_set("cachemgr-textfile.service") == (1 << 21) | (1 << 34)
    pid = show("cachemgr-textfile.service", "MainPID")["MainPID"]
    # three rewrites: what they leave in the journal (the lab boots systemd with
    # --log-target=console: PID 1's own lines go to the journal from now)
    sh("systemctl", "log-target", "journal-or-kmsg")
    runs, cursor = textfile_runs(3, 75)
    lines = unit_journal("cachemgr-textfile.service", cursor)
    assert runs >= 3, runs
    assert lines == [], (f"{len(lines)} lines in {runs} rewrites", lines)
    after = show("cachemgr-textfile.service", "MainPID", "NRestarts")
    assert after == {"MainPID": pid, "NRestarts": "0"}, (pid, after)
    # the written-back traffic, measured between two looks as the listener does
    assert "cachemgr_bcache_written_back_bytes_per_second{" in TEXTFILE.read_text()
    # a write that fails (the path a directory: the rename refused) is logged once and tried
    # again every interval; the file comes back when the path is free, from the same process
    cursor = journal_cursor()
    with contextlib.suppress(FileNotFoundError):  # (a rewrite's rename may be under way)
        TEXTFILE.unlink()
    TEXTFILE.mkdir()
    wait(lambda: [m for m in unit_journal("cachemgr-textfile.service", cursor)
                  if "not written" in m], 40, "the failed write in the journal")
    TEXTFILE.rmdir()
    wait(TEXTFILE.is_file, 40, "the file written again")
    wait(lambda: [m for m in unit_journal("cachemgr-textfile.service", cursor)
                  if "written again" in m], 20, "the write's recovery in the journal")
    failed_write = unit_journal("cachemgr-textfile.service", cursor)
    assert len([m for m in failed_write if "not written" in m]) == 1, failed_write
    assert show("cachemgr-textfile.service", "MainPID")["MainPID"] == pid
    assert "cachemgr_dirty_bytes{" in TEXTFILE.read_text()
    # the directory removed and made again under the running service, whose namespace had
    # the old one bind-mounted writable (ReadWritePaths=): what it makes of the new one is
    # reported (docs/kernel-notes.md); a restart (a new namespace) writes the file again
    cursor = journal_cursor()
    shutil.rmtree(TEXTFILE.parent)
    TEXTFILE.parent.mkdir()
    wait(lambda: TEXTFILE.exists() or bool([
        m for m in unit_journal("cachemgr-textfile.service", cursor) if "not written" in m]),
        40, "a write into the new directory, or its failure")
    new_dir = [m for m in unit_journal("cachemgr-textfile.service", cursor)
               if "not written" in m] or ["written"]
    sh("systemctl", "restart", "cachemgr-textfile.service")
    wait(TEXTFILE.is_file, 40, "the file after the restart")
    pid = show("cachemgr-textfile.service", "MainPID")["MainPID"]
    # stop: SIGTERM, exit 0, the last file whole
    sh("systemctl", "stop", "cachemgr-textfile.service")
    stopped = show("cachemgr-textfile.service", "Result", "ExecMainStatus", "ExecMainCode")
    assert stopped["Result"] == "success" and stopped["ExecMainStatus"] == "0", stopped
    assert samples(TEXTFILE.read_text())[("cachemgr_dirty_bytes", labels)] == d["dirty_bytes"]
    assert [p.name for p in TEXTFILE.parent.iterdir()] == [TEXTFILE.name]
    # a path the command line must fix (a missing directory) fails the unit at once, logged,
    # and is not restarted (exit 2: RestartPreventExitStatus=2)
    dropin = Path("/run/systemd/system/cachemgr-textfile.service.d/fail.conf")
    dropin.parent.mkdir(parents=True, exist_ok=True)
    exe = show("cachemgr-textfile.service", "ExecStart")["ExecStart"]
    argv = exe.split("argv[]=")[1].split(" --textfile")[0]  # @CACHEMGR@ metrics
    dropin.write_text(f"[Service]\nExecStart=\nExecStart={argv} "
                      "--textfile /var/lib/cachemgr-missing/x.prom --interval 15\n")
    sh("systemctl", "daemon-reload")
    cursor = journal_cursor()
    sh("systemctl", "start", "cachemgr-textfile.service", check=False)
    wait(lambda: show("cachemgr-textfile.service", "ActiveState")["ActiveState"] == "failed",
         30, "the unit failed")
    wait(lambda: [m for m in unit_journal("cachemgr-textfile.service", cursor)
                  if "Failed with result" in m], 20, "the failure in the journal")
    failed = unit_journal("cachemgr-textfile.service", cursor)
    st = show("cachemgr-textfile.service", "ExecMainStatus", "NRestarts")
    dropin.unlink()
    sh("systemctl", "daemon-reload")
    assert [m for m in failed if "cachemgr-missing" in m], failed
    assert [m for m in failed if "Failed with result" in m], failed
    assert st == {"ExecMainStatus": "2", "NRestarts": "0"}, st
    # uninstall stops and removes everything
    runner.run([str(INSTALL), "--uninstall"], timeout=120)
    assert not scrape()
    for u in ("cachemgr-metrics.service", "cachemgr-textfile.service",
              "cachemgr-autoattach.service"):
        assert show(u, "LoadState")["LoadState"] == "not-found", u
    report("metrics", textfile_wait_s=round(took, 1),
           uptime_s=float(Path("/proc/uptime").read_text().split()[0]),
           textfile_rewrites=runs, journal_lines=len(lines), failed_write=failed_write,
           new_dir=new_dir, failed_run=failed)


if __name__ == "__main__":
    boot_setup()


# ------------------------------------------------------------------------------ SMART


@pytest.mark.kernel(systemd=True, disks="256M", timeout=240)
def test_smart_timer_reads_the_cache_ssd_in_its_sandbox(lab_disks: list[str]) -> None:
    """cachemgr-smart.service (``ssd-health --refresh`` under its sandbox: two capabilities,
    the SCSI and NVMe disks read-only) reads a scsi_debug cache SSD with smartctl and keeps
    the answer under /var/lib/cachemgr/smart for the metrics, logging nothing when the drive
    is fine."""
    from cachemgr.backends import scsi, smart

    sysfs = Sysfs()
    (ssd,) = scsi.load_scsi_debug(sysfs, dev_size_mb=64)
    bcache.create(sysfs, backings=[lab_disks[0]], cache=ssd.node, bucket="64k")
    install("--smart")
    assert show("cachemgr-smart.timer", "ActiveState")["ActiveState"] == "active"
    sh("systemctl", "log-target", "journal-or-kmsg")
    cursor = journal_cursor()
    sh("systemctl", "start", "cachemgr-smart.service")  # a oneshot: returns when it ended
    st = show("cachemgr-smart.service", "Result", "ExecMainStatus")
    assert st == {"Result": "success", "ExecMainStatus": "0"}, st
    key = ssd.wwid or ssd.serial
    assert key
    entry = json.loads((STATE / "smart" / f"{key}.json").read_text())
    # smartctl answered inside the sandbox as it does outside it
    assert "error" not in entry and "smartctl" in entry, entry
    h = smart.parse(ssd.node, entry["smartctl"], entry["read_at"])
    outside = smart.parse(ssd.node, smart.smartctl(ssd.node), 0.0)
    assert h.error is None and h.protocol == "SCSI" and h.model == outside.model, h
    assert (h.passed, h.media_errors, h.replace_soon) == (
        outside.passed, outside.media_errors, outside.replace_soon)
    lines = unit_journal("cachemgr-smart.service", cursor)
    report("smart", health=h.words(), journal_lines=len(lines), unit=st)
    # a drive to replace soon is the one line (a warning); a fine one leaves nothing
    assert lines == ([f"cachemgr: warning: {ssd.node}: {h.words()}"] if h.replace_soon
                     else []), lines
    # the device list is in force: without block-sd smartctl cannot open the disk (the run
    # still succeeds, and says why in a warning)
    dropin = Path("/run/systemd/system/cachemgr-smart.service.d/nodisk.conf")
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text("[Service]\nDeviceAllow=\nDeviceAllow=/dev/mapper/control rw\n")
    sh("systemctl", "daemon-reload")
    try:
        sh("systemctl", "start", "cachemgr-smart.service")
        denied = smart.lookup(ssd.node, key, refresh=False)
        assert denied is not None and denied.error and denied.read_at > h.read_at, denied
        report("smart_without_the_disks", error=denied.error)
    finally:
        dropin.unlink()
        sh("systemctl", "daemon-reload")


@pytest.mark.kernel(systemd=True, disks="256M,64M", timeout=240)
def test_a_change_leaves_a_journal_entry_read_ones_none(lab_disks: list[str]) -> None:
    """The journal trail (cachemgr/ops/trail.py) into the real systemd-journald: a mode
    change by SUDO_USER alice is one entry with its structured fields, read back with
    journalctl; a read-only status adds none; a refusal is an entry of its own."""
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[lab_disks[0]], cache=lab_disks[1], bucket="64k")

    def entries() -> list[dict[str, str]]:
        out = runner.run(["journalctl", "-o", "json", "--no-pager", "SYSLOG_IDENTIFIER=cachemgr"],
                         check=False, timeout=60).stdout
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def cm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cachemgr", *args], capture_output=True,
                              text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "SUDO_USER": "alice"})

    before = len(entries())
    r = cm("mode", "/dev/bcache0", "writeback")
    assert r.returncode == 0, r.stderr
    wait_for = time.monotonic() + 20
    while len(entries()) == before and time.monotonic() < wait_for:
        time.sleep(0.2)
    new = entries()[before:]
    (e,) = [x for x in new if x.get("CACHEMGR_ATTRIBUTE") == "cache_mode"]
    assert (e["CACHEMGR_COMMAND"], e["CACHEMGR_TARGET"], e["CACHEMGR_FROM"], e["CACHEMGR_TO"],
            e["CACHEMGR_USER"], e["CACHEMGR_EXIT"], e["CACHEMGR_OUTCOME"]) == (
        "mode", "/dev/bcache0", "writethrough", "writeback", "alice", "0", "changed"), e
    assert e["PRIORITY"] == "5" and "alice" in e["MESSAGE"]
    n = len(entries())
    assert cm("status").returncode == 0
    time.sleep(1)
    assert len(entries()) == n  # read-only: nothing
    # another run holds the device: refused (exit 3), and that is an entry too
    from cachemgr.backends import snapshot
    from cachemgr.core import state
    from cachemgr.procedures import kinds

    k = kinds.resolve(snapshot.take(sysfs), "/dev/bcache0", sysfs)
    with state.locked(k.locks[0][0], "/dev/bcache0", holder={"procedure": "drain"}):
        r = cm("mode", "/dev/bcache0", "writethrough")
    assert r.returncode == 3, r.stderr
    wait_for = time.monotonic() + 20
    while len(entries()) == n and time.monotonic() < wait_for:
        time.sleep(0.2)
    (e,) = entries()[n:]
    assert (e["CACHEMGR_OUTCOME"], e["CACHEMGR_EXIT"], e["PRIORITY"]) == ("refused", "3", "6"), e
    assert "drain" in e["CACHEMGR_REASON"], e


# ------------------------------------------------------------------------------ scrub


@pytest.mark.kernel(systemd=True, disks="128M,256M", timeout=400)
def test_scrub_timer_finds_the_corrupted_copies_in_its_sandbox(lab_disks: list[str]) -> None:
    """cachemgr-scrub.service (``scrub --all`` under the protect pass's sandbox), installed
    and its timer enabled by ``install-udev.sh --scrub``: a writethrough bcache device whose
    5 copies were corrupted on the SSD is compared (O_DIRECT reads of the device and its
    backing disk), the copies found and dropped (detach and attach: sysfs writes), each
    outcome in the unit's journal, and ``check`` warns (the record under its
    StateDirectory)."""
    from tests.kernel import test_scrub_kernel as sk

    hdd, ssd = lab_disks
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[hdd], cache=ssd, bucket="128k")
    sysfs.write("block/bcache0/bcache/cache_mode", "writethrough")
    data = sk.content(b"ST", sk.HOT, 11)
    sk.write_pages("/dev/bcache0", data)
    changed = sk.corrupt_on_ssd(ssd, b"ST", sk.N)
    assert sk.served_wrong("/dev/bcache0", data) == changed
    install("--scrub")
    # this checkout's code (the venv's cachemgr may be another checkout's editable install)
    dropin = Path("/run/systemd/system/cachemgr-scrub.service.d/src.conf")
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text(f"[Service]\nEnvironment=PYTHONPATH={ROOT}\n")
    sh("systemctl", "daemon-reload")
    timer = show("cachemgr-scrub.timer", "ActiveState", "UnitFileState")
    assert timer == {"ActiveState": "active", "UnitFileState": "enabled"}, timer
    sh("systemctl", "log-target", "journal-or-kmsg")
    cursor = journal_cursor()
    r = subprocess.run(["systemctl", "start", "cachemgr-scrub.service"], capture_output=True,
                       text=True, timeout=300, check=False)  # a oneshot: returns at its end
    st = show("cachemgr-scrub.service", "Result", "ExecMainStatus")
    lines = unit_journal("cachemgr-scrub.service", cursor)
    report("scrub", unit=st, journal=lines)
    assert r.returncode == 0 and st == {"Result": "success", "ExecMainStatus": "0"}, (st, lines)
    assert any(x.startswith("scrub /dev/bcache0: ") and f"{sk.N} served unlike the origin"
               in x for x in lines), lines
    assert sk.served_wrong("/dev/bcache0", data) == []  # dropped: read from the origin now
    doc = json.loads(sh(sys.executable, "-m", "cachemgr", "check", "--json", check=False))
    assert ("scrub-mismatch", "/dev/bcache0") in {(f["code"], f["device"])
                                                 for f in doc["findings"]}, doc


# ------------------------------------------------------------------------------ governor


@pytest.mark.kernel(systemd=True, disks="256M,64M", timeout=300)
def test_governor_unit_turns_the_knobs_in_its_sandbox_and_stop_puts_them_back(
        lab_disks: list[str]) -> None:
    """cachemgr-governor.service (install-udev --governor) under its sandbox: with the
    policy's [writeback] enabled it governs a bcache device in writeback (its settings
    changed, journaled, its state file written); systemctl stop (SIGTERM) puts every
    setting back, exit 0, the journal gone."""
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[lab_disks[0]], cache=lab_disks[1], bucket="64k",
                  mode=CacheMode.WRITEBACK)
    rel = f"block/{os.path.basename(lab_disks[0])}/bcache"
    knobs = ("writeback_percent", "writeback_delay", "writeback_running",
             "writeback_rate_minimum")

    def now() -> dict[str, str]:
        return {k: sysfs.read(f"{rel}/{k}").strip() for k in knobs}

    before = now()
    POLICY.parent.mkdir(parents=True, exist_ok=True)
    POLICY.write_text("version = 1\n\n[writeback]\nenabled = true\nread_p99_ms = 20\n"
                      "max_dirty = \"16M\"\nmax_age_s = 60\n")
    sh("systemctl", "log-target", "journal-or-kmsg")
    # this checkout's code (the venv's cachemgr may be another checkout's editable install)
    dropin = Path("/run/systemd/system/cachemgr-governor.service.d/src.conf")
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text(f"[Service]\nEnvironment=PYTHONPATH={ROOT}\n")
    cursor = journal_cursor()
    install("--governor")
    wait(lambda: now()["writeback_delay"] == "1", 60, "the governor's writeback_delay 1")
    assert show("cachemgr-governor.service", "ActiveState")["ActiveState"] == "active"
    journals = list((STATE / "undo").glob("*.json"))
    assert len(journals) == 1 and json.loads(journals[0].read_text())["procedure"] == "governor"
    wait(lambda: (STATE / "governor" / "state.json").exists(), 30, "the governor's state")
    st = json.loads((STATE / "governor" / "state.json").read_text())
    assert st["running"] is True and st["devices"][0]["device"] == "/dev/bcache0", st
    sh("systemctl", "stop", "cachemgr-governor.service")
    res = show("cachemgr-governor.service", "Result", "ExecMainStatus", "ActiveState")
    assert res == {"Result": "success", "ExecMainStatus": "0", "ActiveState": "inactive"}, res
    assert now() == before
    assert not list((STATE / "undo").glob("*.json"))
    assert json.loads((STATE / "governor" / "state.json").read_text())["running"] is False
    lines = unit_journal("cachemgr-governor.service", cursor)
    report("governor_unit", before=before, unit=res, journal_lines=len(lines))
    # its status lines (stderr) reach the journal
    assert any("governing /dev/bcache0" in x for x in lines), lines

