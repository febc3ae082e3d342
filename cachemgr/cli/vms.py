"""``cachemgr vms`` and ``cachemgr vm-cache``: the faces of cachemgr/ops/vms.py."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

from cachemgr.cli import args as argtypes
from cachemgr.cli import confirm
from cachemgr.cli.render import emit
from cachemgr.core.defaults import VM_CACHE_MODES
from cachemgr.core.lazy import lazy
from cachemgr.core.sysfs import Sysfs
from cachemgr.core.text import printable

if TYPE_CHECKING:
    from cachemgr.ops import control
    from cachemgr.ops import vms as ops
else:  # imported when a handler first uses it (cachemgr/cli/main.py's docstring)
    control = lazy("cachemgr.ops.control")
    ops = lazy("cachemgr.ops.vms")


def cmd_vms(args: argparse.Namespace) -> int:
    if not args.watch:
        return emit(args, ops.vms(Sysfs(args.sysfs_root), args.connect))
    prev, t_prev = None, 0.0
    while True:
        res = ops.vms(Sysfs(args.sysfs_root), args.connect)
        now = time.monotonic()
        cur = res.value.vms
        if args.json:
            print(json.dumps(res.json()), flush=True)
        else:
            lines = ops.watch_lines(prev, cur, now - t_prev)
            print("\n".join(printable(f"{time.strftime('%H:%M:%S')} {x}") for x in lines),
                  flush=True)
        prev, t_prev = cur, now
        time.sleep(args.watch)


def cmd_vm_cache(args: argparse.Namespace) -> int:
    plan = ops.plan_cache(Sysfs(args.sysfs_root), args.domain, args.disk, args.mode,
                          uri=args.connect, next_boot=args.next_boot)
    confirm.require(args, control.Plan(f"vm-cache {args.domain} {args.disk} {args.mode}",
                               tuple(ops.describe_cache(plan))))
    return emit(args, ops.vm_cache(plan))


def register(sub: Any) -> None:
    s = sub.add_parser("vms", help="the libvirt VMs above the caches: disks, cache modes, "
                                   "warnings, IO pressure")
    s.add_argument("--connect", metavar="URI", help="libvirt connection (default qemu:///system)")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    s.add_argument("--watch", type=argtypes.seconds, metavar="SECONDS",
                   help="every SECONDS: each VM's IO pressure and IO rates since the last look")
    s.set_defaults(func=cmd_vms)

    s = sub.add_parser("vm-cache", help="set a VM disk's cache mode in its persistent "
                                        "definition (through libvirt)")
    s.add_argument("domain", metavar="DOMAIN", help="the domain's name or UUID")
    s.add_argument("disk", metavar="DISK", help="the disk's target (vda) or source path")
    s.add_argument("mode", metavar="MODE", choices=VM_CACHE_MODES,
                   help="|".join(VM_CACHE_MODES))
    s.add_argument("--next-boot", action="store_true",
                   help="change a running domain's definition; it applies at its next boot")
    confirm.add_yes(s)
    s.add_argument("--connect", metavar="URI", help="libvirt connection (default qemu:///system)")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema 1)")
    s.set_defaults(func=cmd_vm_cache)
