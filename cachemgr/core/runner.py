"""The one command runner: every external program cachemgr calls goes through :func:`run`.

argv lists only (never a shell), ``LC_ALL=C`` so output is parseable, a timeout on every
call, output captured as text, and a typed error carrying argv, exit code and stderr
(blivet's util.run_program, Open-CAS' CasadmError).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cachemgr.core import cancel
from cachemgr.core.errors import Cancelled, CommandError, CommandNotFound, CommandTimeout

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def command_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    env.pop("LANGUAGE", None)
    if extra:
        env.update(extra)
    return env


def run(
    argv: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    check: bool = True,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    cancellable: bool = False,
) -> Completed:
    """Run ``argv`` and return its output.

    Raises :class:`CommandNotFound` if the program is missing, :class:`CommandTimeout` when it
    runs past ``timeout`` (it is killed), and :class:`CommandError` on a non-zero exit when
    ``check`` is true. ``cancellable``: a program that may be stopped half-way without harm
    (fio on a benchmark's device, never a tool that changes metadata) is stopped when the
    operation is cancelled (core/cancel.py's scope).
    """
    args = [str(a) for a in argv]
    log.debug("run: %s", args)
    event = cancel.current() if cancellable else None
    if event is not None:
        return _run_cancellable(args, event, timeout=timeout, check=check, input=input,
                                env=env, cwd=cwd)
    try:
        proc = subprocess.run(
            args,
            input=input,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            env=command_env(env),
            cwd=cwd,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise CommandNotFound(args) from exc
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        raise CommandTimeout(args, timeout, err) from exc
    done = Completed(tuple(args), proc.returncode, proc.stdout, proc.stderr)
    log.debug("run: %s -> %d", args[0], proc.returncode)
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, proc.stderr)
    return done


def _run_cancellable(args: list[str], event: threading.Event, *, timeout: float, check: bool,
                     input: str | None, env: Mapping[str, str] | None,
                     cwd: str | None) -> Completed:
    try:
        proc = subprocess.Popen(
            args, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
            env=command_env(env), cwd=cwd)
    except FileNotFoundError as exc:
        raise CommandNotFound(args) from exc
    deadline = time.monotonic() + timeout
    first = True
    while True:
        try:
            out, err = proc.communicate(input=input if first else None, timeout=0.25)
            break
        except subprocess.TimeoutExpired:
            first = False
            if event.is_set() or time.monotonic() > deadline:
                proc.terminate()
                try:
                    proc.communicate(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
                if event.is_set():
                    raise Cancelled(f"{os.path.basename(args[0])} stopped: the operation "
                                    "was cancelled") from None
                raise CommandTimeout(args, timeout, "") from None
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
    done = Completed(tuple(args), proc.returncode, out, err)
    log.debug("run: %s -> %d", args[0], proc.returncode)
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, err)
    return done
