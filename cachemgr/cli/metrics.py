"""``cachemgr metrics``: node_exporter textfile output, or a /metrics listener."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from cachemgr.cli import args as argtypes
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.sysfs import Sysfs


def cmd_metrics(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from cachemgr.ops.metrics import SnapshotCollector
    from cachemgr.procedures.metrics import (
        bound,
        parse_listen,
        serve,
        text,
        textfile_loop,
        write_textfile,
    )

    listen = parse_listen(args.listen) if args.listen is not None else None
    if args.interval is not None and not args.textfile:
        from cachemgr.core.errors import UsageError

        raise UsageError("--interval is for --textfile: give --textfile PATH too")
    web = None
    if args.web_config is not None:
        from cachemgr.procedures import webconfig

        if listen is None:
            from cachemgr.core.errors import UsageError

            raise UsageError("--web-config is for the listener: give --listen too")
        web = webconfig.load(args.web_config)
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(Sysfs(args.sysfs_root), vms=not args.no_vms,
                                        uri=args.connect))
    if listen is not None:
        servers = serve(listen, registry, web)
        print(f"cachemgr: serving /metrics on {bound(servers)}"
              + (f" ({web.words()}, {args.web_config})" if web is not None else ""),
              file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    if args.textfile and args.interval is not None:
        # one process rewriting the file: the listener's collector and scan cache, so a
        # refresh reads what a scrape reads (no identity, no dmsetup table until a uevent)
        textfile_loop(Path(args.textfile), registry, args.interval, written=lambda: print(
            f"cachemgr: {args.textfile} written; rewritten every {args.interval:g} s",
            file=sys.stderr, flush=True))
        return ExitCode.OK
    if args.textfile:
        # node_exporter's textfile collector reads *.prom; written atomically so it never
        # sees half a file (and no temporary file is left when the write fails)
        write_textfile(Path(args.textfile), registry)
    else:
        sys.stdout.buffer.write(text(registry.collect()))
    return ExitCode.OK


def cmd_ssd_health(args: argparse.Namespace) -> int:
    from cachemgr.cli.render import emit
    from cachemgr.ops import health

    return emit(args, health.report(Sysfs(args.sysfs_root), refresh=args.refresh))


def cmd_check(args: argparse.Namespace) -> int:
    """The monitoring-plugin contract: stdout is the one summary line (and the findings
    after it), the exit code the level; an error of cachemgr's own is UNKNOWN (3), never
    one of its usual exit codes, which a monitoring system would read as WARNING/CRITICAL."""
    import json

    from cachemgr.core.errors import CacheMgrError
    from cachemgr.ops import health

    try:
        sysfs = Sysfs(args.sysfs_root)
        res = (health.check(sysfs, doctor_window=args.window) if args.doctor
               else health.check(sysfs))
    except Exception as exc:  # anything that kept it from looking is UNKNOWN, not 1 or 2
        msg = (exc.message if isinstance(exc, CacheMgrError) else
               f"{type(exc).__name__}: {exc}")
        if args.json:
            print(json.dumps({"schema": 1, "status": "UNKNOWN", "exit_code": 3,
                              "error": msg}))
        else:
            print(f"CACHEMGR UNKNOWN - {msg}")
        return 3
    if args.json:
        print(json.dumps(res.data, indent=2))
    else:
        print("\n".join(res.lines))
    return int(res.value)


def register(sub: Any) -> None:
    s = sub.add_parser("metrics", help="Prometheus metrics (textfile format, or --listen)",
                       description="Prometheus metrics of bcache and dm-cache, from /sys and "
                                   "dmsetup only: a scrape never opens or probes a disk.")
    s.add_argument("--textfile", metavar="PATH",
                   help="write atomically to PATH (node_exporter textfile collector *.prom)")
    s.add_argument("--interval", type=argtypes.seconds, metavar="SECONDS",
                   help="with --textfile: keep running and rewrite PATH every SECONDS "
                        "through the listener's scan cache (identities and dmsetup's table "
                        "read again only after a uevent); a failed write is logged and "
                        "tried again at the next interval (the first one is the command's "
                        "error); SIGTERM stops it, exit 0, the last file whole")
    s.add_argument("--listen", metavar="ADDR:PORT",
                   help="serve /metrics over HTTP. :PORT (or PORT) is loopback only: "
                        "127.0.0.1 and ::1, e.g. :9563. Another host's Prometheus needs an "
                        "explicit address: HOST:PORT, [IPV6]:PORT, or 0.0.0.0:PORT / [::]:PORT "
                        "for every address. Exit 2 for a malformed value or an address not on "
                        "this host, 1 when the port is in use")
    s.add_argument("--web-config", metavar="FILE",
                   help="TLS and basic auth for --listen, from a web-config file in the "
                        "format of Prometheus's exporters (exporter-toolkit: "
                        "tls_server_config, basic_auth_users with bcrypt hashes); what "
                        "cachemgr does not implement is refused by name (exit 2)")
    s.add_argument("--connect", metavar="URI",
                   help="libvirt connection whose VMs are measured (default qemu:///system)")
    s.add_argument("--no-vms", action="store_true", help="no VM metrics (libvirt not asked)")
    s.set_defaults(func=cmd_metrics)

    s = sub.add_parser("ssd-health", help="SMART health of the cache SSDs (smartctl, cached)",
                       description="Each cache SSD's wear, media errors, spare and SMART "
                                   "verdict from smartctl --json, kept under the state "
                                   "directory: smartctl runs for an answer older than 10 "
                                   "minutes (every SSD with --refresh), which status, the "
                                   "TUI, the metrics and replace-ssd then show. A drive to "
                                   "replace soon, or one smartctl could not read, is also a "
                                   "warning on stderr. cachemgr-smart.timer runs it with "
                                   "--refresh every 10 minutes.")
    s.add_argument("--refresh", action="store_true",
                   help="run smartctl for every cache SSD now (root)")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    s.set_defaults(func=cmd_ssd_health)

    s = sub.add_parser("check", help="monitoring plugin: 0 OK, 1 WARNING, 2 CRITICAL, "
                       "3 UNKNOWN, one line with performance data",
                       description="The health of every cache (the same model status shows) "
                                   "as a monitoring plugin reports it (Nagios, Icinga, Sensu, "
                                   "the Zabbix agent): one line 'CACHEMGR LEVEL - summary | "
                                   "perfdata', the other findings after it, and the level as "
                                   "the exit code. CRITICAL: dirty data on a failed or "
                                   "failing cache, stranded dirty data, a backing device "
                                   "gone while dirty, a dm-cache record it cannot use, an "
                                   "interrupted replacement; WARNING: IO errors, wear, an "
                                   "interrupted drain, what the scan could not read. Changes "
                                   "no device (as root it remembers the dirty backing "
                                   "devices it saw, to say when one is gone); smartctl is "
                                   "not run (its cached answers are read). Run as another "
                                   "user than root (a monitoring agent's), what it could not "
                                   "read (the state directory, dmsetup...) is said in one "
                                   "line, and the level is UNKNOWN unless a CRITICAL is seen "
                                   "anyway. See "
                                   "docs/admin-guide.md, 'Health and cachemgr check'.")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    # dest "doctor": the global -v/--verbose (log on stderr) keeps its own
    s.add_argument("--verbose", dest="doctor", action="store_true",
                   help="also why a cache does not help: cachemgr doctor's causes over "
                        "--window seconds, one line each after the findings ('causes' in "
                        "the JSON); they do not change the level")
    s.add_argument("--window", type=argtypes.seconds, default=15.0, metavar="SECONDS",
                   help="with --verbose: seconds between doctor's two reads (default 15: "
                        "bcache publishes its counters every 13.6 s)")
    s.set_defaults(func=cmd_check)
