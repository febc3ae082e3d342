"""Lab set-ups that several kernel tests start from."""

from __future__ import annotations

from cachemgr.backends import bcache
from cachemgr.core import runner
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs


def bcache_holding_dirty(backing: str, cache: str, *, bucket: str, size: str,
                         io_size: str) -> Sysfs:
    """/dev/bcache0 in writeback over ``backing`` with ``cache``, writeback stopped, and
    ``io_size`` of 4k random writes over its first ``size``: dirty data that stays put."""
    sysfs = Sysfs()
    bcache.create(sysfs, backings=[backing], cache=cache, bucket=bucket,
                  mode=CacheMode.WRITEBACK)
    sysfs.write("block/bcache0/bcache/writeback_running", "0")
    runner.run(["fio", "--name=w", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=4k",
                f"--size={size}", f"--io_size={io_size}", "--direct=1",
                "--output-format=json"])
    return sysfs
