"""Benchmark: one scrape of ``cachemgr metrics --listen`` against node_exporter's bcache
collector, at N bcache backing devices (runs in the lab; issue #34).

    cachemgr lab run --libvirt --disks 2G,256M --timeout 1500 -- \\
        .venv/bin/python benchmarks/metrics_scrape_bench.py 16 64 [--vms 20] [--scrapes 31]

For each N (one guest, the devices of the larger N built after the smaller one is measured:
N dm-linear slices of the first scratch disk formatted as backing devices of one cache set on
the second, scan_bench's build) it starts both exporters against the same devices:

* node_exporter from Debian (``prometheus-node-exporter --collector.disable-defaults
  --collector.bcache``: its bcache collector and its own process metrics only);
* ``cachemgr metrics --listen`` (the long-lived collector: scan cache, intervals and
  libvirt's domains at their own pace), with ``--vms`` libvirt domains defined on the bcache
  devices (``lab run --libvirt``: libvirtd in the guest; domains defined, not started, as in
  tests/kernel/test_vms_kernel.py); ``--vms 0`` scrapes with ``--no-vms``.

Each exporter is scraped once to warm up (the first scrape reads every identity and asks
libvirt), then the two are scraped alternately ``--scrapes`` times, a fresh HTTP connection
each. Prints one JSON line per N: the median and mean wall milliseconds of a scrape, the CPU
milliseconds per scrape (the process's utime + stime and its waited-for children's, from
/proc/PID/stat, over all the scrapes: ticks are too coarse for one), the body's bytes and
the ratios cachemgr / node_exporter. Times are UML's: compare ratios.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

NODE_PORT, CACHEMGR_PORT = 9100, 9563
URI = "qemu:///system"


def cpu_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of ``pid`` (proc(5): fields 14-17)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    f = text[text.rindex(")") + 2:].split()
    return sum(int(x) for x in f[11:15])


def scrape(port: int) -> tuple[float, int]:
    """Wall seconds of one GET /metrics on a fresh connection, and the body's length."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    dt = time.perf_counter() - t0
    assert resp.status == 200, (port, resp.status, body[:200])
    return dt, len(body)


def wait_up(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited {proc.returncode}")
        try:
            scrape(port)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not answer on :{port}")


def define_vms(count: int, devices: list[str], rundir: Path) -> None:
    """``count`` domains (defined, not started), each with one disk on a bcache device."""
    from cachemgr.core import runner

    for i in range(count):
        dev = devices[i % len(devices)]
        xml = (f"<domain type='qemu'><name>bench{i:02d}</name><memory unit='MiB'>64</memory>"
               "<os><type arch='x86_64'>hvm</type></os><devices>"
               "<disk type='block' device='disk'><driver name='qemu' type='raw' "
               f"cache='none'/><source dev='{dev}'/><target dev='vda' bus='virtio'/></disk>"
               "</devices></domain>")
        path = rundir / f"bench{i:02d}.xml"
        path.write_text(xml)
        runner.run(["virsh", "-q", "-c", URI, "define", str(path)], timeout=120)


def grow(n: int, have: int, state: dict[str, object]) -> None:
    """Backing devices up to ``n`` (the first call builds the cache set too)."""
    from cachemgr.backends import bcache, snapshot
    from cachemgr.core import runner
    from cachemgr.core.sysfs import Sysfs

    disk, ssd = os.environ["LAB_DISKS"].split()[:2]
    total = int(runner.run(["blockdev", "--getsz", disk]).stdout)
    # slices sized for the largest N asked, so a later N adds slices after the earlier
    slice_sectors = total // int(state["max_n"])  # type: ignore[call-overload]
    names = []
    for i in range(have, n):
        name = f"vm{i:03d}"
        runner.run(["dmsetup", "create", name, "--table",
                    f"0 {slice_sectors} linear {disk} {i * slice_sectors}"])
        names.append(f"/dev/mapper/{name}")
    sysfs = Sysfs()
    if have == 0:
        bcache.make_bcache(backing=names, cache=ssd, bucket="128k")
        for d in [ssd, *names]:
            bcache.register(sysfs, d)
    else:
        bcache.make_bcache(backing=names)
        for d in names:
            bcache.register(sysfs, d)
        cset = snapshot.take(sysfs, stats=False).cache_sets[0].uuid
        for b in snapshot.take(sysfs, stats=False).backings:
            if b.cset_uuid is None and b.device_name:
                sysfs.write(f"block/{b.device_name}/bcache/attach", cset)

    def ready() -> bool:
        bs = snapshot.take(sysfs, stats=False).backings
        return len(bs) == n and all(b.cset_uuid for b in bs)

    if not bcache.wait_for(ready, 120, 0.5):
        raise SystemExit("not all devices attached")


def measure(n: int, vms: int, scrapes: int) -> dict[str, object]:
    exe = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if exe is None:
        raise SystemExit("prometheus-node-exporter is not installed (scripts/setup.sh)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    node = subprocess.Popen([exe, "--collector.disable-defaults", "--collector.bcache",
                             f"--web.listen-address=127.0.0.1:{NODE_PORT}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cm_args = ["--connect", URI] if vms else ["--no-vms"]
    cm = subprocess.Popen([sys.executable, "-m", "cachemgr", "metrics", "--listen",
                           f"127.0.0.1:{CACHEMGR_PORT}", *cm_args], cwd=REPO, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(NODE_PORT, node, "node_exporter")
        t0 = time.perf_counter()
        wait_up(CACHEMGR_PORT, cm, "cachemgr metrics")  # its first scrape: the cold one
        cold_ms = (time.perf_counter() - t0) * 1000
        seen: dict[str, object] = {}
        body = scrape_text(CACHEMGR_PORT)
        seen["bcache_devices"] = body.count("cachemgr_cache_mode{") // 4
        seen["vm_disks"] = body.count("cachemgr_vm_disk_info{")
        node_body = scrape_text(NODE_PORT)
        seen["node_exporter_bcache_devices"] = node_body.count("node_bcache_dirty_data_bytes{")
        times: dict[str, list[float]] = {"node_exporter": [], "cachemgr": []}
        sizes: dict[str, int] = {}
        ticks0 = {"node_exporter": cpu_ticks(node.pid), "cachemgr": cpu_ticks(cm.pid)}
        for _ in range(scrapes):
            for what, port in (("node_exporter", NODE_PORT), ("cachemgr", CACHEMGR_PORT)):
                dt, size = scrape(port)
                times[what].append(dt * 1000)
                sizes[what] = size
        ticks = {"node_exporter": cpu_ticks(node.pid) - ticks0["node_exporter"],
                 "cachemgr": cpu_ticks(cm.pid) - ticks0["cachemgr"]}
    finally:
        for p in (cm, node):
            p.terminate()
            p.wait(timeout=30)
    hz = os.sysconf("SC_CLK_TCK")
    res: dict[str, object] = {"devices": n, "vms": vms, "scrapes": scrapes, **seen,
                              "cachemgr_first_scrape_ms": round(cold_ms, 1)}
    for what, ts in times.items():
        res[what] = {"ms_median": round(statistics.median(ts), 1),
                     "ms_mean": round(statistics.fmean(ts), 1),
                     "ms_max": round(max(ts), 1),
                     "cpu_ms_per_scrape": round(ticks[what] * 1000 / hz / scrapes, 1),
                     "bytes": sizes[what]}
    a, b = res["cachemgr"], res["node_exporter"]
    res["ratio_median"] = round(a["ms_median"] / b["ms_median"], 2)  # type: ignore[index]
    res["ratio_mean"] = round(a["ms_mean"] / b["ms_mean"], 2)  # type: ignore[index]
    res["ratio_cpu"] = round(a["cpu_ms_per_scrape"]  # type: ignore[index]
                             / max(b["cpu_ms_per_scrape"], 1000 / hz / scrapes), 2)  # type: ignore[index]
    res["kernel"] = os.uname().release
    return res


def scrape_text(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return text


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="*", type=int, default=[16, 64])
    ap.add_argument("--vms", type=int, default=20,
                    help="libvirt domains to define (needs lab run --libvirt); 0: --no-vms")
    ap.add_argument("--scrapes", type=int, default=31)
    a = ap.parse_args()
    ns = sorted(a.n)
    state: dict[str, object] = {"max_n": ns[-1]}
    rundir = Path(os.environ.get("LAB_RUNDIR", "/tmp"))
    have = 0
    for n in ns:
        grow(n, have, state)
        if have == 0 and a.vms:
            define_vms(a.vms, [f"/dev/bcache{i}" for i in range(n)], rundir)
        have = n
        print(json.dumps(measure(n, a.vms, a.scrapes)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
