"""The ``cachemgr`` command line: stdout is data, stderr is diagnostics.

Exit codes are :class:`cachemgr.exitcodes.ExitCode`; one handler at the bottom maps the
library's errors to them. Every read command has ``--json`` (schema 1, docs/json.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cachemgr import snapshot as snapshot_mod
from cachemgr.errors import CacheMgrError, UsageError
from cachemgr.exitcodes import ExitCode
from cachemgr.ops import cache as cache_ops
from cachemgr.ops.control import Control, Result, progress_line
from cachemgr.render import status_table
from cachemgr.sysfs import DEFAULT_ROOT, Sysfs

log = logging.getLogger("cachemgr")


def _sysfs(args: argparse.Namespace) -> Sysfs:
    return Sysfs(args.sysfs_root)


# ----------------------------------------------------------------------------- status


def cmd_status(args: argparse.Namespace) -> int:
    while True:
        snap = cache_ops.status(_sysfs(args), probe_unregistered=not args.watch)
        if args.json:
            print(json.dumps(snapshot_mod.to_json(snap), indent=None if args.watch else 2),
                  flush=True)
        else:
            if args.watch:
                print(time.strftime("%H:%M:%S"))
            print(status_table(snap), flush=True)
        if not args.watch:
            return ExitCode.OK
        time.sleep(args.watch)


# ----------------------------------------------------------------------------- rendering


def emit(args: argparse.Namespace, res: Result) -> int:
    """Print a command's result (stdout: data; stderr: remarks) and return its exit code."""
    for line in res.notes:
        print(line, file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps(res.json()))
    else:
        for line in res.text():
            print(line)
    return int(res.exit_code)


class ProgressReporter:
    """Progress on stderr: rewritten in place on a terminal, a line every 5 s if not."""

    def __init__(self, quiet: bool = False) -> None:
        self.tty = sys.stderr.isatty()
        self.quiet = quiet
        self.last = 0.0

    def __call__(self, p: object) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not self.tty and now - self.last < 5:
            return
        self.last = now
        line = progress_line(p)
        if self.tty:
            print("\r" + line.ljust(78), end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty and not self.quiet:
            print(file=sys.stderr)


def with_progress(args: argparse.Namespace, what: str,
                  fn: Callable[[Control], Result]) -> int:
    """Run a long command with progress on stderr (none with --json) and print its result."""
    rep = ProgressReporter(quiet=getattr(args, "json", False))
    try:
        res = fn(Control(progress=rep, what=what))
    finally:
        rep.done()
    return emit(args, res)


# ----------------------------------------------------------------------------- changes


def cmd_mode(args: argparse.Namespace) -> int:
    return with_progress(args, f"mode {args.mode} on {args.target}", lambda ctl: cache_ops.mode(
        _sysfs(args), args.target, args.mode, drain=args.drain, ctl=ctl,
        timeout=args.timeout, stall_timeout=args.stall_timeout))


def cmd_drain(args: argparse.Namespace) -> int:
    return with_progress(args, f"drain of {args.target}", lambda ctl: cache_ops.drain(
        _sysfs(args), args.target, ctl=ctl, resume=args.resume, timeout=args.timeout,
        stall_timeout=args.stall_timeout))


def cmd_attach(args: argparse.Namespace) -> int:
    return emit(args, cache_ops.attach(_sysfs(args), args.backing, args.cache))


def cmd_detach(args: argparse.Namespace) -> int:
    return with_progress(args, f"detach of {args.backing}", lambda ctl: cache_ops.detach(
        _sysfs(args), args.backing, ctl=ctl, timeout=args.timeout))


def cmd_create(args: argparse.Namespace) -> int:
    if args.kind == "dm-cache":
        if args.backing or args.bucket:
            raise UsageError("--backing and --bucket are for create bcache "
                             "(dm-cache: --origin)")
        return emit(args, cache_ops.create_dmcache(
            _sysfs(args), name=args.name, origin=args.origin, cache=args.cache,
            metadata=args.metadata, mode=args.mode, block_size=args.block_size,
            force=args.force))
    if args.name or args.origin or args.metadata or args.block_size:
        raise UsageError("NAME, --origin, --metadata and --block-size are for create dm-cache")
    return emit(args, cache_ops.create_bcache(
        _sysfs(args), backings=args.backing or [], cache=args.cache, mode=args.mode,
        bucket=args.bucket, force=args.force))


def cmd_remove(args: argparse.Namespace) -> int:
    """Safe decommission (see ops.cache.remove)."""
    return with_progress(args, f"remove of {args.target}", lambda ctl: cache_ops.remove(
        _sysfs(args), args.target, keep_device=args.keep_device, ctl=ctl,
        timeout=args.timeout, stall_timeout=args.stall_timeout))


def cmd_tune(args: argparse.Namespace) -> int:
    return emit(args, cache_ops.tune(_sysfs(args), args.target, args.settings))


def cmd_force_run(args: argparse.Namespace) -> int:
    return emit(args, cache_ops.force_run(_sysfs(args), args.backing,
                                          accept_data_loss=args.i_accept_data_loss))


def cmd_stop_set(args: argparse.Namespace) -> int:
    return emit(args, cache_ops.stop_set(_sysfs(args), args.cache,
                                         accept_data_loss=args.i_accept_data_loss))


# ----------------------------------------------------------------------------- lab


def _lab_spec(args: argparse.Namespace, **kw: object):  # type: ignore[no-untyped-def]
    from cachemgr.lab.core import LabSpec, parse_disks

    return LabSpec(
        backend=args.backend,
        disks=parse_disks(args.disks) if args.disks else (),
        udev=args.udev,
        timeout=args.timeout,
        mem_mb=args.mem,
        keep=args.keep,
        rw_paths=tuple(os.path.abspath(p) for p in args.rw or []),
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


def cmd_tui(args: argparse.Namespace) -> int:
    # the one place the CLI reaches up to a face: imported lazily, so the library (and a
    # plain `cachemgr status`) never loads textual
    import importlib

    app_mod = importlib.import_module("tui.app")
    # tui.app.run: the app's own exit code (0); nothing is printed on quitting
    return int(app_mod.run(args.sysfs_root, args.interval))


def cmd_capture(args: argparse.Namespace) -> int:
    from cachemgr.capture import capture

    capture(Path(args.out), args.scenario, args.description or "", _sysfs(args))
    print(args.out)
    return ExitCode.OK


# ----------------------------------------------------------------------------- parser


# Command groups that live in their own modules (each has ``register(subparsers)``), so a
# subsystem's face sits next to it and this file does not grow without end.
EXTENSIONS: list[str] = ["cachemgr.replace_cli", "cachemgr.metrics_cli", "cachemgr.bench_cli",
                           "cachemgr.udev_cli"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cachemgr",
        description="Manage bcache and dm-cache devices on a hypervisor.",
        epilog="Exit codes: 0 done, 1 failed, 2 bad usage/input, 3 refused as unsafe, "
               "4 already so, 5 timed out.",
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log on stderr")
    p.add_argument("--sysfs-root", default=os.environ.get("CACHEMGR_SYSFS", DEFAULT_ROOT),
                   help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("status", help="show every cache, its mode, state and dirty data")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    s.add_argument("--watch", type=float, metavar="SECONDS", help="repeat every SECONDS")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("mode", help="switch the cache mode of a cached device")
    s.add_argument("target", metavar="TARGET")
    s.add_argument("mode", metavar="MODE", help="bcache: writethrough|writeback|writearound|"
                   "none; dm-cache: writeback|writethrough|passthrough")
    s.add_argument("--drain", action="store_true", help="then drain until clean")
    s.add_argument("--timeout", type=float, default=24 * 3600.0, metavar="S")
    s.add_argument("--stall-timeout", type=float, default=60.0, metavar="S")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_mode)

    s = sub.add_parser("drain", help="write all dirty data back fast, with progress")
    s.add_argument("target", metavar="TARGET")
    s.add_argument("--timeout", type=float, default=24 * 3600.0, metavar="S")
    s.add_argument("--stall-timeout", type=float, default=60.0, metavar="S",
                   help="stop if dirty data does not go down for S seconds (default 60)")
    s.add_argument("--resume", action="store_true",
                   help="restore tunables left by an interrupted drain, then drain")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_drain)

    s = sub.add_parser("attach", help="attach a backing device to a cache set")
    s.add_argument("backing", metavar="BACKING")
    s.add_argument("cache", metavar="CACHE", help="cset UUID or cache device")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_attach)

    s = sub.add_parser("detach", help="detach a backing device (flushes dirty data first)")
    s.add_argument("backing", metavar="BACKING")
    s.add_argument("--timeout", type=float, default=3600.0, metavar="S")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_detach)

    s = sub.add_parser("create", help="create a cache: create bcache --backing DEV --cache DEV "
                       "| create dm-cache NAME --origin DEV --cache DEV --metadata DEV")
    s.add_argument("kind", choices=("bcache", "dm-cache"))
    s.add_argument("name", nargs="?", metavar="NAME", help="dm-cache: the dm name to create")
    s.add_argument("--origin", metavar="DEV", help="dm-cache: the slow device (data kept)")
    s.add_argument("--metadata", metavar="DEV", help="dm-cache: the metadata device")
    s.add_argument("--block-size", metavar="SIZE",
                   help="dm-cache block size (multiple of 32k; default 64k, larger for big "
                        "caches)")
    s.add_argument("--backing", action="append", metavar="DEV")
    s.add_argument("--cache", metavar="DEV")
    s.add_argument("--mode", metavar="MODE")
    s.add_argument("--bucket", metavar="SIZE", help="bucket size, e.g. 128k for small SSDs")
    s.add_argument("--force", action="store_true",
                   help="format even over an existing signature (wipes it)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_create)

    s = sub.add_parser("remove", help="safe decommission: flush, detach, stop / unregister")
    s.add_argument("target", metavar="TARGET")
    s.add_argument("--timeout", type=float, default=3600.0, metavar="S")
    s.add_argument("--stall-timeout", type=float, default=60.0, metavar="S",
                   help="dm-cache: stop if dirty blocks do not go down for S seconds")
    s.add_argument("--keep-device", action="store_true",
                   help="dm-cache: keep the device (as a linear mapping of the origin) so "
                        "that its users keep running")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_remove)

    s = sub.add_parser("tune", help="set tunables: tune TARGET writeback_percent=0 ...")
    s.add_argument("target", metavar="TARGET")
    s.add_argument("settings", nargs="+", metavar="NAME=VALUE")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("force-run", help="start a backing device without its cache (DANGER)")
    s.add_argument("backing", metavar="BACKING")
    s.add_argument("--i-accept-data-loss", action="store_true")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_force_run)

    s = sub.add_parser("stop-set", help="stop a cache set without flushing (DANGER)")
    s.add_argument("cache", metavar="CACHE")
    s.add_argument("--i-accept-data-loss", action="store_true")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_stop_set)

    s = sub.add_parser("tui", help="the interactive dashboard and actions (Textual; also "
                       "cachemgr-tui)")
    s.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="refresh interval in seconds (default 1; +/- in the app)")
    s.set_defaults(func=cmd_tui)

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
        sp.add_argument("--disks", metavar="SIZES", help="scratch disks, e.g. 1G,256M")
        sp.add_argument("--udev", action="store_true", help="run udevd in the guest")
        sp.add_argument("--timeout", type=float, default=600.0, metavar="S")
        sp.add_argument("--mem", type=int, default=1536, metavar="MIB")
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
    for name in EXTENSIONS:
        importlib.import_module(name).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="cachemgr: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.func(args))
    except CacheMgrError as exc:
        print(f"cachemgr: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("cachemgr: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
