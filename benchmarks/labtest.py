"""What the benchmarks that run a kept kernel test at a larger scale share: the test run in
the UML lab with the scale in its environment, and the JSON lines its measure.report wrote
read back (coherence_bench.py, warm_after_bench.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run(test_file: str, select: str, env: dict[str, str], log_var: str
        ) -> tuple[int, list[dict[str, Any]]]:
    """``pytest TEST_FILE -k SELECT`` on UML with ``env`` added and ``log_var`` naming a JSON
    lines file under the checkout (the lab guest mounts it read-write, /tmp it does not);
    (pytest's exit code, the lines written)."""
    tmp = Path(tempfile.mkdtemp(dir=ROOT, prefix=".bench-"))
    log = tmp / "report.jsonl"
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", test_file,
                            "--lab-backend=uml", "-k", select],
                           cwd=ROOT, env={**os.environ, **env, log_var: str(log)}, check=False)
        lines = log.read_text().splitlines() if log.exists() else []
        return r.returncode, [json.loads(line) for line in lines]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
