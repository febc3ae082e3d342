"""A Prometheus scrape of the lab kernel parses and matches status --json; the listener binds
loopback only; a scrape never probes a disk (issue #15)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.kernel import scenarios
from tests.unit.test_metrics import free_port, listening


@pytest.mark.kernel(disks="1G,256M")
def test_scrape_matches_status(lab_disks: list[str]) -> None:
    scenarios.bcache_holding_dirty(lab_disks[0], lab_disks[1], bucket="128k", size="64M",
                                   io_size="8M")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    status = json.loads(subprocess.run([sys.executable, "-m", "cachemgr", "status", "--json"],
                                       capture_output=True, text=True, env=env,
                                       check=True).stdout)
    port = free_port()
    # :PORT, as the shipped unit has it: loopback only, both families (the lab has ::1)
    p = subprocess.Popen([sys.executable, "-m", "cachemgr", "metrics", "--listen",
                          f":{port}"], env=env, stderr=subprocess.PIPE)
    try:
        text = ""
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        assert text, "no scrape"
        with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=5) as r:
            assert "cachemgr_dirty_bytes" in r.read().decode()
        assert listening(port) == {"127.0.0.1", "::1"}
    finally:
        p.terminate()
        p.wait(timeout=10)
    samples = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    d = status["devices"][0]
    # device: the kernel name, as node_exporter's node_disk_* has it; path: the node
    lab = (("device", os.path.basename(d["device"])), ("kind", "bcache"), ("path", d["device"]))
    key = ("cachemgr_dirty_bytes", lab)
    # writeback is off, so the dirty amount cannot change between the two reads
    assert samples[key] == d["dirty_bytes"] > 0
    assert samples[("cachemgr_cache_mode", (*lab[:2], ("mode", "writeback"), lab[2]))] == 1.0
    assert samples[("cachemgr_cache_state", (*lab, ("state", "dirty")))] == 1.0
    # the textfile form says the same
    out = subprocess.run([sys.executable, "-m", "cachemgr", "metrics", "--textfile",
                          "/tmp/cachemgr.prom"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    with open("/tmp/cachemgr.prom") as f:
        assert (f"cachemgr_dirty_bytes{{device=\"{os.path.basename(d['device'])}\","
                f"kind=\"bcache\",path=\"{d['device']}\"}}") in f.read()


@pytest.mark.kernel(disks="1G,256M,64M")
def test_scrape_never_probes_a_disk(lab_disks: list[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """On the live /sys, with an unclaimed disk (a VM's, say) beside a bcache device: neither
    a scrape nor the textfile run reads a superblock or opens a block device."""
    from cachemgr.backends import bcache_super, identity
    from cachemgr.cli.main import main
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.ops.metrics import SnapshotCollector

    scenarios.bcache_holding_dirty(lab_disks[0], lab_disks[1], bucket="128k", size="64M",
                                   io_size="8M")
    spare = lab_disks[2]
    # what status does (it probes): the unclaimed disk is among those it would read
    assert any(name == os.path.basename(spare) for name, _ in bcache_super._unclaimed(Sysfs()))

    def boom(*a: object, **k: object) -> None:
        raise AssertionError(f"a scrape probed {a}")

    monkeypatch.setattr(identity, "probe_superblock", boom)
    monkeypatch.setattr(bcache_super, "super_show", boom)
    opened: list[str] = []
    real_open = os.open

    def spy_open(path: object, *a: object, **k: object) -> int:
        if str(path).startswith("/dev/") and str(path) != "/dev/null":
            opened.append(str(path))
        return real_open(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy_open)
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(Sysfs()))
    assert b"cachemgr_dirty_bytes{" in generate_latest(reg)
    out = tmp_path / "cachemgr.prom"
    assert main(["metrics", "--textfile", str(out)]) == 0
    assert "cachemgr_dirty_bytes{" in out.read_text()
    assert opened == []


def owner_samples() -> dict[str, tuple[dict[str, str], float | None]]:
    """path -> (labels of cachemgr_device_owner_info, cachemgr_device_owner_since_seconds)
    from a scrape of the live kernel (SnapshotCollector: the listener's and textfile's)."""
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.ops.metrics import SnapshotCollector

    reg = CollectorRegistry()
    reg.register(SnapshotCollector(Sysfs(), vms=False))
    info: dict[str, dict[str, str]] = {}
    since: dict[str, float] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for smp in fam.samples:
            if smp.name == "cachemgr_device_owner_info":
                assert smp.value == 1.0 and smp.labels["path"] not in info
                info[smp.labels["path"]] = smp.labels
            elif smp.name == "cachemgr_device_owner_since_seconds":
                since[smp.labels["path"]] = smp.value
    return {p: (lab, since.get(p)) for p, lab in info.items()}


@pytest.mark.kernel(disks="1G,256M", timeout=500)
def test_scrape_says_who_owns_the_device(lab_disks: list[str]) -> None:
    """A drain running (its process holds the device's lock, /proc/locks says so), then
    killed (its journal owns the device), then resumed to the end (nobody): the scrape
    follows, and agrees with status --json's owner."""
    import signal

    from cachemgr.core import runner
    from tests.kernel import clirun
    from tests.kernel.test_drain_kernel import (
        light_load,
        setup_dirty,
        stop_light,
        tunables,
        writeback_on,
    )

    sysfs = setup_dirty(lab_disks, delay_ms=20, dirty="64M")
    reader = light_load()
    writeback_on(sysfs)
    lab = {"kind": "bcache", "device": "bcache0", "path": "/dev/bcache0",
           "procedure": "drain", "run": "", "step": ""}
    try:
        assert owner_samples() == {}
        t0 = time.time()
        drain = clirun.process("drain", "/dev/bcache0", "--stall-timeout", "300")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and tunables(sysfs)[:2] != ("0", "1"):
            time.sleep(0.05)
        assert tunables(sysfs)[:2] == ("0", "1"), "the drain did not start"
        # hold the drain where it is: the backing "HDD" takes no IO until resumed
        runner.run(["dmsetup", "suspend", "hdd"], timeout=60)
        try:
            assert drain.poll() is None, drain.communicate()
            owned = owner_samples()
            assert owned.keys() == {"/dev/bcache0"}, owned
            labels, since = owned["/dev/bcache0"]
            assert labels == {**lab, "state": "running"}
            assert since is not None and t0 - 1 <= since <= time.time()
            drain.send_signal(signal.SIGKILL)
            drain.wait()
            owned = owner_samples()
            assert owned["/dev/bcache0"][0] == {**lab, "state": "interrupted"}, owned
            doc = json.loads(clirun.in_process("status", "--json").stdout)
            owner = doc["devices"][0]["owner"]
            assert owner["procedure"] == "drain" and owner["running"] is False
            assert owned["/dev/bcache0"][1] == owner["since"]
        finally:
            runner.run(["dmsetup", "resume", "hdd"], timeout=60)
        r = clirun.in_process("drain", "/dev/bcache0", "--resume")
        assert r.returncode == 0, r.stderr
        assert tunables(sysfs) == ("10", "30", "1")
        assert owner_samples() == {}
    finally:
        stop_light(reader)


def _gauge(reg: CollectorRegistry, name: str) -> dict[str, float]:
    """path -> value of gauge ``name`` in one scrape of ``reg``."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for smp in fam.samples:
            if smp.name == name:
                out[smp.labels["path"]] = smp.value
    return out


@pytest.mark.kernel(disks="256M,64M,16M")
def test_listener_runs_dmsetup_table_only_after_a_uevent(
        lab_disks: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener's collector on a dm-cache device: scrapes with nothing changed run
    ``dmsetup status`` (the counters) but not ``dmsetup table``; a new table going live (the
    mode switch's load + resume) moves kernel/uevent_seqnum and the next scrape reads the
    table and shows the new mode. What the kernel offers besides: /sys/block/dm-N/dm/ has no
    event counter (docs/kernel-notes.md, "uevent_seqnum")."""
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.ops.metrics import SnapshotCollector
    from tests.kernel import clirun
    from tests.unit.test_metrics_cache import count_dmsetup

    origin, ssd, meta = lab_disks
    rc = clirun.in_process("create", "dm-cache", "vc", "--origin", origin, "--cache", ssd,
                           "--metadata", meta, "--mode", "writeback")
    assert rc.returncode == 0, rc.stderr
    calls = count_dmsetup(monkeypatch)
    sysfs = Sysfs()
    dm = next(n for n in os.listdir("/sys/block") if n.startswith("dm-")
              and sysfs.read_opt(f"block/{n}/dm/name") == "vc")
    attrs = set(os.listdir(f"/sys/block/{dm}/dm"))
    assert {"name", "uuid", "suspended"} <= attrs and not [a for a in attrs if "event" in a]
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sysfs, vms=False))
    mode = "cachemgr_cache_mode"
    seq = sysfs.read("kernel/uevent_seqnum")
    for _ in range(3):
        generate_latest(reg)
    assert sysfs.read("kernel/uevent_seqnum") == seq  # three scrapes sent no uevent
    assert calls.count("table") == 1 and calls.count("status") == 3, calls
    rc = clirun.in_process("mode", "/dev/mapper/vc", "writethrough")
    assert rc.returncode == 0, rc.stderr
    assert sysfs.read("kernel/uevent_seqnum") != seq
    calls.clear()  # the mode command's own scans
    modes = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for smp in fam.samples:
            if smp.name == mode and smp.value == 1.0:
                modes[smp.labels["path"]] = smp.labels["mode"]
    assert modes == {"/dev/mapper/vc": "writethrough"}
    assert calls.count("table") == 1, calls


@pytest.mark.kernel(disks="512M,128M")
def test_wb_per_second_is_traffic_not_the_setting(lab_disks: list[str]) -> None:
    """WB/s (procedures/traffic.py): a clean idle device measures 0 while its writeback_rate
    setting reads its 512 KiB/s; a drain of what fio left dirty measures the bytes written
    back, adding up to the dirty data drained."""
    from cachemgr.backends import bcache, snapshot
    from cachemgr.core import runner
    from cachemgr.core.model import CacheMode, CacheState
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.ops.metrics import SnapshotCollector
    from cachemgr.procedures import traffic

    sysfs = Sysfs()
    bcache.create(sysfs, backings=[lab_disks[0]], cache=lab_disks[1], bucket="128k",
                  mode=CacheMode.WRITEBACK)
    t = [0.0]
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sysfs, vms=False, clock=lambda: t[0]))
    generate_latest(reg)  # the first look
    time.sleep(1)
    t[0] += 1
    assert _gauge(reg, "cachemgr_bcache_written_back_bytes_per_second") == {"/dev/bcache0": 0}
    assert _gauge(reg, "cachemgr_bcache_writeback_rate_bytes_per_second")["/dev/bcache0"] > 0
    # dirty data held (writeback stopped), then drained
    sysfs.write("block/bcache0/bcache/writeback_running", "0")
    runner.run(["fio", "--name=w", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=64k",
                "--size=64M", "--io_size=8M", "--direct=1", "--output-format=json"])
    before = snapshot.take(sysfs, stats=False).backings[0]
    assert before.dirty is not None and before.dirty.low >= 4 << 20
    meter = traffic.Meter()
    t0 = time.monotonic()
    meter.update(sysfs, [before], t0)
    sysfs.write("block/bcache0/bcache/writeback_percent", "0")
    sysfs.write("block/bcache0/bcache/writeback_running", "1")
    rates: list[tuple[float, float]] = []
    last = t0
    while time.monotonic() - t0 < 120:
        time.sleep(0.5)
        b = snapshot.take(sysfs, stats=False).backings[0]
        now = time.monotonic()
        r = meter.update(sysfs, [b], now)[b.key]
        assert r is not None
        rates.append((now - last, r))
        last = now
        if b.state == CacheState.CLEAN:
            break
    # clean: dirty_data reads 0.0k (bch_hprint: below 102 bytes)
    assert b.state == CacheState.CLEAN and b.dirty is not None and b.dirty.low == 0, \
        "the drain did not end"
    total = sum(dt * r for dt, r in rates)
    assert max(r for _, r in rates) > 0
    # what was written back is the dirty data (within bch_hprint's bounds), plus bcache's
    # superblock when the device turned clean
    assert before.dirty.low <= total <= before.dirty.high + (64 << 10), (total, before.dirty)
    print(f"drained {before.dirty}, measured {total:.0f} bytes in {len(rates)} looks, "
          f"peak {max(r for _, r in rates):.0f} B/s")
