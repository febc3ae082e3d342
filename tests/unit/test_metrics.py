"""Metrics from captured trees parse as Prometheus text and agree with status --json; a
scrape never probes a disk; the listener binds loopback unless told otherwise (issue #15)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cachemgr.backends import snapshot
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.metrics import SnapshotCollector
from cachemgr.procedures.metrics import LOOPBACK, parse_listen

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def scrape(root: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(Sysfs(root)))
    text = generate_latest(reg).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@pytest.mark.parametrize("fx", sorted(FIXTURES.glob("*/sys")), ids=lambda p: p.parent.name)
def test_metrics_match_status_json(fx: Path) -> None:
    m = scrape(fx)
    status = snapshot.to_json(snapshot.take(Sysfs(fx)))
    for d in status["devices"]:
        d = {**d, "device": d["device"] or d.get("backing")}  # a stopped backing device
        modes = {lab["mode"]: v for lab, v in m["cachemgr_cache_mode"]
                 if lab["path"] == d["device"]}
        assert modes[d["mode"]] == 1.0 and sum(modes.values()) == 1.0
        states = {lab["state"]: v for lab, v in m["cachemgr_cache_state"]
                  if lab["path"] == d["device"]}
        # label values have no spaces: bcache's "no cache" is no_cache
        assert states[d["state"].replace(" ", "_")] == 1.0 and sum(states.values()) == 1.0
        # device is the kernel name (node_exporter's node_disk_* label), path the node
        names = {lab["device"] for lab, _ in m["cachemgr_cache_mode"]
                 if lab["path"] == d["device"]}
        assert len(names) == 1 and "/" not in next(iter(names))
        dirty = [v for lab, v in m.get("cachemgr_dirty_bytes", []) if lab["path"] == d["device"]]
        if d["dirty_bytes"] is None:
            assert dirty == []  # unknown is not exported as 0
        else:
            assert dirty == [float(d["dirty_bytes"])]
    loaded = m["cachemgr_bcache_loaded"][0][1]
    assert loaded == (1.0 if status["bcache_loaded"] else 0.0)
    # every LVM-owned cache status describes, by its VG/LV, and nothing else
    want = {(d["device"], d["lvm"]["name"], d["lvm"]["pool_name_when_split"],
             "lvm-writecache" if d["lvm"]["segtype"] == "writecache" else "lvmcache")
            for d in status["devices"] if isinstance(d.get("lvm"), dict)}
    got = {(lab["path"], lab["lv"], lab["cache"], lab["kind"])
           for lab, _ in m.get("cachemgr_lvm_cache_info", [])}
    assert got == want


def test_counter_names_follow_conventions() -> None:
    m = scrape(next(FIXTURES.glob("bcache-writeback-dirty-*/sys")))
    for name in m:
        assert name.startswith("cachemgr_")
    assert "cachemgr_bcache_hits_total" in m and "cachemgr_bcache_hits" not in m


def test_missing_stats_file_is_not_exported(tmp_path: Path) -> None:
    import shutil

    src = next(FIXTURES.glob("bcache-writeback-dirty-*"))
    shutil.copytree(src, tmp_path / "t", symlinks=True)
    next((tmp_path / "t/sys").glob("devices/**/bcache/stats_total/cache_hits")).unlink()
    m = scrape(tmp_path / "t/sys")
    assert "cachemgr_bcache_hits_total" not in m
    assert "cachemgr_bcache_misses_total" in m


# ------------------------------------------------------------------- no disk probe per scrape


def _no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every way of reading a disk's superblock fail the test."""
    from cachemgr.backends import bcache_super, identity

    def boom(*a: object, **k: object) -> None:
        raise AssertionError(f"a scrape probed a block device: {a}")

    for mod, name in ((bcache_super, "scan_unregistered"), (bcache_super, "unreadable"),
                      (bcache_super, "super_show"), (identity, "probe_superblock")):
        monkeypatch.setattr(mod, name, boom)
    blkid = types.ModuleType("blkid")
    blkid.Probe = boom  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "blkid", blkid)


@pytest.mark.parametrize("fx", sorted(FIXTURES.glob("*/sys")), ids=lambda p: p.parent.name)
def test_scrape_and_textfile_never_probe_a_disk(fx: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics and the textfile read sysfs (and dmsetup) only: libblkid on every
    unclaimed disk (the VMs' disks) per scrape is what issue #15 forbids."""
    from cachemgr.cli.main import main

    _no_probe(monkeypatch)
    assert scrape(fx)["cachemgr_bcache_loaded"]
    out = tmp_path / "cachemgr.prom"
    assert main(["--sysfs-root", str(fx), "metrics", "--textfile", str(out)]) == 0
    assert "cachemgr_bcache_loaded" in out.read_text()


# ------------------------------------------------------------------------------ the listener
# Every test here sends traffic to 127.0.0.1 or ::1 only; other addresses are only parsed,
# or bound to fail (192.0.2.1 is TEST-NET-1, on no host).

ROOT = Path(__file__).resolve().parents[2]
FX = next(FIXTURES.glob("bcache-writeback-dirty-*/sys"))


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


IPV6 = _has_ipv6_loopback()


def free_port() -> int:
    """A port free on 127.0.0.1 and (where there is IPv6) ::1."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not IPV6:
            return port
        try:
            with socket.socket(socket.AF_INET6) as s6:
                s6.bind(("::1", port))
            return port
        except OSError:
            continue
    raise AssertionError("no free port on loopback")


def listening(port: int) -> set[str]:
    """The local addresses of TCP sockets listening on ``port`` (from /proc/net/tcp{,6})."""
    out = set()
    for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            addr_hex, port_hex = f[1].split(":")
            if f[3] != "0A" or int(port_hex, 16) != port:  # 0A: TCP_LISTEN
                continue
            # the kernel prints each 32-bit word in host byte order
            raw = b"".join(bytes.fromhex(addr_hex[i:i + 8])[::-1] if sys.byteorder == "little"
                           else bytes.fromhex(addr_hex[i:i + 8])
                           for i in range(0, len(addr_hex), 8))
            out.add(socket.inet_ntop(family, raw))
    return out


def cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CACHEMGR_SYSFS": str(FX), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "cachemgr", "metrics", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


class Listener:
    """``cachemgr metrics --listen VALUE`` in the background, until it listens on ``port``."""

    def __init__(self, value: str, port: int) -> None:
        env = {**os.environ, "CACHEMGR_SYSFS": str(FX), "PYTHONPATH": str(ROOT)}
        self.p = subprocess.Popen([sys.executable, "-m", "cachemgr", "metrics", "--listen",
                                   value], env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while not listening(port):
            assert self.p.poll() is None, self.p.communicate()[1]
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            time.sleep(0.05)
        time.sleep(0.2)  # every address of a loopback pair

    def close(self) -> None:
        self.p.terminate()
        self.p.communicate(timeout=10)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def test_listen_port_alone_is_loopback_only() -> None:
    """``--listen :PORT`` (the shipped unit's) binds 127.0.0.1 and ::1, not 0.0.0.0."""
    port = free_port()
    srv = Listener(f":{port}", port)
    try:
        assert listening(port) == ({"127.0.0.1", "::1"} if IPV6 else {"127.0.0.1"})
        assert "cachemgr_bcache_loaded" in get(f"http://127.0.0.1:{port}/metrics")
        if IPV6:
            assert "cachemgr_bcache_loaded" in get(f"http://[::1]:{port}/metrics")
    finally:
        srv.close()
    port = free_port()
    srv = Listener(str(port), port)  # PORT alone: the same
    try:
        assert listening(port) == ({"127.0.0.1", "::1"} if IPV6 else {"127.0.0.1"})
    finally:
        srv.close()


@pytest.mark.skipif(not IPV6, reason="no IPv6 loopback on this host")
def test_listen_bracketed_ipv6() -> None:
    port = free_port()
    srv = Listener(f"[::1]:{port}", port)
    try:
        assert listening(port) == {"::1"}
        assert "cachemgr_bcache_loaded" in get(f"http://[::1]:{port}/metrics")
    finally:
        srv.close()


@pytest.mark.parametrize("value", ["127.0.0.1:{port}", ":{port}"])
def test_listen_port_in_use_is_one_line_exit_1(value: str) -> None:
    port = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        r = cli("--listen", value.format(port=port))
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == f"cachemgr: cannot listen on 127.0.0.1:{port}: the port is in use", lines
    assert len(lines) <= 2 and "Traceback" not in r.stderr


def test_listen_address_not_on_this_host_is_exit_2() -> None:
    r = cli("--listen", "192.0.2.1:9563")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[0] == ("cachemgr: cannot listen on 192.0.2.1:9563: that "
                                        "address is not on this host")
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("value", ["::1:9563", "abc", ":0", ":65536", "9563x", "[::1]",
                                   "[::1]9563", "[127.0.0.1]:9563", "[::1:9563", "127.0.0.1:",
                                   ""])
def test_listen_malformed_is_exit_2(value: str) -> None:
    r = cli("--listen", value, timeout=20)
    assert r.returncode == 2, (value, r.stderr)
    assert r.stderr.startswith(f"cachemgr: bad --listen {value!r}"), r.stderr
    assert "Traceback" not in r.stderr


def test_parse_listen_wide_binds_are_explicit() -> None:
    assert parse_listen(":9563").addrs == parse_listen("9563").addrs == LOOPBACK
    assert parse_listen("0.0.0.0:9563").addrs == ("0.0.0.0",)
    assert parse_listen("[::]:9563").addrs == ("::",)
    assert parse_listen("[::1]:9563").addrs == ("::1",)
    assert parse_listen("10.1.2.3:80").port == 80


def test_shipped_unit_listens_on_loopback() -> None:
    unit = (ROOT / "systemd" / "cachemgr-metrics.service").read_text()
    argv = next(x for x in unit.splitlines() if x.startswith("ExecStart=")).split()
    listen = parse_listen(argv[argv.index("--listen") + 1])
    assert listen.addrs == LOOPBACK
