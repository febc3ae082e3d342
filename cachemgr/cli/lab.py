"""``cachemgr lab`` (the real-kernel lab: run, shell, demo, setup) and ``cachemgr capture``
(a fixture tree from this kernel). The only face that imports cachemgr.lab."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from cachemgr.cli import args as argtypes
from cachemgr.core.errors import UsageError
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.sysfs import Sysfs


def _lab_spec(args: argparse.Namespace, **kw: object):  # type: ignore[no-untyped-def]
    from cachemgr.lab.core import LabSpec, parse_disk_specs

    disks, nvme = parse_disk_specs(args.disks) if args.disks else ((), ())
    return LabSpec(
        backend=args.backend,
        disks=disks,
        nvme=nvme,
        udev=args.udev,
        libvirt=args.libvirt,
        monitor=args.monitor,
        timeout=args.timeout,
        mem_mb=args.mem,
        keep=args.keep,
        rw_paths=tuple(os.path.abspath(p) for p in args.rw or []),
        disk_images=tuple(os.path.abspath(p) for p in getattr(args, "disk_image", None) or []),
        **kw,  # type: ignore[arg-type]
    )


def cmd_lab_run(args: argparse.Namespace) -> int:
    from cachemgr.lab import core

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("lab run needs a command", hint="cachemgr lab run -- COMMAND [ARGS]")
    return core.run(command, _lab_spec(args)).returncode


def cmd_lab_shell(args: argparse.Namespace) -> int:
    from cachemgr.lab import core

    size = os.get_terminal_size() if sys.stdin.isatty() else os.terminal_size((80, 24))
    spec = _lab_spec(args, interactive=True, rows=size.lines, cols=size.columns)
    return core.run(["bash", "-l"], spec).returncode


def cmd_lab_demo(args: argparse.Namespace) -> int:
    from cachemgr.lab import core

    # on a terminal the demo ends in the TUI over its caches (a workload keeps numbers
    # moving); without one (CI, pipes) it prints `cachemgr status` and returns
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    size = os.get_terminal_size() if tty else os.terminal_size((80, 24))
    spec = _lab_spec(args, interactive=tty, rows=size.lines, cols=size.columns)
    if not args.disks:
        spec = core.LabSpec(**{**spec.__dict__, "disks": core.parse_disks("2G,512M")})
    return core.run([sys.executable, "-m", "cachemgr.lab.demo"], spec).returncode


def cmd_lab_setup(args: argparse.Namespace) -> int:
    from cachemgr.lab import kernels

    uml = kernels.fetch_uml(force=args.force)
    print(f"uml: {uml.release} ({uml.version}) {uml.kernel}")
    if not args.uml_only:
        q = kernels.fetch_qemu_kernel(force=args.force)
        print(f"qemu: {q.release} ({q.version}) {q.kernel}")
    return ExitCode.OK


def cmd_capture(args: argparse.Namespace) -> int:
    from cachemgr.backends.capture import capture

    capture(Path(args.out), args.scenario, args.description or "", Sysfs(args.sysfs_root))
    print(args.out)
    return ExitCode.OK


def register(sub: Any) -> None:
    s = sub.add_parser("capture", help="copy this kernel's bcache/dm state into a fixture dir")
    s.add_argument("scenario")
    s.add_argument("--out", required=True)
    s.add_argument("--description")
    s.set_defaults(func=cmd_capture)

    lab = sub.add_parser("lab", help="the real-kernel lab (UML or qemu)")
    lsub = lab.add_subparsers(dest="labcmd", metavar="LABCOMMAND")
    lsub.required = True

    def lab_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--backend", choices=("uml", "qemu"),
                        default=os.environ.get("CACHEMGR_LAB_BACKEND", "uml"))
        sp.add_argument("--disks", metavar="SIZES",
                        help="scratch disks, e.g. 1G,256M; nvme:512M: an NVMe controller "
                             "(qemu); nvme:160M+32M: one controller with two namespaces. "
                             "$LAB_DISKS names them in the guest: the plain disks first "
                             "(/dev/ubda... on UML, /dev/vda... on qemu), then the NVMe "
                             "namespaces (/dev/nvme0n1...)")
        sp.add_argument("--disk-image", action="append", metavar="PATH",
                        help="an existing disk image, used as it is after the --disks (never "
                             "removed): boot again on what an earlier run wrote")
        sp.add_argument("--udev", action="store_true", help="run udevd in the guest")
        sp.add_argument("--libvirt", action="store_true",
                        help="cgroup v2 with machine.slice and libvirtd (qemu:///system) in "
                             "the guest")
        sp.add_argument("--monitor", action="store_true",
                        help="qemu's machine monitor in the guest (python -m "
                             "cachemgr.lab.qmp): pull and insert drives like a hand (qemu)")
        sp.add_argument("--timeout", type=argtypes.seconds, default=600.0, metavar="S")
        sp.add_argument("--mem", type=argtypes.count, default=1536, metavar="MIB")
        sp.add_argument("--keep", action="store_true", help="keep the run directory")
        sp.add_argument("--rw", action="append", metavar="DIR",
                        help="another host directory to mount read-write")

    s = lsub.add_parser("run", help="run COMMAND as root on the lab kernel")
    lab_opts(s)
    s.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    s.set_defaults(func=cmd_lab_run)
    s = lsub.add_parser("shell", help="an interactive shell on the lab kernel")
    lab_opts(s)
    s.set_defaults(func=cmd_lab_shell)
    s = lsub.add_parser("demo", help="bcache over a slow disk in the lab, with status")
    lab_opts(s)
    s.set_defaults(func=cmd_lab_demo)
    s = lsub.add_parser("setup", help="fetch the lab kernels")
    s.add_argument("--force", action="store_true")
    s.add_argument("--uml-only", action="store_true")
    s.set_defaults(func=cmd_lab_setup)
