"""The lab demo (README's main job until the TUI opens on it): runs *inside* the lab guest.

Builds a slow "HDD" (dm-delay, a few ms per IO) over the first scratch disk, a bcache device
over it with the second scratch disk as the caching "SSD", switches it to writeback, runs a
short Zipf-distributed QD1 random-write fio job on it, and prints ``cachemgr status``.
"""

from __future__ import annotations

import json
import os
import sys
import time

from cachemgr import bcache, runner, snapshot
from cachemgr.model import CacheMode
from cachemgr.render import status_table
from cachemgr.sysfs import Sysfs

DELAY_MS = 8


def fio_iops(target: str, seconds: int) -> float:
    out = runner.run(
        ["fio", "--name=demo", f"--filename={target}", "--rw=randwrite", "--bs=4k",
         "--direct=1", "--ioengine=psync", "--iodepth=1", "--random_distribution=zipf:1.2",
         "--size=256M", "--time_based", f"--runtime={seconds}", "--output-format=json"],
        timeout=seconds + 60,
    ).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    return float(job["write"]["iops"])


def main() -> int:
    if os.environ.get("CACHEMGR_IN_LAB") != "1":
        print("demo: refusing to run outside the lab (it formats disks)", file=sys.stderr)
        return 3
    disks = os.environ.get("LAB_DISKS", "").split()
    if len(disks) < 2:
        print("demo: needs two scratch disks (cachemgr lab demo --disks 2G,512M)",
              file=sys.stderr)
        return 2
    hdd_raw, ssd = disks[0], disks[1]
    sysfs = Sysfs()
    sectors = runner.run(["blockdev", "--getsz", hdd_raw]).stdout.strip()
    runner.run(["dmsetup", "create", "slowhdd", "--table",
                f"0 {sectors} delay {hdd_raw} 0 {DELAY_MS}"])
    hdd = "/dev/mapper/slowhdd"
    print(f"demo: slow HDD {hdd} = {hdd_raw} + {DELAY_MS} ms per IO (dm-delay)")
    bare = fio_iops(hdd, 5)
    print(f"demo: bare slow HDD, QD1 4k random writes (Zipf 1.2): {bare:.0f} IOPS")
    bcache.make_bcache(backing=[hdd], cache=ssd, bucket="128k", wipe=True)
    for dev in (hdd, ssd):
        bcache.register(sysfs, dev)
    if not bcache.wait_for(lambda: sysfs.exists("block/bcache0/bcache"), 10):
        print("demo: /dev/bcache0 did not appear", file=sys.stderr)
        return 1
    snap = snapshot.take(sysfs)
    bcache.set_mode(sysfs, snap.backings[0], CacheMode.WRITEBACK)
    print("demo: bcache0 = slow HDD cached by", ssd, "in writeback mode")
    cached = fio_iops("/dev/bcache0", 5)
    print(f"demo: through bcache, same job: {cached:.0f} IOPS ({cached / bare:.0f}x)")
    time.sleep(0.5)
    print()
    print("$ cachemgr status")
    print(status_table(snapshot.take(sysfs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
