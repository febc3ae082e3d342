"""``cachemgr install-udev``: the udev rule, the systemd units and libvirt's qemu hook (the
live-migration guard), put in place by the installer
that ships with cachemgr (``scripts/install-udev.sh`` in a checkout; in a wheel the same
script, rule, units and hook are package data, in the package's ``data`` directory)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from cachemgr.core.errors import CacheMgrError

_PKG = Path(__file__).resolve().parents[1]
INSTALLERS = (_PKG / "data" / "scripts" / "install-udev.sh",  # an installed wheel
              _PKG.parent / "scripts" / "install-udev.sh")  # a checkout


def installer() -> Path:
    for p in INSTALLERS:
        if p.is_file():
            return p
    raise CacheMgrError("the installer (install-udev.sh) is not part of this installation",
                        hint=f"looked for {' and '.join(map(str, INSTALLERS))}")


def argv_for(args: argparse.Namespace) -> list[str]:
    """The installer's command line: this interpreter's cachemgr unless --python says."""
    argv = ["/bin/bash", str(installer()), "--python", args.python or sys.executable]
    for opt in ("policy", "rules_dir", "unit_dir", "hooks_dir"):
        if getattr(args, opt):
            argv += [f"--{opt.replace('_', '-')}", getattr(args, opt)]
    for flag in ("metrics", "textfile", "smart", "protect", "scrub", "governor", "uninstall",
                 "no_systemd",
                 "no_reload", "no_libvirt_hook"):
        if getattr(args, flag):
            argv.append(f"--{flag.replace('_', '-')}")
    return argv


def cmd_install_udev(args: argparse.Namespace) -> int:
    argv = argv_for(args)
    os.execv(argv[0], argv)  # its messages and its exit code are the command's


def register(sub: Any) -> None:
    s = sub.add_parser(
        "install-udev", help="install (or remove) the udev rule and the systemd units",
        description="As root: the auto-attach udev rule (/etc/udev/rules.d/90-cachemgr.rules) "
                    "and boot unit, libvirt's qemu hook (the live-migration guard, "
                    "/etc/libvirt/hooks/qemu.d/cachemgr, when libvirt is installed), and on "
                    "request the metrics units, with this cachemgr as their program; reloads "
                    "udev, systemd and a running libvirtd (udev/README.md, systemd/README.md; "
                    "the hook: the admin guide, \"Live migration over shared storage\"). "
                    "Exit 2 for a bad option or a --python without cachemgr.")
    s.add_argument("--python", metavar="PATH",
                   help="the interpreter that has cachemgr (default: this one)")
    s.add_argument("--policy", metavar="PATH",
                   help="an absolute policy path instead of /etc/cachemgr/cachemgr.toml")
    s.add_argument("--metrics", action="store_true",
                   help="also cachemgr-metrics.service (/metrics on loopback :9563), enabled")
    s.add_argument("--textfile", action="store_true",
                   help="also cachemgr-textfile.service (node_exporter's textfile, "
                        "rewritten every 15 s), enabled; an earlier version's "
                        "cachemgr-textfile.timer is disabled and removed by any install")
    s.add_argument("--smart", action="store_true",
                   help="also cachemgr-smart.timer (the cache SSDs' SMART health read every "
                        "10 minutes), enabled")
    s.add_argument("--protect", action="store_true",
                   help="also cachemgr-protect.timer (the policy's [protect] pass every "
                        "minute: a failing cache SSD's devices to writethrough), enabled")
    s.add_argument("--scrub", action="store_true",
                   help="also cachemgr-scrub.timer (cachemgr scrub --all every week: the "
                        "write-through and clean caches compared with their origins, "
                        "paced), enabled")
    s.add_argument("--governor", action="store_true",
                   help="also cachemgr-governor.service (the writeback governor: the "
                        "policy's [writeback] bounds held while it runs), enabled")
    s.add_argument("--uninstall", action="store_true",
                   help="disable, stop and remove everything it installs")
    s.add_argument("--no-systemd", action="store_true", help="the udev rule only")
    s.add_argument("--no-reload", action="store_true", help="do not reload udev's rules")
    s.add_argument("--rules-dir", metavar="DIR", help="default /etc/udev/rules.d")
    s.add_argument("--unit-dir", metavar="DIR", help="default /etc/systemd/system")
    s.add_argument("--hooks-dir", metavar="DIR",
                   help="libvirt's hooks directory (default /etc/libvirt/hooks, when "
                        "/etc/libvirt exists); the hook goes to DIR/qemu.d/cachemgr")
    s.add_argument("--no-libvirt-hook", action="store_true",
                   help="not libvirt's qemu hook (the live-migration guard)")
    s.set_defaults(func=cmd_install_udev)
