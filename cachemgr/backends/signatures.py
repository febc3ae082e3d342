"""On-disk signatures (filesystems, RAID, LVM, bcache superblocks), through wipefs, wrapped
once: the probe every "refuse to format a disk that holds data" check uses, and the wipe.

``wipefs --no-act --noheadings --output TYPE DEV`` prints one signature type per line
(wipefs(8)); an empty output means none was found. A probe that fails (no such device, no
permission) reads as "none found" for callers that refuse on a signature: they check the
device exists and is unused before, and the format itself fails loudly after.
"""

from __future__ import annotations

from cachemgr.core import runner


def found(node: str) -> list[str]:
    """Every signature type wipefs finds on ``node``, in its order (empty: none)."""
    r = runner.run(["wipefs", "--no-act", "--noheadings", "--output", "TYPE", node],
                   check=False, timeout=30)
    if r.returncode != 0:
        return []
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def first(node: str) -> str | None:
    """The first signature type on ``node`` (e.g. ``ext4``, ``bcache``), or None."""
    sigs = found(node)
    return sigs[0] if sigs else None


def wipe(node: str) -> None:
    """Erase every signature on ``node`` (``wipefs -a``); raises CommandError on failure."""
    runner.run(["wipefs", "-a", node], timeout=60)
