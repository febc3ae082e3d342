"""The alert rules proven on real faults (issue #31 item 7): Debian's Prometheus (the real
binary, /usr/bin/prometheus from the host's root, which the guest sees read-only) scrapes
``cachemgr metrics --listen`` on loopback inside the lab guest and evaluates a copy of
monitoring/prometheus/cachemgr.rules.yml while a fault is injected on the lab kernel; each
alert must go to firing by Prometheus's own rule evaluation, read from its HTTP API.

What the copy changes, and nothing else (:func:`rules_copy`): every ``for:`` is ``FOR``;
CachemgrReplacementUnfinished's 12 h without a journal write is ``STALE_RUN_S``; the window
in which CachemgrDrainStalled wants the dirty data not to have shrunk is ``DRAIN_WINDOW``
instead of 30 min. Scrapes and evaluations every ``SCRAPE``. The measured times (fault to
firing, as the API shows it) go to stdout and to $CACHEMGR_ALERT_TIMES_LOG when set
(docs/kernel-notes.md, "Alerts on real faults")."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import bcache, scsi, snapshot
from cachemgr.core import runner
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from tests.kernel import measure, scenarios
from tests.unit.test_metrics import free_port

RULES = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus" / "cachemgr.rules.yml"
PROMETHEUS = "/usr/bin/prometheus"
SCRAPE = "1s"  # scrape_interval and evaluation_interval
FOR = "2s"  # every rule's for: in the copy
STALE_RUN_S = 20  # CachemgrReplacementUnfinished: no journal write for this long (12 h)
DRAIN_WINDOW = "20s"  # CachemgrDrainStalled: dirty data not shrunk over this window (30m)
LOG = "CACHEMGR_ALERT_TIMES_LOG"


def rules_copy(text: str) -> str:
    """The shipped rules with the test's ``for:`` and the two long windows shortened."""
    out, n = re.subn(r"(?m)^(\s+for: )\S+$", rf"\g<1>{FOR}", text)
    assert n >= 8, n
    for old, new in (("> 12 * 3600", f"> {STALE_RUN_S}"),
                     ("delta(cachemgr_dirty_bytes[30m])",
                      f"delta(cachemgr_dirty_bytes[{DRAIN_WINDOW}])")):
        assert old in out, old
        out = out.replace(old, new)
    return out


def wait_for(what: str, until: Callable[[], object], timeout: float = 60,
             every: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(every)


class Monitor:
    """``cachemgr metrics --listen 127.0.0.1:P`` and a Prometheus scraping it, both on
    loopback; :meth:`close` ends both (the fixture does)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.mport, self.pport = free_port(), free_port()
        env = {**os.environ, "PYTHONPATH": os.getcwd()}
        self.log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 (closed in close())
        self.exporter = subprocess.Popen(
            [sys.executable, "-m", "cachemgr", "metrics", "--listen", f"127.0.0.1:{self.mport}",
             "--no-vms"], env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        (tmp / "cachemgr.rules.yml").write_text(rules_copy(RULES.read_text()))
        (tmp / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {SCRAPE}\n  scrape_timeout: {SCRAPE}\n"
            f"  evaluation_interval: {SCRAPE}\n"
            "rule_files:\n  - cachemgr.rules.yml\n"
            "scrape_configs:\n  - job_name: cachemgr\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{self.mport}']\n")
        self.prom = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.pport}", "--log.level=warn"],
            stdout=self.log, stderr=self.log, cwd=tmp)
        self.base = f"http://127.0.0.1:{self.pport}"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            data = json.loads(r.read())
        assert data["status"] == "success", data
        return data["data"]

    def ready(self) -> float:
        """Wait until Prometheus answers and has scraped the exporter; seconds it took."""
        t0 = time.monotonic()

        def up() -> bool:
            assert self.prom.poll() is None, self.text_log()
            try:
                targets = self.get("/api/v1/targets")["activeTargets"]
            except OSError:
                return False
            return any(t["health"] == "up" for t in targets)

        wait_for("Prometheus up and scraping", up, timeout=90, every=0.5)
        return time.monotonic() - t0

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/query", query=expr)["result"])

    def scrape_seconds(self) -> float:
        return float(self.get("/api/v1/targets")["activeTargets"][0]["lastScrapeDuration"])

    def firing(self, name: str, labels: dict[str, str]) -> dict[str, Any] | None:
        for a in self.get("/api/v1/alerts")["alerts"]:
            if (a["labels"]["alertname"] == name and a["state"] == "firing"
                    and all(a["labels"].get(k) == v for k, v in labels.items())):
                return dict(a)
        return None

    def wait_firing(self, name: str, labels: dict[str, str], since: float,
                    timeout: float = 60) -> dict[str, Any]:
        """Poll /api/v1/alerts until ``name`` fires with ``labels``; the alert, with
        ``fired_s`` (``since``, a time.time(), to the poll that saw it firing) and
        ``active_s`` (to the evaluation that first found it true, Prometheus's activeAt)."""
        deadline = time.monotonic() + timeout
        while True:
            a = self.firing(name, labels)
            if a is not None:
                a["fired_s"] = round(time.time() - since, 1)
                a["active_s"] = round(datetime.fromisoformat(a["activeAt"]).timestamp()
                                      - since, 1)
                return a
            if time.monotonic() > deadline:
                active = self.get("/api/v1/alerts")["alerts"]
                raise AssertionError(f"{name}{labels} not firing within {timeout:.0f} s; "
                                     f"active: {json.dumps(active)[:3000]}")
            time.sleep(0.5)

    def text_log(self) -> str:
        self.log.flush()
        return (self.tmp / "prometheus.log").read_text(errors="replace")[-3000:]

    def close(self) -> None:
        for p in (self.prom, self.exporter):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        self.log.close()


@contextmanager
def monitor(tmp: Path) -> Iterator[Monitor]:
    assert Path(PROMETHEUS).exists(), f"{PROMETHEUS} missing: scripts/setup.sh installs it"
    m = Monitor(tmp)
    try:
        m.ready()
        yield m
    finally:
        m.close()
    assert m.prom.returncode is not None  # Prometheus is gone


def report(name: str, fault: str, alerts: dict[str, dict[str, Any]], m: Monitor,
           **more: object) -> None:
    measure.report(LOG, name, fault=fault, scrape=SCRAPE, for_=FOR,
                   scrape_s=round(m.scrape_seconds(), 3),
                   alerts={k: {"fired_s": a["fired_s"], "active_s": a["active_s"]}
                           for k, a in alerts.items()}, **more)


def dirty_seen(m: Monitor, device: str) -> bool:
    return bool(m.query(f'cachemgr_dirty_bytes{{device="{device}"}} > 0'))


@pytest.mark.kernel(disks="1G,256M", timeout=300)
def test_stranded_dirty_data(lab_disks: list[str], tmp_path: Path) -> None:
    """A cache set stopped with dirty data: /dev/bcache0 and the set vanish from /sys (the
    scrape probes no disk, so nothing of them is exported); then the backing device
    registered again alone (what udev's 69-bcache.rules or a boot does), dirty without its
    set."""
    hdd = lab_disks[0]
    sysfs = scenarios.bcache_holding_dirty(hdd, lab_disks[1], bucket="128k", size="64M",
                                           io_size="8M")
    cset = snapshot.take(sysfs).backings[0].cset_uuid
    assert cset is not None
    with monitor(tmp_path) as m:
        wait_for("dirty bcache0 scraped", lambda: dirty_seen(m, "bcache0"), timeout=30)
        t0 = time.time()
        sysfs.write(f"fs/bcache/{cset}/stop", "1")
        wait_for("set and bcache0 gone", lambda: not sysfs.is_dir(f"fs/bcache/{cset}")
                 and not sysfs.is_dir("block/bcache0"), timeout=60)
        gone = m.wait_firing("CachemgrDirtyDeviceGone", {"device": "bcache0"}, t0, timeout=30)
        assert m.firing("CachemgrDirtyDataStranded", {}) is None

        t1 = time.time()
        bcache.register(sysfs, hdd)  # waits for the stopped disk to be released
        name = os.path.basename(hdd)
        wait_for("backing registered", lambda: sysfs.is_dir(f"block/{name}/bcache"))
        assert sysfs.read(f"block/{name}/bcache/state") == "dirty"
        stranded = m.wait_firing("CachemgrDirtyDataStranded", {"device": name}, t1,
                                 timeout=30)
        assert stranded["labels"]["severity"] == "critical"
        report("stranded", "cache set stopped with dirty data, then the backing registered "
               "alone", {"CachemgrDirtyDeviceGone": gone, "CachemgrDirtyDataStranded": stranded},
               m)


@pytest.mark.kernel(disks="1G", timeout=300)
def test_ssd_failing_with_dirty_data(lab_disks: list[str], tmp_path: Path) -> None:
    """The cache SSD (scsi_debug) starts failing every read (medium errors) while it holds
    dirty data: writeback's reads of the dirty data fail, bcache counts the errors, fails
    the set past its error limit and stops the dirty backing device."""
    sysfs = Sysfs()
    ssd = scsi.load_scsi_debug(sysfs, dev_size_mb=160, per_host_store=1)[0]
    bcache.create(sysfs, backings=[lab_disks[0]], cache=ssd.node, bucket="64k",
                  mode=CacheMode.WRITEBACK)
    rel = "block/bcache0/bcache"
    sysfs.write(f"{rel}/writeback_running", "0")
    sysfs.write(f"{rel}/sequential_cutoff", "0")
    runner.run(["fio", "--name=w", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=4k",
                "--size=64M", "--io_size=8M", "--direct=1", "--output-format=json"],
               timeout=120)
    snap = snapshot.take(sysfs)
    cset = snap.backings[0].cset_uuid
    assert cset is not None
    sectors = int(runner.run(["blockdev", "--getsz", ssd.node]).stdout)
    with monitor(tmp_path) as m:
        wait_for("dirty bcache0 scraped", lambda: dirty_seen(m, "bcache0"), timeout=30)
        t0 = time.time()
        params = Path("/sys/module/scsi_debug/parameters")
        (params / "medium_error_start").write_text("0")
        (params / "medium_error_count").write_text(str(sectors))
        (params / "opts").write_text("2")  # SDEBUG_OPT_MEDIUM_ERR: reads fail
        sysfs.write(f"{rel}/writeback_running", "1")  # writeback reads the dirty data
        wait_for("bcache0 gone", lambda: not sysfs.is_dir("block/bcache0"), timeout=90)
        t_gone = time.time() - t0
        kernel = [line.split("] ", 1)[-1] for line in runner.run(["dmesg"]).stdout.splitlines()
                  if "bcache" in line][-6:]
        fired: dict[str, dict[str, Any]] = {}
        fired["CachemgrDirtyDeviceGone"] = m.wait_firing(
            "CachemgrDirtyDeviceGone", {"device": "bcache0"}, t0, timeout=30)
        # what the scrapes saw of the SSD's errors before the set went
        seen = m.query("max_over_time(cachemgr_bcache_cache_io_errors[5m])")
        rising = m.query('max_over_time(ALERTS{alertname="CachemgrIOErrorsRising",'
                         'alertstate="firing"}[5m])')
        report("ssd_failing", "cache SSD failing every read (scsi_debug medium errors) "
               "with dirty data", fired, m, bcache0_gone_s=round(t_gone, 1),
               cache_io_errors_seen=[s["value"][1] for s in seen],
               io_errors_rising_fired=bool(rising), dmesg=kernel)


@pytest.mark.kernel(disks="1G,256M", timeout=300)
def test_stalled_drain(lab_disks: list[str], tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``cachemgr drain`` under way when its backing device (a dm-delay "HDD", 2 s per IO so
    that the drain takes longer than the test needs to see it start) stops taking IO
    (dmsetup suspend): the dirty data stops shrinking."""
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    hdd, ssd = lab_disks[0], lab_disks[1]
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    runner.run(["dmsetup", "create", "hdd", "--table", f"0 {sectors} linear {hdd} 0"])
    sysfs = Sysfs()
    bcache.create(sysfs, backings=["/dev/mapper/hdd"], cache=ssd, bucket="128k",
                  mode=CacheMode.WRITEBACK)
    sysfs.write("block/bcache0/bcache/writeback_running", "0")
    runner.run(["fio", "--name=fill", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=64k",
                "--size=256M", "--io_size=64M", "--direct=1", "--iodepth=8",
                "--ioengine=libaio", "--output-format=json"], timeout=120)
    # the disk slowed once the set-up is done (its probes take hundreds of reads)
    for step in (["suspend", "hdd"], ["load", "hdd", "--table", f"0 {sectors} delay {hdd} 0 2000"],
                 ["resume", "hdd"]):
        runner.run(["dmsetup", *step], timeout=60)
    with monitor(tmp_path) as m:
        wait_for("dirty bcache0 scraped", lambda: dirty_seen(m, "bcache0"), timeout=30)
        drain = subprocess.Popen([sys.executable, "-m", "cachemgr", "drain", "/dev/bcache0",
                                  "--stall-timeout", "600"], text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env={**os.environ, "PYTHONPATH": os.getcwd()})
        try:
            # the drain under way (its journal scraped), then the disk stops taking IO
            # (suspend waits for the IO in flight: dm-delay's queue is flushed first)
            wait_for("drain journal scraped",
                     lambda: m.query('cachemgr_drain_running{device="bcache0"} == 1'),
                     timeout=30)
            t0 = time.time()
            runner.run(["dmsetup", "suspend", "hdd"], timeout=60)
            dirty0 = snapshot.take(sysfs).backings[0].dirty
            assert dirty0 is not None and not dirty0.is_zero(512), dirty0
            stalled = m.wait_firing("CachemgrDrainStalled", {"device": "bcache0"}, t0,
                                    timeout=90)
            dirty1 = snapshot.take(sysfs).backings[0].dirty
            assert dirty0 is not None and dirty1 is not None and dirty1.low == dirty0.low
            assert drain.poll() is None  # still waiting
            report("stalled_drain", "cachemgr drain, its dm-delay backing device suspended",
                   {"CachemgrDrainStalled": stalled}, m, dirty=str(dirty1),
                   window=DRAIN_WINDOW)
        finally:
            runner.run(["dmsetup", "resume", "hdd"], timeout=60)
            drain.send_signal(signal.SIGINT)
            out, err = drain.communicate(timeout=120)
            print(out[-1000:], err[-1000:])


@pytest.mark.kernel(disks="512M", timeout=300)
def test_interrupted_replacement(lab_disks: list[str], tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """replace-ssd killed (SIGKILL) right after its drain step: its journal says running and
    claims the cache; nobody holds the lock."""
    from cachemgr.procedures import replace

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = Sysfs()
    ssd = scsi.load_scsi_debug(sysfs, dev_size_mb=160, per_host_store=1)[0]
    bcache.create(sysfs, backings=[lab_disks[0]], cache=ssd.node, bucket="64k",
                  mode=CacheMode.WRITEBACK)
    runner.run(["fio", "--name=w", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=4k",
                "--size=32M", "--io_size=4M", "--direct=1", "--output-format=json"],
               timeout=120)
    with monitor(tmp_path) as m:
        r = subprocess.run([sys.executable, "-m", "cachemgr", "replace-ssd", ssd.node, "--yes"],
                           capture_output=True, text=True, timeout=180,
                           env={**os.environ, "PYTHONPATH": os.getcwd(),
                                replace.KILL_AFTER_ENV: "drain"})
        assert r.returncode == -9, (r.returncode, r.stderr)
        t0 = time.time()
        runs = [j for j in replace.list_runs() if j.status == "running"]
        assert len(runs) == 1 and runs[0].done[-1] == "drain"
        run = runs[0].id
        fired = {
            "CachemgrProcedureInterrupted": m.wait_firing(
                "CachemgrProcedureInterrupted", {"procedure": "replace-ssd", "run": run}, t0,
                timeout=60),
            "CachemgrReplacementUnfinished": m.wait_firing(
                "CachemgrReplacementUnfinished", {"run": run, "status": "running"}, t0,
                timeout=90),
        }
        report("interrupted_replacement", "replace-ssd SIGKILLed after its drain step", fired,
               m, stale_run_s=STALE_RUN_S)
