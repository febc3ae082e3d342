"""The libvirt qemu hook's run time for a VM on no cache (docs/benchmarks.md, "Live-migration
hook"): libvirt/qemu-hook with this interpreter filled in, run as libvirt's virHookCall runs it
(NAME OP SUBOP EXTRA, the domain XML on stdin, LC_ALL=C and HOME=/ only), for an incoming
migration of a domain whose one disk is an image file in a temporary directory, and for an
operation the wrapper passes without Python (``started``); beside them the interpreter's own
start (``-c pass``), the floor. Runs anywhere (no root, no libvirt): on a host, and in the lab
(``cachemgr lab run -- .venv/bin/python benchmarks/migrate_hook_bench.py``). The image must sit
on no bcache or device-mapper device (else the hook takes its full look): the run says which
path it took. One JSON line: seconds per run, sorted, per case.

    .venv/bin/python benchmarks/migrate_hook_bench.py [--reps N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachemgr.ops import migrate  # noqa: E402 - after the checkout is on the path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cachemgr-hook-bench-") as d:
        tmp = Path(d)
        img = tmp / "vm.img"
        img.write_bytes(b"\0" * (1 << 20))
        xml = ("<domain type='qemu'><name>vm-plain</name><memory unit='MiB'>64</memory>"
               "<os><type arch='x86_64'>hvm</type></os><devices><disk type='file' "
               f"device='disk'><driver name='qemu' type='raw' cache='none'/><source "
               f"file='{img}'/><target dev='vda' bus='virtio'/></disk></devices></domain>")
        py = tmp / "python"  # this interpreter with this checkout (libvirt passes no PYTHONPATH)
        py.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} \"$@\"\n")
        py.chmod(0o755)
        hook = tmp / "cachemgr"
        hook.write_text((ROOT / "libvirt" / "qemu-hook").read_text()
                        .replace("@PYTHON@", str(py)).replace("@ARGS@", ""))
        hook.chmod(0o755)
        env = {"LC_ALL": "C", "HOME": "/"}

        def timed(argv: list[str], stdin: bytes | None) -> list[float]:
            out = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                r = subprocess.run(argv, input=stdin, capture_output=True, env=env,
                                   timeout=120, check=False)
                out.append(time.perf_counter() - t0)
                assert r.returncode == 0 and r.stdout == b"", r
            return sorted(out)

        runs = {
            "migrate_no_cache": timed([str(hook), "vm-plain", "migrate", "begin", "-"],
                                      xml.encode()),
            "started": timed([str(hook), "vm-plain", "started", "begin", "-"], xml.encode()),
            "python_start": timed([str(py), "-c", "pass"], None),
        }
        print(json.dumps({
            "fast_path": not migrate.needs_a_look(xml),
            "load_average": os.getloadavg(),
            "median_s": {k: round(statistics.median(v), 4) for k, v in runs.items()},
            "runs_s": {k: [round(x, 4) for x in v] for k, v in runs.items()},
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
