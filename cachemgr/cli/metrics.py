"""``cachemgr metrics``: node_exporter textfile output, or a /metrics listener."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

from cachemgr.core.errors import UsageError
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.sysfs import Sysfs


def cmd_metrics(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server

    from cachemgr.procedures.metrics import SnapshotCollector

    registry = CollectorRegistry()
    registry.register(SnapshotCollector(Sysfs(args.sysfs_root)))
    if args.listen:
        host, sep, port = args.listen.rpartition(":")
        if not sep or not port.isdigit():
            raise UsageError(f"bad --listen {args.listen!r}", hint="use ADDR:PORT, e.g. :9563")
        start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)
        print(f"cachemgr: serving /metrics on {host or '0.0.0.0'}:{port}", file=sys.stderr)
        while True:
            time.sleep(3600)
    text = generate_latest(registry)
    if args.textfile:
        # node_exporter's textfile collector reads *.prom; write atomically so it never
        # sees half a file
        d = os.path.dirname(os.path.abspath(args.textfile))
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".cachemgr-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, args.textfile)
    else:
        sys.stdout.buffer.write(text)
    return ExitCode.OK


def register(sub: Any) -> None:
    s = sub.add_parser("metrics", help="Prometheus metrics (textfile format, or --listen)")
    s.add_argument("--textfile", metavar="PATH",
                   help="write atomically to PATH (node_exporter textfile collector *.prom)")
    s.add_argument("--listen", metavar="ADDR:PORT", help="serve /metrics, e.g. :9563")
    s.set_defaults(func=cmd_metrics)
