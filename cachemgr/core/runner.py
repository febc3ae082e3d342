"""The one command runner: every external program cachemgr calls goes through :func:`run`.

argv lists only (never a shell), ``LC_ALL=C`` so output is parseable, a timeout on every
call, output captured as text, and a typed error carrying argv, exit code and stderr
(blivet's util.run_program, Open-CAS' CasadmError).
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cachemgr.core.errors import CommandError, CommandNotFound, CommandTimeout

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
) -> Completed:
    """Run ``argv`` and return its output.

    Raises :class:`CommandNotFound` if the program is missing, :class:`CommandTimeout` when it
    runs past ``timeout`` (it is killed), and :class:`CommandError` on a non-zero exit when
    ``check`` is true.
    """
    args = [str(a) for a in argv]
    log.debug("run: %s", args)
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
