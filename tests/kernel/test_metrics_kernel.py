"""A Prometheus scrape of the lab kernel parses and matches status --json."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.kernel import scenarios


@pytest.mark.kernel(disks="1G,256M")
def test_scrape_matches_status(lab_disks: list[str]) -> None:
    scenarios.bcache_holding_dirty(lab_disks[0], lab_disks[1], bucket="128k", size="64M",
                                   io_size="8M")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    status = json.loads(subprocess.run([sys.executable, "-m", "cachemgr", "status", "--json"],
                                       capture_output=True, text=True, env=env,
                                       check=True).stdout)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "cachemgr", "metrics", "--listen",
                          f"127.0.0.1:{port}"], env=env, stderr=subprocess.PIPE)
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
    finally:
        p.terminate()
        p.wait(timeout=10)
    samples = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    d = status["devices"][0]
    key = ("cachemgr_dirty_bytes", (("device", d["device"]), ("kind", "bcache")))
    # writeback is off, so the dirty amount cannot change between the two reads
    assert samples[key] == d["dirty_bytes"] > 0
    assert samples[("cachemgr_cache_mode", (("device", d["device"]), ("kind", "bcache"),
                                            ("mode", "writeback")))] == 1.0
    assert samples[("cachemgr_cache_state", (("device", d["device"]), ("kind", "bcache"),
                                             ("state", "dirty")))] == 1.0
    # the textfile form says the same
    out = subprocess.run([sys.executable, "-m", "cachemgr", "metrics", "--textfile",
                          "/tmp/cachemgr.prom"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    with open("/tmp/cachemgr.prom") as f:
        assert f"cachemgr_dirty_bytes{{device=\"{d['device']}\",kind=\"bcache\"}}" in f.read()
