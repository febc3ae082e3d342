"""The lvm2 commands: the one wrapper every lvs/lvchange/lvconvert call goes through, and
where ``lvs``'s report comes from (the live system, or a capture beside a fixture tree).

cachemgr changes an LVM-owned cache only through lvm2 (never dmsetup behind its back: lvm2's
metadata would then disagree with the kernel's table, and its next activation would undo the
change; the one exception loads lvm2's own cleaner table again, unchanged, during a drain:
dmcache.switch.requeue_cleaner). Names reach lvm2 as argv words after checks
(:func:`check_vg_lv`), never through a shell; ``-y`` answers lvm2's questions, which cachemgr
asked the admin already.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Protocol

from cachemgr.backends.dmcache.refusals import lvm_name
from cachemgr.core import runner
from cachemgr.core.errors import CacheMgrError, CommandError, KernelFormatError, UsageError
from cachemgr.core.sysfs import Sysfs

# the fields of the one lvs report cachemgr reads (lvs(8); "lvs -o help" lists them)
REPORT_FIELDS = (
    "lv_uuid,lv_name,lv_full_name,vg_name,lv_dm_path,lv_layout,lv_role,lv_attr,lv_size,"
    "origin,pool_lv,data_lv,metadata_lv,devices,metadata_devices,segtype,"
    "cache_mode,cache_policy,cache_settings,chunk_size,"
    "lv_health_status,lv_check_needed,lv_active,lv_device_open,"
    "writecache_block_size"
)

# lvm2's own name rules (lvm(8), "VALID NAMES"): letters, digits and + _ . -; not starting
# with '-'. Anything else is refused before it becomes an argv word.
_NAME = re.compile(r"^[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,126}$")


def check_vg_lv(text: str) -> tuple[str, str]:
    """``VG/LV`` -> (VG, LV), both valid lvm2 names; a usage error otherwise."""
    vg, sep, lv = text.partition("/")
    if not sep or not _NAME.match(vg) or not _NAME.match(lv) or vg in (".", "..") \
            or lv in (".", ".."):
        raise UsageError(f"{text!r} is not an LVM name VG/LV",
                         hint="use VG/LV, /dev/VG/LV or /dev/mapper/VG-LV (lvs lists them)")
    return vg, lv


def spelling(target: str) -> str | None:
    """``VG/LV`` when ``target`` is spelt as an LV (``VG/LV``, ``/dev/VG/LV``,
    ``/dev/mapper/VG-LV``), else None. Whether the LV exists is lvm2's to say."""
    if target.startswith("/dev/mapper/"):
        name = lvm_name(target.removeprefix("/dev/mapper/"))
        return name if "/" in name else None
    rest = target.removeprefix("/dev/") if target.startswith("/dev/") else target
    parts = rest.split("/")
    if len(parts) != 2 or not all(parts) or (target.startswith("/dev/") and parts[0] in (
            "bcache", "disk", "mapper", "block", "md")):
        return None
    return rest


def _env() -> dict[str, str]:
    # the same as dmsetup's: without udevd, libdevmapper makes the nodes itself
    # (docs/kernel-notes.md, "device-mapper without udev")
    return {} if os.path.exists("/run/udev/control") else {"DM_DISABLE_UDEV": "1"}


def lvm(*args: str, timeout: float = 120, check: bool = True) -> runner.Completed:
    """``lvm ARGS`` (lvs, lvchange, lvconvert... are its subcommands)."""
    return runner.run(["lvm", *args], timeout=timeout, check=check, env=_env())


def lvchange(vg_lv: str, *args: str, timeout: float = 600) -> runner.Completed:
    check_vg_lv(vg_lv)
    return lvm("lvchange", "-y", *args, "--", vg_lv, timeout=timeout)


def lvconvert(*args: str, timeout: float = 24 * 3600.0) -> runner.Completed:
    return lvm("lvconvert", "-y", *args, timeout=timeout)


def pvs() -> list[dict[str, Any]]:
    """Every PV lvm2 sees: ``pv_name``, ``vg_name`` ("" for an orphan PV), ``pv_uuid``."""
    out = lvm("pvs", "--reportformat", "json", "-o", "pv_name,vg_name,pv_uuid", timeout=120)
    try:
        rows = json.loads(out.stdout)["report"][0]["pv"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise KernelFormatError("pvs --reportformat json", out.stdout[:2000]) from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise KernelFormatError("pvs --reportformat json", out.stdout[:2000])
    return rows


def pv_vg(node: str) -> str | None:
    """The VG the PV on ``node`` belongs to: "" for a PV of no VG, None for no PV."""
    for r in pvs():
        if r.get("pv_name") == node:
            vg = r.get("vg_name")
            return vg if isinstance(vg, str) else ""
    return None


def check_node(node: str) -> str:
    """A /dev path as an argv word for lvm2 (never an option, never relative)."""
    if not node.startswith("/dev/") or "\n" in node:
        raise UsageError(f"{node!r} is not a /dev path")
    return node


class LvsSource(Protocol):
    def report(self) -> list[dict[str, Any]]:
        """The rows of ``lvs -a`` with :data:`REPORT_FIELDS` (one per LV segment)."""


def parse_report(text: str) -> list[dict[str, Any]]:
    """The ``lv`` rows of lvs's JSON report (``{"report": [{"lv": [...]}]}``)."""
    try:
        doc = json.loads(text)
        rows = doc["report"][0]["lv"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise KernelFormatError("lvs --reportformat json", text[:2000]) from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise KernelFormatError("lvs --reportformat json", text[:2000])
    return rows


def lvs_argv(*select: str) -> list[str]:
    return ["lvs", "-a", "--reportformat", "json", "--units", "b", "--nosuffix",
            "-o", REPORT_FIELDS, *select]


class LiveLvs:
    def report(self) -> list[dict[str, Any]]:
        return parse_report(lvm(*lvs_argv(), timeout=120).stdout)


class CapturedLvs:
    """``lvs.json`` written by ``cachemgr capture`` next to ``sys/`` (absent: no LVM)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def report(self) -> list[dict[str, Any]]:
        p = self.dir / "lvs.json"
        try:
            text = p.read_text()
        except OSError:
            return []
        if text.startswith("# lvs"):
            raise CacheMgrError(text.strip().lstrip("# "))
        return parse_report(text)


def default_source(sysfs: Sysfs) -> LvsSource:
    return LiveLvs() if sysfs.live else CapturedLvs(sysfs.root.parent)


def why(exc: CommandError) -> str:
    """lvm2's own last words of a failed command, for a message."""
    lines = [x.strip() for x in exc.stderr.splitlines() if x.strip()]
    return lines[-1] if lines else str(exc).splitlines()[0]
