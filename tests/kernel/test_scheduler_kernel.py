"""IO schedulers on the lab kernel (issue #18 item 5): `cachemgr scheduler` changes read back
from sysfs, bfq and kyber loaded by the write where they are modules (Debian's 6.1), a
bio-based bcache device refused naming its disks, the policy's [scheduler.NAME] applied by the
autoattach pass, and a `bench compare` across two schedulers with results for each."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cachemgr.backends import bcache
from cachemgr.backends import scheduler as sched
from cachemgr.core import runner
from cachemgr.core.sysfs import Sysfs
from tests.kernel.clirun import in_process

# the tunables each scheduler shows under queue/iosched (a few of them)
TUNABLES = {"bfq": {"slice_idle", "low_latency"}, "kyber": {"read_lat_nsec"},
            "mq-deadline": {"read_expire", "write_expire"}, "none": set()}


def _bracketed(name: str) -> str:
    text = Path(f"/sys/block/{name}/queue/scheduler").read_text()
    return next(w[1:-1] for w in text.split() if w.startswith("["))


@pytest.mark.qemu_smoke
@pytest.mark.kernel(disks="256M,64M", timeout=240)
def test_changes_read_back_and_refusals(lab_disks: list[str]) -> None:
    sysfs = Sysfs()
    a, b = lab_disks
    name = os.path.basename(a)
    before = _bracketed(name)
    r = in_process("scheduler", "--json")
    assert r.returncode == 0, r.stderr
    rows = {d["name"]: d for d in json.loads(r.stdout)["devices"]}
    assert rows[name]["scheduler"] == before and rows[name]["request_based"]
    for s in ("bfq", "kyber", "none", "mq-deadline"):
        if s == before:
            continue
        r = in_process("scheduler", a, s)
        assert r.returncode == 0, r.stderr
        assert _bracketed(name) == s  # the kernel's own file
        q = sched.read(sysfs, name)
        assert q.current == s and TUNABLES[s] <= {k for k, _ in q.tunables}, q
        assert s in q.available  # a module scheduler is listed once the write loaded it
        print(f"{a}: {s}: {Path(f'/sys/block/{name}/queue/scheduler').read_text().strip()}")
    cur = _bracketed(name)
    r = in_process("scheduler", a, cur)
    assert r.returncode == 4 and f"already {cur}" in r.stderr
    r = in_process("scheduler", a, "nosuchsched")
    assert r.returncode == 2 and "has no IO scheduler 'nosuchsched'" in r.stderr, r.stderr
    assert "hint: available on" in r.stderr and _bracketed(name) == cur
    r = in_process("scheduler", a, "deadline")  # mq-deadline's alias, read back by its name
    assert r.returncode in (0, 4) and _bracketed(name) == "mq-deadline"

    # bcache0 over b: bio-based; 6.1 would take the write and do nothing: refused first
    runner.run(["make-bcache", "-B", b])
    bcache.register(sysfs, b)
    bdev = next(x for x in bcache.scan(sysfs).backings if x.identity.node == b)
    assert bdev.device is not None
    bname = os.path.basename(bdev.device)
    raw = sysfs.read_opt(f"block/{bname}/queue/scheduler")
    r = in_process("scheduler", bdev.device, "bfq")
    assert r.returncode == 2 and "bio-based" in r.stderr
    assert f"its IO is scheduled on {os.path.basename(b)}" in r.stderr, r.stderr
    assert sysfs.read_opt(f"block/{bname}/queue/scheduler") == raw  # "none" (6.1) or None
    print(f"{bdev.device} queue/scheduler: {raw!r}")
    r = in_process("scheduler", bdev.device)
    assert r.returncode == 0 and "bio-based" in r.stdout

    # the policy's [scheduler.NAME] by the backing device's bcache UUID, the boot pass
    policy = Path(os.environ.get("TMPDIR", "/tmp")) / "sched.toml"
    policy.write_text(f'version = 1\n[scheduler.b]\ndevice = "uuid:{bdev.uuid}"\n'
                      'scheduler = "bfq"\n')
    r = in_process("autoattach", "--policy", str(policy), "--json")
    assert r.returncode == 0, r.stderr
    acts = json.loads(r.stdout)["actions"]
    assert [(x["kind"], x["result"], x["device"]) for x in acts] == [
        ("scheduler", "done", os.path.basename(b))], acts
    assert _bracketed(os.path.basename(b)) == "bfq"
    r = in_process("autoattach", "--policy", str(policy), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["actions"] == []  # already so


@pytest.mark.kernel(disks="512M", timeout=300)
def test_bench_compare_across_two_schedulers(lab_disks: list[str], tmp_path: Path) -> None:
    (a,) = lab_disks
    name = os.path.basename(a)
    before = _bracketed(name)
    r = in_process("bench", "compare", f"{a}@mq-deadline", f"{a}@bfq", "--rw", "randread",
                   "--zipf", "1.2", "--iodepth", "4", "--size", "256M", "--runtime", "2",
                   "--repeat", "2", "--json", "--out", str(tmp_path), "--no-plot")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    res = doc["results"]
    assert [x["label"] for x in res] == [f"{a}@mq-deadline", f"{a}@bfq"]
    for x in res:
        assert x["iops"] > 0 and x["lat_p50_us"] > 0 and x["lat_p99_us"] >= x["lat_p50_us"]
        assert x["lat_p99_9_us"] is not None
        print(f"{x['label']}: {x['iops']:.0f} IOPS, p50 {x['lat_p50_us']:.0f} us, "
              f"p99 {x['lat_p99_us']:.0f} us, p99.9 {x['lat_p99_9_us']:.0f} us")
    assert [x["label"] for x in doc["runs"]] == [f"{a}@mq-deadline", f"{a}@bfq"] * 2
    assert [t["scheduler"] for t in doc["targets"]] == ["mq-deadline", "bfq"]
    assert [t["scheduler_disks"] for t in doc["targets"]] == [[a], [a]]
    assert _bracketed(name) == before  # restored
    if before != "mq-deadline":
        assert any(f"/dev/{name} IO scheduler: {before}" in h for h in doc["hygiene"])
