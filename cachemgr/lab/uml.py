"""User-Mode Linux backend of the lab (the primary one: boots in about a second).

The guest's consoles map onto host file descriptors (UML's ``fd:N`` channels):
``con0`` -> the console log, ``ssl1``/``ssl2``/``ssl3`` -> /dev/ttyS1..3 in the guest, carrying
the command's stdout, stderr and the control channel. Guest RAM is a file in /dev/shm
(TMPDIR), configurable with CACHEMGR_LAB_MEMDIR. Scratch disks are ``ubdN`` (/dev/ubda...).

The guest's processes run in UML's seccomp mode (``seccomp=auto``: its ptrace mode where the
host cannot install the filter; CACHEMGR_LAB_UML_SECCOMP=off forces ptrace): a guest system
call is trapped by a seccomp filter in the process's stub instead of a ptrace stop of the
host's UML process: a guest's system calls cost a third to a half of what they did, and a
dm-cache kernel test's guest CPU fell from 16.9 to 13.1 s (docs/kernel-notes.md, "The lab
guest").
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from cachemgr.core.errors import UsageError
from cachemgr.lab import kernels
from cachemgr.lab.guest import HERE, Backend, LabResult, LabSpec, _Pump, supervise


def seccomp_arg(env: Mapping[str, str]) -> str:
    """The kernel's ``seccomp=`` argument: ``auto`` unless CACHEMGR_LAB_UML_SECCOMP says
    ``on`` or ``off`` (the module's docstring says why)."""
    mode = env.get("CACHEMGR_LAB_UML_SECCOMP", "auto")
    if mode not in ("on", "auto", "off"):
        raise UsageError(f"CACHEMGR_LAB_UML_SECCOMP={mode!r} is not on, auto or off",
                         hint="unset it (auto: seccomp where the host allows it)")
    return f"seccomp={mode}"


class UmlBackend(Backend):
    def tty_names(self) -> dict[str, str]:
        return {
            "LAB_TTY_OUT": "/dev/ttyS1",
            "LAB_TTY_ERR": "/dev/ttyS2",
            "LAB_TTY_CTL": "/dev/ttyS3",
            "LAB_TTY_TERM": "/dev/tty1",
        }

    def boot(self, info: kernels.KernelInfo, spec: LabSpec, rundir: Path, disks: list[Path],
             console: Path, out: BinaryIO, err: BinaryIO, capture: bool) -> LabResult:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        con_fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        argv = [
            info.kernel,
            f"mem={spec.mem_mb}M",
            f"umid=cachemgr-{rundir.name}",
            f"uml_dir={rundir}",
            "root=/dev/root", "rootfstype=hostfs", "rootflags=/", "ro",
            f"init={HERE / 'uml-init.sh'}",
            f"labrun={rundir}",
            "con=null", "ssl=null",
            f"con0=null,fd:{con_fd}",
            f"ssl1=null,fd:{out_w}",
            f"ssl2=null,fd:{err_w}",
            f"ssl3=null,fd:{ctl_w}",
            "quiet" if not os.environ.get("CACHEMGR_LAB_VERBOSE") else "loglevel=7",
        ]
        pass_fds = [con_fd, out_w, err_w, ctl_w]
        if spec.interactive:
            argv.append("con1=fd:0,fd:1")
        argv += [f"ubd{i}={d}" for i, d in enumerate(disks)]
        argv.append(seccomp_arg(os.environ))
        env = dict(os.environ)
        env["TMPDIR"] = os.environ.get("CACHEMGR_LAB_MEMDIR", "/dev/shm")
        proc = subprocess.Popen(
            argv,
            stdin=None if spec.interactive else subprocess.DEVNULL,
            stdout=None if spec.interactive else con_fd,
            stderr=con_fd,
            pass_fds=pass_fds,
            start_new_session=not spec.interactive,
            env=env,
            cwd=rundir,
        )
        for fd in (out_w, err_w, ctl_w, con_fd):
            os.close(fd)
        pumps = (
            _Pump(out_r, None if capture else out, capture),
            _Pump(err_r, None if capture else err, capture),
            _Pump(ctl_r, None, False),
        )
        return supervise(proc, spec, rundir, console, pumps, boot_allowance=60.0)


if __name__ == "__main__":  # pragma: no cover - manual debugging aid
    print("use: cachemgr lab run", file=sys.stderr)
