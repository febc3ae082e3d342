"""Benchmark: udev auto-attach latency from the SCSI hot-add, in both orders (in the lab).

    cachemgr lab run --udev --disks 64M --timeout 1800 -- \\
        .venv/bin/python benchmarks/attach_latency_bench.py [--reps N] [--before REV]

Three scsi_debug disks (one SSD, two backing devices, each on its own SCSI host) are
formatted, let go by bcache and pulled (SCSI ``device/delete``) before each repetition, as in
tests/kernel/test_udev_kernel.py. Then the policy and udev/90-cachemgr.rules go in and the
disks come back by a rescan of their hosts (``scan``): one half of the pair first (until the
worker has done its part and is idle), the other half last. Measured from the write to the
last half's ``scan`` file (not from udev's event) to the moment both backing devices are
attached to the SSD's cache set in the policy's mode with its tunables (polled every 20 ms).

"cache_last": the backing devices first, the SSD last; "backing_last": the other way round.
Each repetition runs both orders for each variant, interleaved: "after" is this checkout with
the worker of the first half gone (cold: the last half's handler starts a new worker, which
imports its modules), "after_warm" the same with the last half rescanned while that worker
still lingers (within LINGER_S of its pass, as the disks of a pair or a boot's disks come);
"before" is the tree of REV (default BEFORE below: the stage timestamps, with the old waits
and a worker per burst), its cachemgr/, udev/ and scripts/ from ``git archive`` put first
on the handler's PYTHONPATH by a wrapper interpreter given to install-udev.sh --python.

Per order and variant: the end-to-end seconds of each repetition and the median of each stage
(seconds from the scan write): the kernel's add uevent of the last device's block node and
udevd's end of it (``udevadm monitor``), when the handler for that event started and queued it,
and from the action journal's record of the pass that did the last action: the worker's start,
its settle wait, imports, policy, each round's view / decisions / actions, the pass's end.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cachemgr.backends import scsi
from cachemgr.backends.scsi import ScsiDisk
from cachemgr.core import runner
from cachemgr.core.sysfs import Sysfs
from tests.kernel import test_udev_kernel as lab

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "35fc8d2fe533d01d3c0e5c149fb11524ccfd4b9f"  # stage timestamps, old waits
RUN_LOCK = lab.STATE / "locks" / "autoattach-run.lock"
PENDING_LOCK = lab.STATE / "locks" / "autoattach-pending.lock"
ORDERS = ("cache_last", "backing_last")


def before_tree(rev: str) -> Path:
    """REV's cachemgr/, udev/ and scripts/ in a directory, and a wrapper interpreter that
    puts them first on the path."""
    d = Path(tempfile.mkdtemp(prefix="attach-before-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "cachemgr", "udev",
                              "scripts", "systemd"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(d)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(d / "cachemgr")], check=True,
                   stdout=subprocess.DEVNULL)
    wrapper = d / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={d} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return d


def install(tree: Path, python: str, policy: str) -> None:
    lab.POLICY.parent.mkdir(parents=True, exist_ok=True)
    lab.POLICY.write_text(policy)
    runner.run([str(tree / "scripts" / "install-udev.sh"), "--python", python,
                "--no-systemd"])


def held(lock: Path) -> bool:
    if not lock.exists():
        return False
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def idle(*, gone: bool = False, timeout: float = 60) -> None:
    """udevd's queue empty, no event queued for a worker, no worker acting; ``gone``: and
    no worker waiting for events either (a worker of this checkout lingers after a pass)."""
    t0 = time.monotonic()
    q = lab.STATE / "autoattach" / "queue"
    while True:
        lab.settle()
        busy = ((q.is_dir() and [p for p in os.listdir(q) if not p.startswith(".")])
                or held(RUN_LOCK) or (gone and held(PENDING_LOCK)))
        if not busy:
            time.sleep(0.3)
            return
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("the worker did not go idle")
        time.sleep(0.2)


class Monitor:
    """``udevadm monitor`` of block events: when the kernel sent each and udevd finished it."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkstemp(prefix="udev-monitor-")[1])
        self.proc = subprocess.Popen(["stdbuf", "-oL", "udevadm", "monitor", "--kernel", "--udev",
                                      "--subsystem-match=block"],
                                     stdout=self.path.open("w"), stderr=subprocess.DEVNULL)
        # its timestamps are CLOCK_MONOTONIC seconds
        self.offset = time.time() - time.monotonic()

    def times(self, source: str, action: str, name: str, after: float) -> list[float]:
        out = []
        for line in self.path.read_text().splitlines():
            # KERNEL[12.345678] add      /devices/.../block/sdb (block)
            head, _, rest = line.partition("]")
            parts = rest.split()
            if not head.startswith(f"{source}") or "[" not in head or len(parts) < 2:
                continue
            when = float(head.split("[", 1)[1]) + self.offset
            if parts[0] == action and parts[1].endswith(f"/{name}") and when >= after:
                out.append(when)
        return out

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def rescan(sysfs: Sysfs, disks: list[lab.Disk]) -> tuple[float, list[ScsiDisk]]:
    """Rescan each disk's host; the time of the last scan write, and the disks."""
    t0 = 0.0
    for d in disks:
        t0 = time.time()
        scsi.rescan(sysfs, d.host)
    return t0, [scsi.wait_for_disk(sysfs, d.wwn, 20) for d in disks]


def stages(t0: float, t_end: float, last: list[ScsiDisk], journal: list[dict[str, Any]],
           mon: Monitor) -> dict[str, float | None]:
    """Seconds from ``t0`` to each stage (None: not seen)."""

    def rel(values: list[float]) -> float | None:
        return round(max(values) - t0, 3) if values else None

    names = {d.name for d in last}
    def first(source: str) -> list[float]:  # each last device's first add event after t0
        return [min(ts) for n in names if (ts := mon.times(source, "add", n, t0))]

    out: dict[str, float | None] = {"kernel_add": rel(first("KERNEL")),
                                    "udev_done": rel(first("UDEV"))}
    passes = [r for r in journal if r["kind"] == "pass"]
    evs = [e for p in passes for e in p.get("event_stages", [])
           if e["dev"] in names and e["action"] == "add" and e["queued"] >= t0]
    out["handler_started"] = rel([e["started"] for e in evs if e.get("started")])
    out["queued"] = rel([e["queued"] for e in evs])
    # the pass that did the last action before the end state was seen
    done = [r for r in journal if r["kind"] not in ("pass", "note", "policy-error")
            and r.get("result") == "done" and t0 <= r["t"] <= t_end + 0.05]
    if done:
        last_act = max(done, key=lambda r: r["t"])
        p = next((p for p in passes if p["pid"] == last_act["pid"] and p["t"] >= last_act["t"]),
                 None)
        st = (p or {}).get("stages") or {}
        for key in ("worker", "imported", "ready", "drained", "policy", "done"):
            out[f"pass_{key}"] = rel([st[key]]) if st.get(key) else None
        for i, r in enumerate(st.get("rounds", [])[:2], 1):
            for key in ("view", "decided", "acted"):
                out[f"round{i}_{key}"] = rel([r[key]]) if key in r else None
        out["last_action"] = rel([last_act["t"]])
        out["passes"] = float(len([p for p in passes if p["t"] >= t0]))
    # every action of the repetition (both halves): a register that found the device
    # registered by 69-bcache.rules is "already"; none may fail
    for r in journal:
        if r["kind"] not in ("pass", "note"):
            key = f"n_{r['kind']}_{r.get('result')}"
            out[key] = (out.get(key) or 0.0) + 1
    out["end"] = round(t_end - t0, 3)
    return out


def one(sysfs: Sysfs, variant: str, tree: Path, python: str, warm: bool, order: str,
        found: list[ScsiDisk], mon: Monitor, verbose: bool = False
        ) -> dict[str, float | None]:
    lab.POLICY.unlink(missing_ok=True)  # the rule runs nothing while the disks are made cold
    idle(gone=True)  # no worker of another variant takes this one's events
    ssd, backs = lab.make_cold(sysfs, found)
    lab.ACTIONS.unlink(missing_ok=True)
    install(tree, python, lab.policy_text(ssd, backs))
    first, last = ([ssd], backs) if order == "backing_last" else (backs, [ssd])
    rescan(sysfs, first)
    idle(gone=not warm)
    t0, last_disks = rescan(sysfs, last)
    deadline = time.time() + 60
    while not all(lab.backing_ok(sysfs, b) for b in backs):
        if time.time() > deadline:
            raise TimeoutError(f"{variant} {order}: not attached\n{lab.debug_state()}")
        time.sleep(0.02)
    t_end = time.time()
    idle()
    found[:] = [d.find(sysfs) for d in (ssd, *backs)]  # type: ignore[misc]
    out = stages(t0, t_end, last_disks, lab.records(), mon)
    if verbose:
        print(json.dumps({"variant": variant, "order": order, "t0": t0, **out}), file=sys.stderr)
        for r in lab.records():
            assert isinstance(r["t"], float)
            print(json.dumps({"rel": round(r["t"] - t0, 3), **r}), file=sys.stderr)
        for line in mon.path.read_text().splitlines():
            if "[" in line and "]" in line:
                when = float(line.split("[", 1)[1].split("]", 1)[0]) + mon.offset - t0
                if when > -1:
                    print(f"{when:.3f} {line}", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--verbose", action="store_true",
                    help="each repetition's stages, journal and udev events on stderr")
    ap.add_argument("--before", default=BEFORE, help="the revision measured as 'before' "
                                                     "('none': only this checkout)")
    args = ap.parse_args()
    os.environ["CACHEMGR_STATE_DIR"] = str(lab.STATE)
    # byte-compiled, as an installed package is (pip and dpkg compile at install): without
    # the .pyc files each process compiles what it imports (seconds on UML)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "cachemgr")],
                   check=True, stdout=subprocess.DEVNULL)
    variants = [("after", ROOT, sys.executable, False), ("after_warm", ROOT, sys.executable, True)]
    if args.before != "none":
        b = before_tree(args.before)
        variants.insert(0, ("before", b, str(b / "python"), False))
    sysfs = Sysfs()
    found = list(sorted(scsi.load_scsi_debug(sysfs, dev_size_mb=64, per_host_store=1,
                                             add_host=3), key=lambda d: int(d.host[4:])))
    lab.settle()
    mon = Monitor()
    results: dict[str, dict[str, list[dict[str, float | None]]]] = {
        v: {o: [] for o in ORDERS} for v, _, _, _ in variants}
    try:
        for _ in range(args.reps):
            for order in ORDERS:
                for variant, tree, python, warm in variants:
                    results[variant][order].append(one(sysfs, variant, tree, python, warm,
                                                       order, found, mon, args.verbose))
    finally:
        mon.stop()
    summary: dict[str, Any] = {"bench": "attach_latency", "kernel": os.uname().release,
                               "reps": args.reps, "before": args.before}
    for variant, by_order in results.items():
        summary[variant] = {}
        for order, runs in by_order.items():
            counts = sorted({k for r in runs for k in r if k.startswith("n_")})
            keys = [k for k in runs[0] if not k.startswith("n_")
                    and all(r.get(k) is not None for r in runs)]
            summary[variant][order] = {
                "actions": {k[2:]: sum(r.get(k) or 0 for r in runs) for k in counts},
                "end_s": [r["end"] for r in runs],
                "median_s": statistics.median(r["end"] or 0.0 for r in runs),
                "stages_median_s": {k: round(statistics.median(r[k] or 0.0 for r in runs), 3)
                                    for k in keys}}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
