"""The cache commands: status, mode, drain, attach, detach, create, remove, tune, register,
assemble, force-run, stop-set, and the TUI. Each parses its arguments, calls the command
layer (cachemgr/ops/cache.py; assemble: cachemgr/ops/autoattach.py) and renders the
result."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

from cachemgr.cli import args as argtypes
from cachemgr.cli.confirm import add_yes, confirmer
from cachemgr.cli.render import emit, with_progress
from cachemgr.core.errors import UsageError
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.lazy import lazy
from cachemgr.core.sysfs import Sysfs

if TYPE_CHECKING:
    from cachemgr.ops import autoattach as autoattach_ops
    from cachemgr.ops import cache as cache_ops
    from cachemgr.ops import control, render
    from cachemgr.ops.control import Control
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    autoattach_ops = lazy("cachemgr.ops.autoattach")
    cache_ops = lazy("cachemgr.ops.cache")
    control = lazy("cachemgr.ops.control")
    render = lazy("cachemgr.ops.render")


def _sysfs(args: argparse.Namespace) -> Sysfs:
    return Sysfs(args.sysfs_root)


# ----------------------------------------------------------------------------- status


def table_width() -> int | None:
    """The columns a table may fill: $COLUMNS when set (watch(1) sets it), else the
    terminal's; None (no limit: nothing is cut) when stdout is a pipe or a file."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size(fallback=(0, 0)).columns or None


def cmd_status(args: argparse.Namespace) -> int:
    # --watch: identities and the like read again only after a uevent; the tunables and
    # bypass counters every 15 s (ScanCache's keep; --stats: every look); the state
    # directory's journals and lock files walked once a look, what did not change kept
    # (core/state.py Kept). A single look keeps nothing: it reads as every command reads
    cache = cache_ops.ScanCache() if args.watch else None
    # --watch: the bytes written back per second between two looks (WB/s), measured
    meter = cache_ops.WritebackMeter() if args.watch else None
    said = None
    while True:
        snap = cache_ops.status(_sysfs(args), probe_unregistered=not args.watch,
                                vms=not args.no_vms, uri=args.connect, stats=args.stats,
                                cache=cache)
        if snap.unseen and snap.unseen != said:  # once (--watch: again when it changes)
            print(f"cachemgr: {cache_ops.unseen_words(snap.unseen)}", file=sys.stderr,
                  flush=True)
        said = snap.unseen
        wb = (meter.update(_sysfs(args), snap.backings, time.monotonic(), cache)
              if meter is not None else None)
        if args.json:
            print(json.dumps(cache_ops.status_json(snap, _sysfs(args), written_back=wb),
                             indent=None if args.watch else 2), flush=True)
        else:
            if args.watch:
                print(time.strftime("%H:%M:%S"))
            print(render.status_table(snap, intervals=args.stats, width=table_width(),
                               written_back=wb), flush=True)
            from cachemgr.ops import coherence

            for line in coherence.mark_lines():
                print(line, flush=True)
        if not args.watch:
            return ExitCode.OK
        time.sleep(args.watch)


# ----------------------------------------------------------------------------- changes


def cmd_mode(args: argparse.Namespace) -> int:
    return with_progress(args, f"mode {args.mode} on {args.target}", lambda ctl: cache_ops.mode(
        _sysfs(args), args.target, args.mode, drain=args.drain, ctl=ctl,
        timeout=args.timeout, stall_timeout=args.stall_timeout,
        max_latency_ms=args.max_latency))


def cmd_drain(args: argparse.Namespace) -> int:
    return with_progress(args, f"drain of {args.target}", lambda ctl: cache_ops.drain(
        _sysfs(args), args.target, ctl=ctl, resume=args.resume, timeout=args.timeout,
        stall_timeout=args.stall_timeout, max_latency_ms=args.max_latency))


def cmd_attach(args: argparse.Namespace) -> int:
    return emit(args, cache_ops.attach(_sysfs(args), args.backing, args.cache,
                                       writecache=args.writecache, mode=args.mode))


def cmd_detach(args: argparse.Namespace) -> int:
    return with_progress(args, f"detach of {args.backing}", lambda ctl: cache_ops.detach(
        _sysfs(args), args.backing, ctl=ctl, timeout=args.timeout))


def cmd_invalidate(args: argparse.Namespace) -> int:
    from cachemgr.ops import coherence

    return with_progress(args, f"invalidation of {args.target}", lambda ctl: (
        coherence.invalidate(_sysfs(args), args.target, ctl=ctl)))


def cmd_scrub(args: argparse.Namespace) -> int:
    from cachemgr.ops import scrub

    if args.all == (args.target is not None):
        raise UsageError("scrub takes a TARGET or --all (every write-through or clean cache "
                         "the policy's [scrub] table names, or all of them)")
    if args.policy and not args.all:
        raise UsageError("--policy is for scrub --all")
    if args.all:
        from cachemgr.ops.udev import resolve_policy

        return with_progress(args, "scrub --all", lambda ctl: scrub.scrub_all(
            _sysfs(args), resolve_policy(args.policy), max_latency_ms=args.max_latency,
            ctl=ctl))
    return with_progress(args, f"scrub of {args.target}", lambda ctl: scrub.scrub(
        _sysfs(args), args.target, max_latency_ms=args.max_latency, ctl=ctl))


def cmd_create(args: argparse.Namespace) -> int:
    if args.kind == "dm-cache":
        if args.backing or args.bucket:
            raise UsageError("--backing and --bucket are for create bcache "
                             "(dm-cache: --origin)")
        return emit(args, cache_ops.create_dmcache(
            _sysfs(args), name=args.name, origin=args.origin, cache=args.cache,
            metadata=args.metadata, mode=args.mode, block_size=args.block_size,
            force=args.force, ctl=_asking(args)))
    if args.name or args.origin or args.metadata or args.block_size:
        raise UsageError("NAME, --origin, --metadata and --block-size are for create dm-cache")
    return emit(args, cache_ops.create_bcache(
        _sysfs(args), backings=args.backing or [], cache=args.cache, mode=args.mode,
        bucket=args.bucket, force=args.force, ctl=_asking(args)))


def cmd_remove(args: argparse.Namespace) -> int:
    """Safe decommission (see ops.cache.remove)."""
    return with_progress(args, f"remove of {args.target}", lambda ctl: cache_ops.remove(
        _sysfs(args), args.target, keep_device=args.keep_device, ctl=ctl,
        timeout=args.timeout, stall_timeout=args.stall_timeout))


def cmd_tune(args: argparse.Namespace) -> int:
    return emit(args, cache_ops.tune(_sysfs(args), args.target, args.settings))


def _asking(args: argparse.Namespace) -> Control:
    """The Control of a short command that may ask first (docs/cli.md, "Confirmations")."""
    return control.Control(what=args.cmd, confirm=confirmer(args))


def cmd_force_run(args: argparse.Namespace) -> int:
    return emit(args, cache_ops.force_run(_sysfs(args), args.backing,
                                          accept_data_loss=args.i_accept_data_loss,
                                          ctl=_asking(args)))


def cmd_register(args: argparse.Namespace) -> int:
    return emit(args, cache_ops.register(_sysfs(args), args.devices))


def cmd_assemble(args: argparse.Namespace) -> int:
    return emit(args, autoattach_ops.assemble(_sysfs(args), args.name, ctl=_asking(args)))


def cmd_stop_set(args: argparse.Namespace) -> int:
    return emit(args, cache_ops.stop_set(_sysfs(args), args.cache,
                                         accept_data_loss=args.i_accept_data_loss,
                                         ctl=_asking(args)))


def cmd_tui(args: argparse.Namespace) -> int:
    # the one place the CLI reaches up to a face: imported lazily, so the library (and a
    # plain `cachemgr status`) never loads textual
    import importlib

    app_mod = importlib.import_module("tui.app")
    # tui.app.run: the app's own exit code (0); nothing is printed on quitting
    return int(app_mod.run(args.sysfs_root, args.interval))


def register(sub: Any) -> None:
    s = sub.add_parser("status", help="show every cache, its mode, state and dirty data")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    s.add_argument("--watch", type=argtypes.seconds, metavar="SECONDS", help="repeat every SECONDS")
    s.add_argument("--connect", metavar="URI",
                   help="libvirt connection whose VMs are shown (default qemu:///system)")
    s.add_argument("--no-vms", action="store_true", help="do not ask libvirt for the VMs")
    s.add_argument("--stats", action="store_true",
                   help="also bcache's five-minute, hour and day stats (the RHIT5m column; "
                   "JSON: stats.five_minute/hour/day) and the detail tunables")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("mode", help="switch the cache mode of a cached device")
    s.add_argument("target", metavar="TARGET")
    s.add_argument("mode", metavar="MODE", help="bcache: writethrough|writeback|writearound|"
                   "none; dm-cache: writeback|writethrough|passthrough")
    s.add_argument("--drain", action="store_true", help="then drain until clean")
    s.add_argument("--timeout", type=argtypes.seconds, default=24 * 3600.0, metavar="S")
    s.add_argument("--stall-timeout", type=argtypes.seconds, default=60.0, metavar="S")
    s.add_argument("--max-latency", type=argtypes.milliseconds, metavar="MS",
                   help="with --drain: pace the drain as in 'cachemgr drain --max-latency' "
                   "(bcache, dm-cache, lvmcache)")
    add_yes(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_mode)

    s = sub.add_parser("drain", help="write all dirty data back fast, with progress")
    s.add_argument("target", metavar="TARGET")
    s.add_argument("--timeout", type=argtypes.seconds, default=24 * 3600.0, metavar="S")
    s.add_argument("--stall-timeout", type=argtypes.seconds, default=60.0, metavar="S",
                   help="stop if dirty data does not go down for S seconds (default 60)")
    s.add_argument("--resume", action="store_true",
                   help="restore tunables left by an interrupted drain, then drain")
    s.add_argument("--max-latency", type=argtypes.milliseconds, metavar="MS",
                   help="spare the VMs: keep the p99 latency of the other IO on the device "
                   "under MS milliseconds, slowing the drain down as needed, and drain as "
                   "fast as the disk allows otherwise (bcache: its writeback rate; dm-cache "
                   "and lvmcache: dm_cache's copy throttle, one paced drain at a time; "
                   "progress says the pace and why)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_drain)

    s = sub.add_parser("attach", help="attach a backing device to a cache set, or an LVM "
                                      "cache pool/cachevol to an LV")
    s.add_argument("backing", metavar="BACKING", help="bcache backing device, or VG/LV")
    s.add_argument("cache", metavar="CACHE",
                   help="cset UUID or cache device, or VG/POOL (cache pool or cachevol LV)")
    s.add_argument("--writecache", action="store_true",
                   help="LVM: attach VG/POOL as lvm writecache (a plain LV as cachevol)")
    s.add_argument("--mode", metavar="MODE",
                   help="LVM cache: writeback, writethrough (lvm2's default) or passthrough")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_attach)

    s = sub.add_parser("detach", help="detach a backing device (flushes dirty data first)")
    s.add_argument("backing", metavar="BACKING")
    s.add_argument("--timeout", type=argtypes.seconds, default=3600.0, metavar="S")
    add_yes(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_detach)

    s = sub.add_parser("invalidate", help="drop every copy a cache holds of one device "
                       "(its shared disk was written on another host); finishes an "
                       "interrupted one")
    s.add_argument("target", metavar="TARGET")
    add_yes(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_invalidate)

    s = sub.add_parser("scrub", help="compare what a write-through or clean cache serves "
                       "with its origin, block by block over the blocks it caches (bcache: "
                       "the whole device); drop every block that differs from the cache")
    s.add_argument("target", metavar="TARGET", nargs="?")
    s.add_argument("--all", action="store_true",
                   help="every write-through or clean cache the policy's [scrub] table "
                        "names (none named: every one on the host), one after the other, "
                        "paced (default: the table's max_latency_ms, 20); what "
                        "cachemgr-scrub.timer runs weekly. Exit 1: a scrub failed; 3: a "
                        "named one refused; 4: nothing to compare")
    s.add_argument("--policy", metavar="PATH", help="with --all: the policy file (default "
                   "$CACHEMGR_POLICY, else /etc/cachemgr/cachemgr.toml)")
    s.add_argument("--max-latency", type=argtypes.milliseconds, metavar="MS",
                   help="pace the reads as a paced drain is paced: the other IO on the "
                        "device keeps its p99 latency under MS (at most 60000)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_scrub)

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
                   help="format even over an existing signature (wipes it; asks first)")
    add_yes(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_create)

    s = sub.add_parser("remove", help="safe decommission: flush, detach, stop / unregister")
    s.add_argument("target", metavar="TARGET")
    s.add_argument("--timeout", type=argtypes.seconds, default=3600.0, metavar="S")
    s.add_argument("--stall-timeout", type=argtypes.seconds, default=60.0, metavar="S",
                   help="dm-cache: stop if dirty blocks do not go down for S seconds")
    s.add_argument("--keep-device", action="store_true",
                   help="dm-cache: keep the device (as a linear mapping of the origin) so "
                        "that its users keep running")
    add_yes(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_remove)

    s = sub.add_parser("tune", help="set tunables: tune TARGET writeback_percent=0 ...")
    s.add_argument("target", metavar="TARGET")
    s.add_argument("settings", nargs="+", metavar="NAME=VALUE")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("register", help="register bcache devices the kernel stopped or a boot "
                       "left unregistered (cache devices first)")
    s.add_argument("devices", nargs="+", metavar="DEV",
                   help="a cache SSD or a backing device carrying a bcache superblock")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_register)

    s = sub.add_parser("assemble", help="assemble a recorded dm-cache device the boot pass "
                       "left to you (its disks known by their place only), once you have "
                       "checked them")
    s.add_argument("name", metavar="NAME",
                   help="its dm name or /dev/mapper/NAME (cachemgr check names it)")
    add_yes(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_assemble)

    s = sub.add_parser("force-run", help="start a backing device without its cache (DANGER)")
    s.add_argument("backing", metavar="BACKING")
    s.add_argument("--i-accept-data-loss", action="store_true",
                   help="needed: what the missing cache held dirty is lost")
    add_yes(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_force_run)

    s = sub.add_parser("stop-set", help="stop a cache set without flushing (DANGER)")
    s.add_argument("cache", metavar="CACHE")
    s.add_argument("--i-accept-data-loss", action="store_true",
                   help="needed: the dirty data stays on the SSD, unwritten")
    add_yes(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_stop_set)

    s = sub.add_parser("tui", help="the interactive dashboard and actions (Textual; also "
                       "cachemgr-tui)")
    s.add_argument("--interval", type=argtypes.seconds, default=1.0, metavar="S",
                   help="refresh interval in seconds (default 1; +/- in the app)")
    s.set_defaults(func=cmd_tui)
