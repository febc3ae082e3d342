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
from collections.abc import Sequence
from pathlib import Path

from cachemgr import bcache, dmcache, tuning
from cachemgr import drain as drain_mod
from cachemgr import snapshot as snapshot_mod
from cachemgr.errors import AlreadyError, CacheMgrError, UnsafeError, UsageError, require_root
from cachemgr.exitcodes import ExitCode
from cachemgr.model import BcacheBacking, CacheMode, DmCacheDevice, human
from cachemgr.render import status_table
from cachemgr.sysfs import DEFAULT_ROOT, Sysfs
from cachemgr.targets import find_dmcache, resolve_backing, resolve_cache_set

log = logging.getLogger("cachemgr")


def _sysfs(args: argparse.Namespace) -> Sysfs:
    return Sysfs(args.sysfs_root)


# ----------------------------------------------------------------------------- status


def cmd_status(args: argparse.Namespace) -> int:
    while True:
        snap = snapshot_mod.take(_sysfs(args), probe_unregistered=not args.watch)
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


# ----------------------------------------------------------------------------- changes


def _emit(args: argparse.Namespace, changes: list[bcache.Change]) -> int:
    """Print what changed (stdout: data) and return the exit code for it."""
    if getattr(args, "json", False):
        print(json.dumps({"schema": 1, "changes": [
            {"target": c.target, "what": c.what, "before": c.before, "after": c.after}
            for c in changes]}))
    else:
        for c in changes:
            arrow = f"{c.before} -> {c.after}" if c.before or c.after else "done"
            print(f"{c.target}: {c.what} {arrow}")
    return ExitCode.OK


def _progress(what: str, b: BcacheBacking) -> None:
    dirty = human(b.dirty.bytes) if b.dirty else "?"
    print(f"{what} {b.device or b.identity.node}: {b.state}, dirty {dirty}",
          file=sys.stderr, flush=True)


_root = require_root


def cmd_mode(args: argparse.Namespace) -> int:
    try:
        mode = CacheMode(args.mode)
    except ValueError:
        raise UsageError(f"unknown cache mode {args.mode!r}",
                         hint="use writethrough, writeback, writearound or none") from None
    sysfs = _sysfs(args)
    snap = snapshot_mod.take(sysfs)
    dm = find_dmcache(snap, args.target, sysfs)
    if dm is not None:
        return _dm_mode(args, sysfs, dm, mode)
    b = resolve_backing(snap, args.target, sysfs)
    _root("changing a cache mode")
    try:
        changes = [bcache.set_mode(sysfs, b, mode)]
    except AlreadyError:
        if not args.drain:
            raise
        changes = []
    if args.drain:
        try:
            _drain(args, sysfs, bcache.reread(sysfs, b.identity.name))
        except AlreadyError:
            pass
    elif b.dirty and not b.dirty.is_zero(512) and mode != CacheMode.WRITEBACK:
        print(f"{b.device}: {human(b.dirty.bytes)} of dirty data is still being written "
              "back; 'cachemgr drain' (or mode --drain) makes that fast", file=sys.stderr)
    return _emit(args, changes)


def _dm_mode(args: argparse.Namespace, sysfs: Sysfs, dm: DmCacheDevice, mode: CacheMode) -> int:
    """dm-cache: suspend/reload/resume; passthrough while dirty is refused (exit 3) unless
    --drain, which flushes and then loads the new mode directly."""
    if not args.drain:
        return _emit(args, [dmcache.set_mode(sysfs, dm, mode)])
    if dm.mode == mode:
        return _dm_drain(args, sysfs, dm)
    rep = _DrainReporter()
    try:
        res = dmcache.flush(sysfs, dm, timeout=args.timeout, stall_timeout=args.stall_timeout,
                            progress=None if args.json else rep, final_mode=mode)
    finally:
        rep.done()
    return _emit(args, [bcache.Change(dm.node, "cache_mode", dm.mode.value, mode.value)]
                 if res.final_table else [])


def _dm_drain(args: argparse.Namespace, sysfs: Sysfs, dm: DmCacheDevice) -> int:
    if getattr(args, "resume", False):
        restored = dmcache.restore_saved(sysfs, dm)
        if not restored:
            raise AlreadyError(f"{dm.node}: no interrupted flush to resume")
        print(f"{dm.node}: restored table {restored['table']}", file=sys.stderr)
        dm = dmcache.find(sysfs, dm.name)
    rep = _DrainReporter()
    try:
        res = dmcache.flush(sysfs, dm, timeout=args.timeout, stall_timeout=args.stall_timeout,
                            progress=None if args.json else rep)
    except AlreadyError:
        if not getattr(args, "resume", False):
            raise
        print(f"{dm.node}: already clean", file=sys.stderr)
        return ExitCode.OK
    finally:
        rep.done()
    if args.json:
        print(json.dumps({"schema": 1, "device": res.device, "clean": True,
                          "drained_bytes": res.start_bytes, "seconds": round(res.elapsed_s, 2),
                          "restored": res.restored}))
    else:
        print(f"{res.device}: clean after {res.elapsed_s:.1f} s ({human(res.start_bytes)} "
              f"written back); mode {res.restored.get('mode', dm.mode.value)} and policy "
              f"{res.restored.get('policy', dm.table.policy)} restored")
    return ExitCode.OK


class _DrainReporter:
    """Drain progress on stderr: rewritten in place on a terminal, a line every 5 s if not."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def __call__(self, p: drain_mod.DrainProgress | dmcache.FlushProgress) -> None:
        now = time.monotonic()
        if not self.tty and now - self.last < 5:
            return
        self.last = now
        frac = p.fraction
        pct = f"{100 * frac:5.1f}%" if frac is not None else "   ?% "
        rate = f"{human(int(p.rate_bps))}/s" if p.rate_bps else "-"
        eta = f"{p.eta_s:.0f} s" if p.eta_s is not None else "-"
        line = (f"drain {p.device}: {pct} dirty {human(p.dirty_bytes)} rate {rate} "
                f"ETA {eta} ({p.elapsed_s:.0f} s)")
        if self.tty:
            print("\r" + line.ljust(78), end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty:
            print(file=sys.stderr)


def _drain(args: argparse.Namespace, sysfs: Sysfs, b: BcacheBacking) -> drain_mod.DrainResult:
    rep = _DrainReporter()
    try:
        return drain_mod.drain(sysfs, b, timeout=args.timeout, stall_timeout=args.stall_timeout,
                               progress=None if args.json else rep)
    finally:
        rep.done()


def cmd_drain(args: argparse.Namespace) -> int:
    sysfs = _sysfs(args)
    snap = snapshot_mod.take(sysfs)
    dm = find_dmcache(snap, args.target, sysfs)
    if dm is not None:
        return _dm_drain(args, sysfs, dm)
    b = resolve_backing(snap, args.target, sysfs)
    _root("draining")
    if args.resume:
        restored = drain_mod.restore_saved(sysfs, b)
        if not restored:
            raise AlreadyError(f"{b.device}: no interrupted drain to resume")
        print(f"{b.device}: restored tunables {restored}", file=sys.stderr)
        try:
            res = _drain(args, sysfs, bcache.reread(sysfs, b.identity.name))
        except AlreadyError:
            print(f"{b.device}: already clean", file=sys.stderr)
            return ExitCode.OK
    else:
        res = _drain(args, sysfs, b)
    if args.json:
        print(json.dumps({"schema": 1, "device": res.device, "clean": True,
                          "drained_bytes": res.start_bytes, "seconds": round(res.elapsed_s, 2),
                          "restored": res.restored}))
    else:
        print(f"{res.device}: clean after {res.elapsed_s:.1f} s "
              f"({human(res.start_bytes)} written back); tunables restored")
    return ExitCode.OK


def cmd_attach(args: argparse.Namespace) -> int:
    sysfs = _sysfs(args)
    snap = snapshot_mod.take(sysfs)
    b = resolve_backing(snap, args.backing, sysfs)
    c = resolve_cache_set(snap, args.cache, sysfs)
    _root("attaching")
    return _emit(args, [bcache.attach(sysfs, b, c)])


def cmd_detach(args: argparse.Namespace) -> int:
    sysfs = _sysfs(args)
    b = resolve_backing(snapshot_mod.take(sysfs), args.backing, sysfs)
    _root("detaching")
    return _emit(args, [bcache.detach(sysfs, b, timeout=args.timeout,
                                      progress=None if args.json else _progress)])


def cmd_create(args: argparse.Namespace) -> int:
    if args.kind == "dm-cache":
        return _dm_create(args)
    if args.name or args.origin or args.metadata or args.block_size:
        raise UsageError("NAME, --origin, --metadata and --block-size are for create dm-cache")
    mode = None
    if args.mode:
        try:
            mode = CacheMode(args.mode)
        except ValueError:
            raise UsageError(f"unknown cache mode {args.mode!r}") from None
    sysfs = _sysfs(args)
    changes = bcache.create(sysfs, backings=args.backing or [], cache=args.cache, mode=mode,
                            bucket=args.bucket, force=args.force)
    return _emit(args, changes)


def _dm_create(args: argparse.Namespace) -> int:
    if not (args.name and args.origin and args.cache and args.metadata):
        raise UsageError("create dm-cache needs NAME, --origin DEV, --cache DEV and "
                         "--metadata DEV")
    if args.backing or args.bucket:
        raise UsageError("--backing and --bucket are for create bcache (dm-cache: --origin)")
    try:
        mode = CacheMode(args.mode or "writeback")
    except ValueError:
        raise UsageError(f"unknown cache mode {args.mode!r}",
                         hint="writeback, writethrough or passthrough") from None
    block = dmcache.parse_size(args.block_size) if args.block_size else None
    return _emit(args, dmcache.create(_sysfs(args), args.name, origin=args.origin,
                                      cache=args.cache, metadata=args.metadata, mode=mode,
                                      block_bytes=block, force=args.force))


def cmd_remove(args: argparse.Namespace) -> int:
    """Safe decommission: a backing device is detached (flushes), then stopped; a cache set
    is unregistered once nothing is attached to it."""
    sysfs = _sysfs(args)
    snap = snapshot_mod.take(sysfs)
    dm = find_dmcache(snap, args.target, sysfs)
    if dm is not None:
        rep = _DrainReporter()
        try:
            return _emit(args, dmcache.remove(
                sysfs, dm, keep_device=args.keep_device, timeout=args.timeout,
                stall_timeout=args.stall_timeout, progress=None if args.json else rep))
        finally:
            rep.done()
    _root("removing")
    try:
        b = resolve_backing(snap, args.target, sysfs)
    except UsageError:
        c = resolve_cache_set(snap, args.target, sysfs)
        from cachemgr.bcache_super import refuse_orphaned_dirt

        refuse_orphaned_dirt(snapshot_mod.take(sysfs, probe_unregistered=True), c.uuid)
        return _emit(args, [bcache.unregister_cache_set(sysfs, c, snap.backings)])
    changes = []
    if b.cset_uuid is not None:
        changes.append(bcache.detach(sysfs, b, timeout=args.timeout,
                                     progress=None if args.json else _progress))
        b = resolve_backing(snapshot_mod.take(sysfs), b.identity.node, sysfs)
    changes.append(bcache.stop_backing(sysfs, b))
    return _emit(args, changes)


def cmd_tune(args: argparse.Namespace) -> int:
    sysfs = _sysfs(args)
    changes, already = tuning.tune(sysfs, snapshot_mod.take(sysfs), args.target, args.settings)
    for msg in already:
        print(msg, file=sys.stderr)
    _emit(args, changes)
    return ExitCode.ALREADY if not changes and already else ExitCode.OK


def cmd_force_run(args: argparse.Namespace) -> int:
    if not args.i_accept_data_loss:
        raise UnsafeError(
            "starting a backing device without its cache can corrupt its filesystem when its "
            "dirty data was in that cache",
            hint="bring the cache back instead; if it is gone for good, repeat with "
                 "--i-accept-data-loss",
        )
    sysfs = _sysfs(args)
    b = resolve_backing(snapshot_mod.take(sysfs), args.backing, sysfs)
    _root("force-run")
    return _emit(args, [bcache.force_run(sysfs, b, bcache.AcceptDataLoss.I_ACCEPT_DATA_LOSS)])


def cmd_stop_set(args: argparse.Namespace) -> int:
    if not args.i_accept_data_loss:
        raise UnsafeError(
            "stopping a cache set stops every backing device on it (the VMs' disks vanish) "
            "and leaves dirty data behind on the SSD",
            hint="use 'cachemgr remove' (flushes first); to stop anyway, repeat with "
                 "--i-accept-data-loss",
        )
    sysfs = _sysfs(args)
    c = resolve_cache_set(snapshot_mod.take(sysfs), args.cache, sysfs)
    _root("stop-set")
    return _emit(args, [bcache.stop_cache_set(sysfs, c, bcache.AcceptDataLoss.I_ACCEPT_DATA_LOSS)])


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
