"""Benchmark: the CPU of an idle ``cachemgr tui`` against htop's, at N bcache devices (issue
#34; runs in the lab).

    cachemgr lab run --disks 2G,256M -- .venv/bin/python benchmarks/tui_idle_bench.py [N]
        [--rounds R] [--seconds S] [--before REV]

Builds N bcache devices as benchmarks/scan_bench.py does (N dm-linear slices of the first
scratch disk, one cache set on the second), then, R rounds: ``cachemgr tui`` (its default 1 s
refresh), htop as it starts (its default 1.5 s delay) and htop at 1 s (``-d 10``), each in a
terminal of its own (a tmux session, 120x40), all at once; with ``--before REV`` also the TUI
of git revision REV (``git archive``). The CPU each used (utime +
stime of /proc/PID/stat, its threads included) over the same S seconds (default 30), from
15 s after every TUI showed its devices. Nothing
is typed: idle. Prints one JSON line: per program the CPU seconds of each round and their
median, the ratios of the TUI's to each htop's, and the file each TUI imported cachemgr
from. CPU times are the lab's: compare ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
READY = 300.0  # s at most for each TUI's first screen of devices (its first scan)
SETTLE = 15.0  # s after that: the polls that follow, the stats read at 15 s
TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


SOCKET = ["tuibench-0"]  # a server per round: one started as the last exits fails


def tmux(*args: str) -> str:
    r = subprocess.run(["tmux", "-L", SOCKET[0], *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tmux {' '.join(args[:3])}: {r.stderr.strip()}")
    return r.stdout


def stop_tmux() -> None:
    """The round's server and its programs gone; the next round gets a server of its own."""
    subprocess.run(["tmux", "-L", SOCKET[0], "kill-server"], capture_output=True)
    n = int(SOCKET[0].rsplit("-", 1)[1])
    SOCKET[0] = f"tuibench-{n + 1}"


def start(name: str, argv: list[str], env: dict[str, str]) -> int:
    """``argv`` in a detached tmux session of its own; the pid of the program (the pane's)."""
    envs = [f"{k}={v}" for k, v in env.items()]
    # started in /: ``python -m`` puts its working directory first on sys.path, so in the
    # checkout every TUI would import the checkout's cachemgr, PYTHONPATH or not
    tmux("new-session", "-d", "-s", name, "-c", "/", "-x", "120", "-y", "40", "env", *envs,
         *argv)
    return int(tmux("display-message", "-p", "-t", name, "#{pane_pid}").strip())


def round_(programs: dict[str, tuple[list[str], dict[str, str]]], seconds: float
           ) -> dict[str, float]:
    pids = {n: start(n, argv, env) for n, (argv, env) in programs.items()}
    try:
        deadline = time.monotonic() + READY
        while not all("bcache" in tmux("capture-pane", "-p", "-t", n)
                      for n in pids if n.startswith("tui")):
            if time.monotonic() > deadline:
                raise SystemExit(f"no TUI showed its devices within {READY:.0f} s")
            time.sleep(1)
        time.sleep(SETTLE)
        screens = {n: tmux("capture-pane", "-p", "-t", n) for n in pids}
        c0 = {n: cpu(p) for n, p in pids.items()}
        time.sleep(seconds)
        c1 = {n: cpu(p) for n, p in pids.items()}
        for n in pids:  # each still running, and showing what it should
            assert Path(f"/proc/{pids[n]}").exists(), n
        assert all("bcache" in s for n, s in screens.items() if n.startswith("tui")), screens
    finally:
        stop_tmux()
    return {n: c1[n] - c0[n] for n in pids}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--before", metavar="REV")
    a = ap.parse_args()
    for tool in ("tmux", "htop"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (scripts/setup.sh installs it)")
    sys.path.insert(0, str(HERE))
    import scan_bench

    scan_bench.build(a.n)
    term = {"TERM": "xterm-256color", "PYTHONDONTWRITEBYTECODE": "1"}
    programs = {
        "tui": ([sys.executable, "-m", "cachemgr", "tui"], {**term, "PYTHONPATH": str(REPO)}),
        "htop": (["htop"], term),
        "htop_1s": (["htop", "-d", "10"], term),
    }
    with tempfile.TemporaryDirectory() as tmp:
        if a.before:
            tar = subprocess.run(["git", "-C", str(REPO), "archive", a.before, "cachemgr",
                                  "tui"], check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
            programs["tui_before"] = ([sys.executable, "-m", "cachemgr", "tui"],
                                      {**term, "PYTHONPATH": tmp})
        # where each TUI's code comes from (the checkout's, the archived revision's): printed
        imports = {n: subprocess.run([argv[0], "-c", "import cachemgr; print(cachemgr.__file__)"],
                                     env={**os.environ, **env}, cwd="/", capture_output=True,
                                     text=True, check=True).stdout.strip()
                   for n, (argv, env) in programs.items() if n.startswith("tui")}
        got: dict[str, list[float]] = {n: [] for n in programs}
        for _ in range(a.rounds):
            for n, v in round_(programs, a.seconds).items():
                got[n].append(v)
    med = {n: statistics.median(v) for n, v in got.items()}
    res: dict[str, object] = {"devices": a.n, "rounds": a.rounds, "seconds": a.seconds,
                              "before_rev": a.before, "imports": imports}
    for n, v in got.items():
        res[n] = {"cpu_s_median": round(med[n], 2), "cpu_s": [round(x, 2) for x in v]}
    for h in ("htop", "htop_1s"):
        res[f"ratio_tui_to_{h}"] = round(med["tui"] / med[h], 2) if med[h] else None
        if a.before:
            res[f"ratio_tui_before_to_{h}"] = (round(med["tui_before"] / med[h], 2)
                                               if med[h] else None)
    res["kernel"] = os.uname().release
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
