"""The ``cachemgr`` command line: stdout is data, stderr is diagnostics.

Exit codes are :class:`cachemgr.exitcodes.ExitCode`; one handler at the bottom maps the
library's errors to them. Every read command has ``--json`` (schema 1, docs/json.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cachemgr import snapshot as snapshot_mod
from cachemgr.errors import CacheMgrError, UsageError
from cachemgr.exitcodes import ExitCode
from cachemgr.model import BcacheBacking, CacheMode, Snapshot, human
from cachemgr.sysfs import DEFAULT_ROOT, Sysfs

log = logging.getLogger("cachemgr")


def _sysfs(args: argparse.Namespace) -> Sysfs:
    return Sysfs(args.sysfs_root)


# ----------------------------------------------------------------------------- status


def status_table(snap: Snapshot) -> str:
    lines = []
    if not snap.bcache_loaded:
        lines.append("bcache: module not loaded")
    header = f"{'DEVICE':<12} {'BACKING':<12} {'MODE':<12} {'STATE':<12} {'DIRTY':>10} " \
             f"{'HIT% 5m':>7} {'HIT% tot':>8}  CACHE"
    lines.append(header)
    for b in snap.backings:
        def ratio(interval: str, b: BcacheBacking = b) -> str:
            s = b.stats.get(interval)
            r = s.computed_hit_ratio if s else None
            return "-" if r is None else f"{100 * r:.1f}"

        lines.append(
            f"{b.device or '-':<12} {b.identity.node:<12} {b.mode or '-':<12} "
            f"{b.state:<12} {human(b.dirty.bytes) if b.dirty else '-':>10} "
            f"{ratio('five_minute'):>7} {ratio('total'):>8}  {b.cset_uuid or '-'}"
        )
    if not snap.backings:
        lines.append("(no bcache backing devices)")
    for c in snap.cache_sets:
        ssd = ",".join(x.identity.node for x in c.caches) or "?"
        used = "-" if c.cache_available_percent is None else f"{100 - c.cache_available_percent}%"
        lines.append(
            f"cache set {c.uuid}: cache {ssd}, {len(c.backing_names)} backing, used {used}, "
            f"errors {sum(x.io_errors or 0 for x in c.caches)}"
        )
    for w in snap.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    while True:
        snap = snapshot_mod.take(_sysfs(args))
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


# ----------------------------------------------------------------------------- targets


def resolve_backing(snap: Snapshot, target: str) -> BcacheBacking:
    """TARGET as an admin has it: /dev/bcache0, /dev/sdb, a by-id link, a backing UUID."""
    real = os.path.realpath(target) if target.startswith("/dev/") else target
    name = os.path.basename(real)
    for b in snap.backings:
        if target in (b.uuid, b.device, b.identity.node) or name in (
            b.device_name, b.identity.name
        ):
            return b
    raise UsageError(
        f"{target} is not a bcache backing device or bcache device on this host",
        hint="cachemgr status lists them; use /dev/bcacheN, the backing device or its UUID",
    )


def cmd_mode(args: argparse.Namespace) -> int:
    from cachemgr import bcache

    try:
        mode = CacheMode(args.mode)
    except ValueError:
        raise UsageError(f"unknown cache mode {args.mode!r}",
                         hint="use writethrough, writeback, writearound or none") from None
    sysfs = _sysfs(args)
    b = resolve_backing(snapshot_mod.take(sysfs), args.target)
    change = bcache.set_mode(sysfs, b, mode)
    if args.json:
        print(json.dumps({"schema": 1, "device": change.target, "changed": True,
                          "before": change.before, "after": change.after}))
    else:
        print(f"{change.target}: cache mode {change.before} -> {change.after}")
        if b.dirty and not b.dirty.is_zero(512) and mode != CacheMode.WRITEBACK:
            print(f"{change.target}: {human(b.dirty.bytes)} of dirty data is still being "
                  "written back; 'cachemgr drain' makes that fast", file=sys.stderr)
    return ExitCode.OK


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

    spec = _lab_spec(args)
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
    app_mod.CacheMgrApp(args.sysfs_root, args.interval).run()
    return ExitCode.OK


def cmd_capture(args: argparse.Namespace) -> int:
    from cachemgr.capture import capture

    capture(Path(args.out), args.scenario, args.description or "", _sysfs(args))
    print(args.out)
    return ExitCode.OK


# ----------------------------------------------------------------------------- parser


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
    s.add_argument("mode", metavar="MODE", help="writethrough|writeback|writearound|none")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_mode)

    s = sub.add_parser("tui", help="the interactive dashboard (Textual)")
    s.add_argument("--interval", type=float, default=1.0, metavar="S")
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
