"""The wall time of the commands the product and the tests run most often in a lab guest
(docs/benchmarks.md, "Command start-up"), for two checkouts side by side in one guest: each
round runs every command once with each checkout, alternately, so both see the same load.
Run as root in the lab with two disks (the first the backing device, the second the cache):

    .venv/bin/cachemgr lab run --disks 256M,64M -- .venv/bin/python \\
        benchmarks/startup_bench.py --reps 10 OLD_CHECKOUT NEW_CHECKOUT

Sets up bcache (writethrough) over the two disks (``cachemgr create``, the last
checkout), then times: ``status --json``, ``check --json``, ``metrics`` (the textfile on
stdout), ``mode`` (writeback and writethrough in turn: one change each), ``drain`` (already
clean), the udev rule's call (``python -m cachemgr.udev_cli udev-event`` for the backing
disk, no policy file), and the libvirt hook (libvirt/qemu-hook with this interpreter, as
libvirt runs it: ``migrate begin`` of a domain whose disk is /dev/bcache0, the arrival's
full look); ``-c pass`` beside them, the interpreter's floor. A checkout's ``.pyc`` files
must be compiled on the host first (the guest sees the checkout read-only). One JSON line:
per checkout and command, the median and the sorted runs in seconds, wall and CPU (user +
system of the command and what it ran, from the guest's own accounting: less disturbed
than the wall by the host's other work). ``--resident-only``: the hook's decision repeated in
one process that imported cachemgr once (what a resident helper would leave: not built).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--resident-only", action="store_true",
                    help="only the hook's decision in one process that stays (RESIDENT)")
    ap.add_argument("checkouts", nargs="+")
    args = ap.parse_args()
    disks = os.environ["LAB_DISKS"].split()
    backing, cache = disks[0], disks[1]
    subprocess.run([sys.executable, "-m", "cachemgr", "create", "bcache", "--backing", backing,
                    "--cache", cache, "--mode", "writethrough", "--yes"], check=True,
                   timeout=300, env={**os.environ, "PYTHONPATH": args.checkouts[-1]},
                   stdout=sys.stderr)
    deadline = time.monotonic() + 60
    while not Path("/dev/bcache0").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    tmp = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    xml = ("<domain type='qemu'><name>vm-arrives</name><memory unit='MiB'>64</memory>"
           "<os><type arch='x86_64'>hvm</type></os><devices><disk type='block' "
           "device='disk'><driver name='qemu' type='raw' cache='none'/><source "
           "dev='/dev/bcache0'/><target dev='vda' bus='virtio'/></disk></devices></domain>")
    hook_src = Path(args.checkouts[0], "libvirt", "qemu-hook").read_text()
    cases: dict[str, dict[str, tuple[list[str], bytes | None, dict[str, str] | None]]] = {}
    for i, co in enumerate(args.checkouts):
        py = tmp / f"python{i}"
        py.write_text(f"#!/bin/sh\nPYTHONPATH={co} exec {sys.executable} \"$@\"\n")
        py.chmod(0o755)
        hook = tmp / f"hook{i}"
        hook.write_text(hook_src.replace("@PYTHON@", str(py)).replace("@ARGS@", ""))
        hook.chmod(0o755)
        cm = [str(py), "-m", "cachemgr"]
        cases[co] = {
            "python -c pass": ([str(py), "-c", "pass"], None, None),
            "status --json": ([*cm, "status", "--json"], None, None),
            "check --json": ([*cm, "check", "--json"], None, None),
            "metrics": ([*cm, "metrics"], None, None),
            "mode": ([*cm, "mode", "/dev/bcache0", "MODE", "--yes"], None, None),
            "drain (clean)": ([*cm, "drain", "/dev/bcache0"], None, None),
            "udev rule's call": ([str(py), "-m", "cachemgr.udev_cli", "udev-event"], None,
                                 {"ACTION": "change", "DEVNAME": backing,
                                  "SUBSYSTEM": "block", "DEVTYPE": "disk"}),
            "hook migrate (on bcache)": ([str(hook), "vm-arrives", "migrate", "begin", "-"],
                                         xml.encode(), {"LC_ALL": "C", "HOME": "/"}),
        }
    if args.resident_only:
        print(json.dumps({co: resident(co, xml, args.reps) for co in args.checkouts}))
        return 0
    runs: dict[str, dict[str, list[float]]] = {co: {k: [] for k in c} for co, c in cases.items()}
    cpu: dict[str, dict[str, list[float]]] = {co: {k: [] for k in c} for co, c in cases.items()}
    rcs: dict[str, dict[str, set[int]]] = {co: {k: set() for k in c} for co, c in cases.items()}
    modes = ["writeback", "writethrough"]
    for _ in range(args.reps):
        for name in cases[args.checkouts[0]]:
            for co in args.checkouts:
                argv, stdin, env = cases[co][name]
                argv = [modes[0] if a == "MODE" else a for a in argv]
                if name == "mode":
                    modes.reverse()
                full_env = dict(os.environ) if env is None or "LC_ALL" not in env else {}
                full_env.update(env or {})
                ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                r = subprocess.run(argv, input=stdin, capture_output=True, env=full_env,
                                   timeout=300, check=False)
                runs[co][name].append(time.perf_counter() - t0)
                ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[co][name].append(ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime)
                rcs[co][name].add(r.returncode)
                if name == "hook migrate (on bcache)" and r.returncode != 0:
                    print(r.stderr.decode(errors="replace"), file=sys.stderr)
    print(json.dumps({
        "load_average": os.getloadavg(),
        "median_s": {co: {k: round(statistics.median(v), 3) for k, v in c.items()}
                     for co, c in runs.items()},
        "median_cpu_s": {co: {k: round(statistics.median(v), 3) for k, v in c.items()}
                         for co, c in cpu.items()},
        "exit_codes": {co: {k: sorted(v) for k, v in c.items()} for co, c in rcs.items()},
        "runs_s": {co: {k: [round(x, 3) for x in sorted(v)] for k, v in c.items()}
                   for co, c in runs.items()},
        "cpu_runs_s": {co: {k: [round(x, 3) for x in sorted(v)] for k, v in c.items()}
                       for co, c in cpu.items()},
    }))
    return 0


RESIDENT = """
import json, os, sys, time
from cachemgr.cli import hook
xml = sys.stdin.read()
argv = ["vm-arrives", "migrate", "begin", "-"]
rc0 = hook.run(argv, xml)  # the imports, once
wall, cpu, rcs = [], [], set()
for _ in range(int(sys.argv[1])):
    t0, c0 = time.perf_counter(), time.process_time()
    rcs.add(hook.run(argv, xml))
    wall.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
print(json.dumps({"first_rc": rc0, "rcs": sorted(rcs), "wall_s": sorted(wall),
                  "cpu_s": sorted(cpu)}))
"""


def resident(checkout: str, xml: str, reps: int) -> dict[str, object]:
    """What the hook would cost libvirt if its modules stayed loaded (a resident helper the
    shell wrapper asks, not built): its decision called again in one process that imported
    cachemgr once, per call."""
    r = subprocess.run([sys.executable, "-c", RESIDENT, str(reps)], input=xml, text=True,
                       capture_output=True, timeout=600, check=True,
                       env={"LC_ALL": "C", "HOME": "/", "PYTHONPATH": checkout,
                            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
    out: dict[str, object] = json.loads(r.stdout.splitlines()[-1])
    out["said"] = r.stderr.splitlines()[-4:]  # what the hook said (its last call's lines)
    for k in ("wall_s", "cpu_s"):
        v = out[k]
        assert isinstance(v, list)
        out["median_" + k] = round(statistics.median(v), 4)
    return out


if __name__ == "__main__":
    sys.exit(main())
