"""The CLI called in the test's own process: argument parsing, dispatch, output and exit code
as ``python -m cachemgr`` has them, without an interpreter start and imports per call (about
1 s on UML, several on qemu/TCG). Runs that must be their own process (killed with SIGKILL,
run as another user) use a subprocess instead."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys

from cachemgr.cli.main import main


def in_process(*args: str) -> subprocess.CompletedProcess[str]:
    out, err = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()  # main() binds its log handler to this call's stderr
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            rc = exc.code if isinstance(exc.code, int) else 2
    logging.root.handlers.clear()
    return subprocess.CompletedProcess(list(args), rc, out.getvalue(), err.getvalue())


def process(*args: str) -> subprocess.Popen[str]:
    """``python -m cachemgr ARGS`` started as its own process (to be killed, or run alongside
    the test), stdout and stderr piped."""
    return subprocess.Popen([sys.executable, "-m", "cachemgr", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})


def run_process(*args: str, timeout: float = 300) -> tuple[int, str, str]:
    """``python -m cachemgr ARGS`` as its own process, waited for: (exit code, out, err)."""
    p = process(*args)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err
