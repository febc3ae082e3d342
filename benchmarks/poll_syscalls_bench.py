"""Benchmark: the system calls and the Python time of one warm TUI poll (issue #34 item 3).

    cachemgr lab run --backend uml --disks 2G,256M -- \\
        .venv/bin/python benchmarks/poll_syscalls_bench.py [N] [--before REV] [--polls P]
        [--state-dir DIR] [--no-build]
    .venv/bin/python benchmarks/poll_syscalls_bench.py --sysfs-root TREE [--before REV]

In the lab: N bcache devices (default 64) built as benchmarks/scan_bench.py builds them; on
the host: a captured tree (tests/fixtures/bcache-64-backing-uml.tar.xz unpacked; ``sys/``
in it). The state directory (CACHEMGR_STATE_DIR) is a fresh one holding the lock file of
every lock key of every device and cache set, none held: what a host keeps once each device
was changed through the gate (the lock files stay), unless ``--state-dir`` names another.

For the code of this checkout and, with ``--before REV``, of git revision REV (``git
archive`` of cachemgr and tui), each in processes of its own: the TUI's poll body
(tui/app.py ``CacheMgrApp.poll`` between its full reads: ``status`` without the stats on
the TUI's ScanCache, the health findings, the rows, the write-back meter, the IO counts),
warmed by a full read and two polls (the state directory left alone for 2.5 s before the
last, as an idle TUI finds it), then

* under ``strace -f``: the system calls of one poll, of its ``status`` and of the scan
  alone (``snapshot.take``, as status calls it) between marker calls, by name;
* without: ``--polls`` polls timed (perf_counter), their median and minimum ms, and the
  median ms of ``status`` alone.

Prints one JSON line. Times are the machine's (UML: every system call a ptrace round trip):
compare the revisions measured together.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MARK = "/nonexistent-cachemgr-poll-bench-"  # os.stat of MARK + name: a marker in the trace
TUI_KEEP = 30.0  # the TUI's ScanCache keep (tui/app.py: 2 * STATS_EVERY)


def _mark(name: str) -> None:
    try:
        os.stat(MARK + name)
    except OSError:
        pass


def child(root: str, mode: str, polls: int) -> dict[str, object]:
    """One process, one revision (whichever cachemgr and tui are first on sys.path)."""
    import cachemgr
    from cachemgr.backends import snapshot
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.ops import cache as cache_ops
    from cachemgr.ops import health as health_ops
    from tui import history, view

    sysfs = Sysfs(root)
    cache = cache_ops.ScanCache(keep=TUI_KEEP)
    meter = cache_ops.WritebackMeter()
    full = cache_ops.status(sysfs, stats=True, cache=cache)  # the TUI's first poll

    def poll(marks: bool = False) -> None:
        if marks:
            _mark("status-begin")
        snap = cache_ops.status(sysfs, stats=False, cache=cache)
        if marks:
            _mark("status-end")
        snap = cache_ops.carry_stats(snap, full)
        findings = health_ops.findings(snap)
        rows = view.rows(snap, findings)
        meter.update(sysfs, snap.backings, time.monotonic(), cache)
        history.io_counts(sysfs, snap, rows, meter.completed)

    poll()
    time.sleep(2.5)  # nothing in the state directory changed in the last seconds: idle
    poll()
    out: dict[str, object] = {"code": cachemgr.__file__, "devices": len(full.backings),
                              "owners": len(full.owners)}
    if mode == "trace":
        _mark("poll-begin")
        poll(marks=True)
        _mark("poll-end")
        _mark("scan-begin")
        snapshot.take(sysfs, stats=False, cache=cache)
        _mark("scan-end")
        return out
    times, status_times = [], []
    for _ in range(polls):
        t0 = time.perf_counter()
        poll()
        times.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        cache_ops.status(sysfs, stats=False, cache=cache)
        status_times.append((time.perf_counter() - t0) * 1000)
    out.update({"poll_ms_median": round(statistics.median(times), 2),
                "poll_ms_min": round(min(times), 2),
                "status_ms_median": round(statistics.median(status_times), 2)})
    return out


_CALL = re.compile(r"^(?:\[pid\s+\d+\]|\d+)?\s*(\w+)\(")  # strace -f: "PID  call(..."


def count(trace: str, section: str) -> dict[str, int]:
    """The system calls between the markers of ``section``, by name (a call strace split
    in two, "<unfinished ...>" and "<... resumed>", once)."""
    calls: collections.Counter[str] = collections.Counter()
    inside = False
    for line in trace.splitlines():
        if MARK + section + "-begin" in line:
            inside = True
            continue
        if MARK + section + "-end" in line:
            break
        if not inside or "resumed>" in line or line.startswith(("+++", "---")):
            continue
        if MARK in line:  # another section's marker inside this one
            continue
        m = _CALL.match(line)
        if m:
            calls[m.group(1)] += 1
    return dict(calls.most_common())


def run(pythonpath: str, root: str, mode: str, polls: int, env: dict[str, str],
        tmp: str) -> dict[str, object]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--sysfs-root",
            root, "--polls", str(polls)]
    trace = os.path.join(tmp, "trace")
    if mode == "trace":
        argv = ["strace", "-f", "-qq", "-o", trace, *argv]
    env = {**os.environ, **env, "PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(argv, env=env, cwd="/", check=True, capture_output=True,
                         text=True).stdout
    res: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    assert str(res["code"]).startswith(pythonpath), (res["code"], pythonpath)
    if mode == "trace":
        text = Path(trace).read_text()
        for section in ("poll", "status", "scan"):
            calls = count(text, section)
            res[f"{section}_calls"] = sum(calls.values())
            res[f"{section}_by_call"] = calls
        res["state_calls"] = int(res["status_calls"]) - int(res["scan_calls"])  # type: ignore[call-overload]
    return res


def state_dir(root: str, base: str) -> str:
    """A fresh state directory with the lock file of every object's lock keys, none held."""
    d = os.path.join(base, "state")
    os.environ["CACHEMGR_STATE_DIR"] = d
    from cachemgr.backends import snapshot
    from cachemgr.core import state
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.procedures import kinds

    snap = snapshot.take(Sysfs(root), stats=False)
    keys = {key: words for obj in [*snap.backings, *snap.cache_sets, *snap.dmcaches]
            for k in [kinds.of(obj)] if k is not None for key, words in k.locks}
    for key, words in sorted(keys.items()):
        with state.locked(key, words):
            pass
    return d


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=64)
    ap.add_argument("--before", metavar="REV")
    ap.add_argument("--sysfs-root", metavar="TREE", help="a captured tree (its sys/), "
                    "instead of the lab's devices")
    ap.add_argument("--state-dir", help="this state directory, not a fresh one")
    ap.add_argument("--no-build", action="store_true", help="the lab's devices are built "
                    "already (an earlier run of this script in the same guest)")
    ap.add_argument("--polls", type=int, default=50)
    ap.add_argument("--child", choices=("trace", "time"))
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.sysfs_root, a.child, a.polls)))
        return 0
    sys.path.insert(0, str(REPO))  # this checkout's cachemgr, for the set-up too
    root = a.sysfs_root or "/sys"
    if a.sysfs_root is None and not a.no_build:
        sys.path.insert(0, str(HERE))
        import scan_bench

        scan_bench.build(a.n)
    with tempfile.TemporaryDirectory() as tmp:
        sd = a.state_dir or state_dir(root, tmp)
        env = {"CACHEMGR_STATE_DIR": sd}
        paths = {"after": str(REPO)}
        if a.before:
            rev = os.path.join(tmp, "before")
            os.mkdir(rev)
            tar = subprocess.run(["git", "-C", str(REPO), "archive", a.before, "cachemgr",
                                  "tui"], check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", rev], input=tar, check=True)
            paths = {"before": rev, **paths}
        res: dict[str, object] = {
            "root": root, "state_dir": a.state_dir or "fresh",
            "lock_files": len(os.listdir(os.path.join(sd, "locks")))
            if os.path.isdir(os.path.join(sd, "locks")) else 0,
            "before_rev": a.before, "head": subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                capture_output=True, text=True).stdout.strip(),
            "kernel": os.uname().release}
        for name, pp in paths.items():
            got = run(pp, root, "trace", a.polls, env, tmp)
            got.update(run(pp, root, "time", a.polls, env, tmp))
            res[name] = got
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
