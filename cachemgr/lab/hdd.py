"""The lab's queueing "HDD": one request at a time, each with a seek cost.

dm-delay (the lab's other slow disk) delays each request but serves any number at once, so a
drain's writes and a VM's reads never wait for each other on it, as they do on a spindle.
This one is scsi_debug with ``max_queue=1`` (the host takes one command at a time; the block
layer queues the rest) and ``ndelay`` (each command completes that many nanoseconds after it
started). Lab, UML 7.2, 5 ms: fio 4 KiB random reads at QD1 162 IOPS, at QD8 176 IOPS (the
mean completion latency 5.9 ms, then 39.7 ms: eight in the queue); writes 170 and 164
(docs/kernel-notes.md, "A queueing HDD in the lab").

Used by the paced drain's kernel test and benchmarks/paced_drain_bench.py (the same model).
Its data lives in the guest's RAM (``dev_size_mb``): keep it small.
"""

from __future__ import annotations

import os
import time

from cachemgr.core import runner
from cachemgr.core.sysfs import Sysfs

DRIVER = "bus/pseudo/drivers/scsi_debug"  # relative to the sysfs root


def queueing_hdd(*, seek_ms: float = 5.0, size_mb: int = 256, wait: float = 30.0) -> str:
    """Load scsi_debug as a queue-depth-1 disk of ``size_mb`` whose every request takes
    ``seek_ms``; its device node (/dev/sdX). Only one at a time: unload it to build another."""
    sysfs = Sysfs()
    if sysfs.is_dir(DRIVER):
        raise RuntimeError("scsi_debug is loaded already: rmmod it first")
    runner.run(["modprobe", "sd_mod"])
    runner.run(["modprobe", "scsi_debug", "max_queue=1", f"ndelay={int(seek_ms * 1e6)}",
                f"dev_size_mb={size_mb}"])
    deadline = time.monotonic() + wait
    while True:
        found = sorted(sysfs.path(DRIVER).glob("adapter*/host*/target*/*/block/*"))
        if found:
            node = f"/dev/{found[0].name}"
            if os.path.exists(node):
                return node
        if time.monotonic() > deadline:
            raise RuntimeError(f"scsi_debug's disk did not appear within {wait:g} s")
        time.sleep(0.1)
