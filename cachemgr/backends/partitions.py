"""Partition tables, through sfdisk (util-linux), wrapped once: read a disk's table as a
script, and write the same layout to another disk.

``sfdisk --dump DEV`` prints the table as a script sfdisk reads back (sfdisk(8), "Backing up
the partition table")::

    label: gpt
    label-id: 5C5E0B0C-...
    device: /dev/sdb
    unit: sectors
    first-lba: 34
    last-lba: 327646
    sector-size: 512

    /dev/sdb1 : start=        2048, size=       16384, type=0FC63DAF-..., uuid=...

A copy for another disk keeps the label type, the unit and every partition's start, size,
type and attributes, and drops what names the old disk: its label id, device, the partitions'
UUIDs and names, and last-lba (the other disk may be larger). Partitions keep their numbers.
"""

from __future__ import annotations

import re

from cachemgr.core import runner
from cachemgr.core.errors import CacheMgrError

_KEEP_HEADERS = ("label", "unit", "first-lba", "sector-size")
_LINE = re.compile(r"^(?P<node>\S+?)\s*:\s*(?P<fields>start=.*)$")
_DROP_FIELDS = ("uuid", "name")


def dump(node: str) -> str:
    """``sfdisk --dump NODE``: the table as a script (CommandError if the disk has none)."""
    return runner.run(["sfdisk", "--dump", node], timeout=60).stdout


def part_name(disk: str, number: int) -> str:
    """The kernel name of partition ``number`` of ``disk``: sdb1, nvme0n1p1 (a disk whose
    name ends in a digit gets a ``p``), as the kernel's disk_name() does."""
    return f"{disk}{'p' if disk[-1:].isdigit() else ''}{number}"


def _number(node: str) -> int:
    m = re.search(r"(\d+)$", node)
    if not m:
        raise CacheMgrError(f"sfdisk dump: no partition number in {node!r}")
    return int(m.group(1))


def for_disk(script: str, disk: str) -> str:
    """``script`` (a :func:`dump` of another disk) rewritten for disk ``disk`` (kernel name):
    the same label type and partitions (start, size, type, attributes, numbers), none of the
    old disk's identifiers."""
    out: list[str] = []
    for raw in script.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _LINE.match(line)
        if m:
            fields = [f.strip() for f in m.group("fields").split(",") if f.strip()]
            keep = [f for f in fields if f.split("=", 1)[0].strip() not in _DROP_FIELDS]
            out.append(f"/dev/{part_name(disk, _number(m.group('node')))} : "
                       + ", ".join(keep))
            continue
        key = line.split(":", 1)[0].strip()
        if key in _KEEP_HEADERS:
            out.append(line)
    if not any(x.startswith("label:") for x in out):
        raise CacheMgrError("sfdisk dump without a label line")
    return "\n".join(out) + "\n"


def write(node: str, script: str) -> None:
    """Write the table ``script`` to ``node`` (any old table there is replaced; the kernel
    re-reads it). Only for a disk checked unused and blank."""
    runner.run(["sfdisk", "--quiet", "--no-reread", node], input=script, timeout=120)
    runner.run(["blockdev", "--rereadpt", node], timeout=60)
