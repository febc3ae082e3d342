#!/usr/bin/env python3
"""Capture ``cachemgr doctor``'s scenarios for the unit tests: each one built in a lab guest
as tests/kernel/test_doctor_kernel.py builds it, under its fio load, captured twice
(``cachemgr capture``) a window apart into tests/fixtures/doctor-<scenario>-<backend>/
before/ and after/. The window is the two captures' meta.json ``uptime`` apart.

    scripts/capture-doctor-fixtures.py [SCENARIO...]     (on the host; UML)

Scenarios: bcache-control, bcache-sequential, bcache-none, bcache-congestion,
bcache-dirty-full, dmcache-control, dmcache-passthrough, dmcache-cleaner,
dmcache-writethrough-dirty.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
WINDOW = 15
DISKS = {"bcache": "1G,256M", "dmcache": "512M,64M,16M"}
ALL = ["bcache-control", "bcache-sequential", "bcache-none", "bcache-congestion",
       "bcache-dirty-full", "dmcache-control", "dmcache-passthrough", "dmcache-cleaner",
       "dmcache-writethrough-dirty"]


def on_host(names: list[str]) -> int:
    for s in names or ALL:
        print(f"== {s}", flush=True)
        disks = "512M,64M,16M,16M" if s == "dmcache-writethrough-dirty" else \
            DISKS[s.split("-")[0]]
        r = subprocess.run([sys.executable, "-m", "cachemgr", "lab", "run", "--disks",
                            disks, "--", sys.executable, __file__, s],
                           cwd=HERE, env={**os.environ, "PYTHONPATH": str(HERE)})
        if r.returncode:
            return r.returncode
    return 0


def in_guest(s: str) -> None:
    sys.path.insert(0, str(HERE))
    from cachemgr.backends import bcache
    from cachemgr.backends.capture import capture
    from cachemgr.core import runner
    from tests.kernel import test_doctor_kernel as t

    disks = os.environ["LAB_DISKS"].split()
    out = HERE / "tests" / "fixtures" / f"doctor-{s}-{os.environ.get('LAB_BACKEND', 'uml')}"
    window = WINDOW
    if s.startswith("bcache"):
        dev = "/dev/bcache0"
        opts: tuple[str, ...] = t.RANDREAD
        if s == "bcache-congestion":
            sysfs, name, cset = t.make_bcache(t.delayed(disks[0], "hdd", 30),
                                              t.delayed(disks[1], "ssd", 3))
            runner.run(["fio", "--name=fill", f"--filename={dev}", "--direct=1",
                        "--rw=randwrite", "--bs=4k", "--size=16M", "--output-format=terse"],
                       timeout=120)
            opts = ("--rw=randread", "--bs=4k", "--size=16M", f"--rate_iops={t.LOAD_IOPS}")
        else:
            sysfs, name, cset = t.make_bcache(*disks)
        if s == "bcache-sequential":
            opts = ("--rw=read", "--bs=128k", "--size=512M", "--rate_iops=100")
        elif s == "bcache-none":
            assert t.cm("mode", dev, "none", "--yes").returncode == 0
        elif s == "bcache-dirty-full":
            rel = bcache.backing_rel(sysfs, name)
            sysfs.write(f"{rel}/cache_mode", "writeback")
            sysfs.write(f"{rel}/writeback_running", "0")
            fill = t.load(dev, "--rw=randwrite", "--bs=4k", "--size=900M", seconds=120)
            bcache.wait_for(lambda: int(sysfs.read(
                f"fs/bcache/{cset}/cache_available_percent")) < 30, 110)
            fill.terminate()
            fill.wait()
            opts = ("--rw=randwrite", "--bs=4k", "--size=900M", f"--rate_iops={t.LOAD_IOPS}")
    elif s == "dmcache-writethrough-dirty":
        dev = t.unclean_writethrough(disks)
        window = t.DM_WINDOW
        opts = ("--rw=randread", "--bs=4k", "--size=32M", f"--rate_iops={t.LOAD_IOPS}")
    else:
        dev = "/dev/mapper/vc"
        window = t.DM_WINDOW
        origin, ssd, meta = disks
        assert t.cm("create", "dm-cache", "vc", "--origin", origin, "--cache", ssd,
                    "--metadata", meta, "--mode", "writethrough", "--yes").returncode == 0
        opts = ("--rw=randread", "--bs=4k", "--size=32M", f"--rate_iops={t.LOAD_IOPS}")
        if s == "dmcache-passthrough":
            assert t.cm("mode", dev, "passthrough", "--yes").returncode == 0
        elif s == "dmcache-cleaner":
            table = runner.run(["dmsetup", "table", "vc"]).stdout.split()
            i = table.index("smq")
            runner.run(["dmsetup", "suspend", "vc"])
            runner.run(["dmsetup", "reload", "vc", "--table",
                        " ".join([*table[:i], "cleaner", "0"])])
            runner.run(["dmsetup", "resume", "vc"])
            opts = (*opts, "--offset=256M")
    p = t.load(dev, *opts, seconds=window + 60)
    time.sleep(1)
    what = f"doctor scenario {s}: {dev} under fio {' '.join(opts)}"
    capture(out / "before", s, what + f" (before; after/ is {window} s later)")
    time.sleep(window)
    capture(out / "after", s, what + " (after)")
    p.terminate()
    p.wait()


if __name__ == "__main__":
    if os.environ.get("CACHEMGR_IN_LAB") == "1":
        in_guest(sys.argv[1])
    else:
        sys.exit(on_host(sys.argv[1:]))
