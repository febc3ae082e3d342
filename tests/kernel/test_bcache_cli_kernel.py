"""The bcache CLI end to end on the lab kernel: create, modes, detach/attach, remove, refusals.

Each step is checked through `status --json` (what automation sees) and, for refusals, that
the documented exit code comes back and nothing changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cachemgr.core import runner
from tests.kernel import clirun

SCHEMA = json.loads(Path("docs/schema/status.schema.json").read_text())

pytestmark = pytest.mark.kernel(disks="1G,256M,512M")


def cm(*args: str, user: str | None = None, process: bool = False
       ) -> subprocess.CompletedProcess[str]:
    """Run the CLI: in this process (argument parsing, dispatch, output and exit code as
    ``python -m cachemgr`` has them, without an interpreter start per call, which costs
    seconds on the qemu/TCG kernel), or as its own process when asked or as another user."""
    if not (process or user):
        return clirun.in_process(*args)
    argv = [sys.executable, "-m", "cachemgr", *args]
    if user:
        argv = ["setpriv", "--reuid", user, "--regid", user, "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


def status() -> dict[str, Any]:
    r = cm("status", "--json")
    assert r.returncode == 0, r.stderr
    data: dict[str, Any] = json.loads(r.stdout)
    assert data["schema"] == 1
    jsonschema.validate(data, SCHEMA)
    return data


def device(data: dict[str, Any], node: str) -> dict[str, Any]:
    return next(d for d in data["devices"] if node in (d["device"], d["backing"]))


def test_cli_lifecycle(lab_disks: list[str]) -> None:
    hdd, ssd, hdd2 = lab_disks
    r = cm("create", "bcache", "--backing", hdd, "--cache", ssd, "--bucket", "128k",
           "--mode", "writeback", "--json", process=True)  # the installed entry point too
    assert r.returncode == 0, r.stderr
    data = status()
    d = device(data, hdd)
    cset = data["caches"][0]["uuid"]
    assert d["device"] == "/dev/bcache0" and d["mode"] == "writeback"
    assert d["state"] == "clean" and d["cache"] == cset and d["dirty_bytes"] == 0
    assert data["caches"][0]["cache_devices"] == [ssd]

    # all four modes, each read back; the same mode twice is "already so" (exit 4)
    for mode in ("writethrough", "writearound", "none", "writeback"):
        r = cm("mode", "/dev/bcache0", mode, "--yes")  # none asks (docs/cli.md)
        assert r.returncode == 0, r.stderr
        assert device(status(), hdd)["mode"] == mode
    r = cm("mode", hdd, "writeback")
    assert r.returncode == 4 and "already" in r.stderr

    # dirty data, then detach: waits for the flush and ends clean with no cache
    runner.run(["fio", "--name=w", "--filename=/dev/bcache0", "--rw=randwrite", "--bs=4k",
                "--size=64M", "--io_size=12M", "--direct=1", "--output-format=json"],
               timeout=120)
    r = cm("tune", "/dev/bcache0", "writeback_running=0")
    assert r.returncode == 0, r.stderr
    assert device(status(), hdd)["dirty_bytes"] > 4 << 20
    # refusal: removing the cache set while a dirty device is attached (exit 3, unchanged)
    r = cm("remove", cset)
    assert r.returncode == 3 and "dirty" in r.stderr
    assert device(status(), hdd)["cache"] == cset
    r = cm("tune", "/dev/bcache0", "writeback_running=1")
    assert r.returncode == 0
    r = cm("detach", "/dev/bcache0", "--timeout", "120", "--yes")
    assert r.returncode == 0, r.stderr
    d = device(status(), hdd)
    assert d["state"] == "no cache" and d["cache"] is None and d["dirty_bytes"] == 0
    r = cm("detach", "/dev/bcache0")
    assert r.returncode == 4

    # re-attach, by the cache device's name this time; a second backing device joins the set
    r = cm("attach", "/dev/bcache0", ssd)
    assert r.returncode == 0, r.stderr
    assert device(status(), hdd)["cache"] == cset
    r = cm("attach", "/dev/bcache0", cset)
    assert r.returncode == 4
    r = cm("create", "bcache", "--backing", hdd2)
    assert r.returncode == 0, r.stderr
    b2 = device(status(), hdd2)["device"]
    r = cm("attach", b2, cset)
    assert r.returncode == 0, r.stderr
    data = status()
    assert sorted(data["caches"][0]["backing_devices"]) == sorted([hdd, hdd2])

    # remove: each backing device is detached (flushed) and stopped, then the set goes
    for node in (hdd, hdd2):
        r = cm("remove", node, "--yes")
        assert r.returncode == 0, r.stderr
    data = status()
    assert data["devices"] == []
    r = cm("remove", cset, "--yes")
    assert r.returncode == 0, r.stderr
    assert status()["caches"] == []


def test_cli_refusals_change_nothing(lab_disks: list[str]) -> None:
    hdd, ssd, other = lab_disks
    assert cm("create", "bcache", "--backing", hdd, "--cache", ssd, "--bucket", "128k"
              ).returncode == 0
    before = status()
    # not a bcache device / no such device: usage errors (2)
    r = cm("mode", other, "writeback")
    assert r.returncode == 2 and "not a bcache" in r.stderr
    r = cm("mode", "/dev/nosuchdisk", "writeback")
    assert r.returncode == 2 and "no such device" in r.stderr
    r = cm("mode", "/dev/bcache0", "turbo")
    assert r.returncode == 2
    # busy: formatting a registered device is refused as unsafe (3)
    r = cm("create", "bcache", "--backing", hdd)
    assert r.returncode == 3 and "busy" in r.stderr
    # a filesystem on the target: refused (3) unless forced; the filesystem survives
    runner.run(["mkfs.ext4", "-q", "-F", other])
    r = cm("create", "bcache", "--backing", other)
    assert r.returncode == 3 and "ext4" in r.stderr
    assert "ext4" in runner.run(["blkid", "-o", "value", "-s", "TYPE", other]).stdout
    # the dangerous ones ask for the acknowledgement by name
    r = cm("stop-set", before["caches"][0]["uuid"])
    assert r.returncode == 3 and "--i-accept-data-loss" in r.stderr
    r = cm("force-run", "/dev/bcache0")
    assert r.returncode == 3 and "--i-accept-data-loss" in r.stderr
    # not root: refused before anything is written
    r = cm("mode", "/dev/bcache0", "writeback", user="65534")
    assert r.returncode == 2 and "root" in r.stderr
    assert status()["devices"] == before["devices"]


def test_mode_switches_under_fio_load(lab_disks: list[str]) -> None:
    hdd, ssd, _ = lab_disks
    assert cm("create", "bcache", "--backing", hdd, "--cache", ssd, "--bucket", "128k",
              "--mode", "writeback").returncode == 0
    result: dict[str, Any] = {}

    def load() -> None:
        r = runner.run(["fio", "--name=vm", "--filename=/dev/bcache0", "--rw=randrw",
                        "--bs=4k", "--size=128M", "--direct=1", "--time_based",
                        "--runtime=6", "--random_distribution=zipf:1.2", "--verify=crc32c",
                        "--verify_fatal=1", "--verify_state_save=0",
                        "--output-format=json"], timeout=120, check=False)
        result["rc"], result["out"] = r.returncode, r.stdout

    t = threading.Thread(target=load)
    t.start()
    seen = []
    for mode in ("writethrough", "writearound", "none", "writeback", "writethrough"):
        r = cm("mode", "/dev/bcache0", mode, "--yes")
        assert r.returncode == 0, r.stderr
        seen.append(device(status(), hdd)["mode"])
    t.join()
    assert seen == ["writethrough", "writearound", "none", "writeback", "writethrough"]
    assert result["rc"] == 0
    job = json.loads(result["out"][result["out"].index("{"):])["jobs"][0]
    assert job["error"] == 0 and job["write"]["total_ios"] > 0


def _has_bcache_superblock(dev: str) -> bool:
    sig = runner.run(["wipefs", "--no-act", "--noheadings", "--output", "TYPE", dev],
                     check=False).stdout
    shown = runner.run(["bcache-super-show", dev], check=False)
    return "bcache" in sig or shown.returncode == 0


def test_create_on_a_too_small_cache(lab_disks: list[str]) -> None:
    """256 MiB with 512k buckets is 512 buckets: the kernel refuses to register it ("cache
    device is too small"). A bucket that gives too few is refused before anything is
    formatted, with a size that works; without --bucket one is picked (256k here)."""
    hdd, ssd, _ = lab_disks
    r = cm("create", "bcache", "--backing", hdd, "--cache", ssd, "--bucket", "512k")
    assert r.returncode == 2, r.stderr
    assert "has 512 buckets; the kernel refuses a cache device of fewer than 513" in r.stderr
    assert "nothing was formatted" in r.stderr and "use --bucket 256k or smaller" in r.stderr
    assert "Traceback" not in r.stderr
    assert not _has_bcache_superblock(ssd) and not _has_bcache_superblock(hdd)
    assert status()["caches"] == []

    r = cm("create", "bcache", "--backing", hdd, "--cache", ssd, "--json")
    assert r.returncode == 0, r.stderr
    data = status()
    assert len(data["caches"]) == 1 and device(data, hdd)["cache"] == data["caches"][0]["uuid"]
    name = os.path.basename(ssd)
    assert Path(f"/sys/block/{name}/bcache/bucket_size").read_text().strip() in ("256k",
                                                                                 "256.0k")
    assert "bucket_size" in r.stdout and "256k" in r.stdout  # the change is reported


def test_kernel_refusal_reports_the_kernels_reason(lab_disks: list[str]) -> None:
    """Formatted by hand with too few buckets, the register is refused: the message is the
    kernel's own log line, not a guess about the superblock."""
    from cachemgr.backends import bcache
    from cachemgr.core.errors import CacheMgrError
    from cachemgr.core.sysfs import Sysfs

    _, ssd, _ = lab_disks
    runner.run(["make-bcache", "--bucket", "512k", "-C", ssd])
    with pytest.raises(CacheMgrError) as exc:
        bcache.register(Sysfs(), ssd)
    name = os.path.basename(ssd)
    assert exc.value.message.startswith(f"the kernel refused to register {ssd}: ")
    assert f"error {name}: " in exc.value.message
    assert "too small" in exc.value.message
    assert "superblock" not in str(exc.value)
    assert exc.value.hint is not None and "--bucket" in exc.value.hint
