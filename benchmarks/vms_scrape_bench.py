"""Benchmark: a metrics scrape with N libvirt domains defined against the same scrape with none
(issue #34; runs in the lab, with libvirt's daemon).

    cachemgr lab run --libvirt --disks 1G,256M -- .venv/bin/python benchmarks/vms_scrape_bench.py
        [N] [--rounds R] [--scrapes S] [--virsh-scrapes V]

Builds one bcache device over the two scratch disks (the domains' disks are on it, so each
VM disk is followed down to a cache), then, R rounds: with no domain defined, S scrapes; N
domains defined (through the binding, as an owner would with virsh define), S scrapes
through the binding (``CACHEMGR_LIBVIRT`` unset), and in the first round V scrapes through
virsh (``CACHEMGR_LIBVIRT=virsh``: the path before issue #34); the domains undefined again.
A scrape is what the listener does per request: ``generate_latest`` of a registry holding
``SnapshotCollector`` (stats, VMs). Each path is a fresh process whose first scrape (the
connection, the domains' XML) is not counted: the listener's steady state. Prints one JSON
line: per path the median and minimum milliseconds of a scrape (median over rounds of each
round's median) and the ratios to the scrape with none. Times are the lab's: compare ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
URI = "qemu:///system"


def measure(scrapes: int, want: int) -> dict[str, object]:
    from prometheus_client import CollectorRegistry, generate_latest

    from cachemgr.backends import virsh
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.procedures.metrics import SnapshotCollector

    registry = CollectorRegistry()
    registry.register(SnapshotCollector(Sysfs(), vms=True))
    text = generate_latest(registry).decode()  # the first: connection, XML
    times = []
    for _ in range(scrapes):
        t0 = time.perf_counter()
        text = generate_latest(registry).decode()
        times.append((time.perf_counter() - t0) * 1000)
    vms = {ln.split('vm="', 1)[1].split('"', 1)[0] for ln in text.splitlines()
           if ln.startswith("cachemgr_vm_disk_info")}
    assert len(vms) == want, (len(vms), want, text[:2000])
    assert "/dev/bcache0" in text
    return {"ms_median": statistics.median(times), "ms_min": min(times),
            "source": type(virsh.live_source()).__name__}


def run(scrapes: int, want: int, via: str | None) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("CACHEMGR_LIBVIRT", None)
    if via:
        env["CACHEMGR_LIBVIRT"] = via
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure",
                          str(scrapes), "--want", str(want)], env=env, check=True,
                         capture_output=True, text=True).stdout
    res: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return res


def domain_xml(i: int) -> str:
    return (f"<domain type='qemu'><name>vm{i:03d}</name><memory unit='MiB'>64</memory>"
            "<os><type arch='x86_64'>hvm</type></os><devices>"
            "<disk type='block' device='disk'><driver name='qemu' type='raw' cache='none'/>"
            f"<source dev='/dev/bcache0'/><target dev='vd{chr(97 + i % 26)}' bus='virtio'/>"
            "</disk></devices></domain>")


def build() -> None:
    from cachemgr.backends import bcache, snapshot
    from cachemgr.core.sysfs import Sysfs

    hdd, ssd = os.environ["LAB_DISKS"].split()[:2]
    bcache.make_bcache(backing=[hdd], cache=ssd, bucket="128k")
    sysfs = Sysfs()
    for d in (ssd, hdd):
        bcache.register(sysfs, d)
    if not bcache.wait_for(lambda: any(b.cset_uuid for b in snapshot.take(sysfs).backings),
                           60, 0.5):
        raise SystemExit("bcache0 did not attach")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scrapes", type=int, default=10)
    ap.add_argument("--virsh-scrapes", type=int, default=2)
    ap.add_argument("--measure", type=int)
    ap.add_argument("--want", type=int, default=0)
    a = ap.parse_args()
    if a.measure is not None:
        print(json.dumps(measure(a.measure, a.want)))
        return 0
    import libvirt

    build()
    conn = libvirt.open(URI)
    got: dict[str, list[dict[str, object]]] = {"none": [], "api": [], "virsh": []}
    for r in range(a.rounds):
        got["none"].append(run(a.scrapes, 0, None))
        doms = [conn.defineXML(domain_xml(i)) for i in range(a.n)]
        got["api"].append(run(a.scrapes, a.n, None))
        if r == 0 and a.virsh_scrapes:
            got["virsh"].append(run(a.virsh_scrapes, a.n, "virsh"))
        for d in doms:
            d.undefine()
    res: dict[str, object] = {"domains": a.n, "rounds": a.rounds, "scrapes": a.scrapes,
                              "virsh_scrapes": a.virsh_scrapes}
    for p, rs in got.items():
        if rs:
            res[p] = {"ms_median": round(statistics.median(float(x["ms_median"])  # type: ignore[arg-type]
                                                           for x in rs), 1),
                      "ms_min": round(min(float(x["ms_min"]) for x in rs), 1),  # type: ignore[arg-type]
                      "source": rs[0]["source"]}
    none = res["none"]
    for p in ("api", "virsh"):
        if p in res:
            res[f"ratio_{p}_to_none_median"] = round(
                res[p]["ms_median"] / none["ms_median"], 2)  # type: ignore[index]
            res[f"ratio_{p}_to_none_min"] = round(res[p]["ms_min"] / none["ms_min"], 2)  # type: ignore[index]
    res["kernel"] = os.uname().release
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
