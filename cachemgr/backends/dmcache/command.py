"""The dmsetup command: the one wrapper every dmsetup call goes through, where dmsetup's
answers come from (the live system, or a capture beside a fixture tree), and one device's
table and status read now."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from cachemgr.backends.dmcache.parse import FailWord, parse_status
from cachemgr.core import runner
from cachemgr.core.errors import CacheMgrError, KernelFormatError
from cachemgr.core.model import DmCacheStatus
from cachemgr.core.sysfs import Sysfs


class DmsetupSource(Protocol):
    def output(self, what: str) -> str:
        """The text of ``dmsetup <what>`` for all devices (table, status, info)."""


def _env() -> dict[str, str]:
    # Without udevd libdevmapper waits for udev to make /dev/mapper nodes (forever):
    # DM_DISABLE_UDEV=1 makes it create them itself
    # (docs/kernel-notes.md, "device-mapper without udev").
    return {} if os.path.exists("/run/udev/control") else {"DM_DISABLE_UDEV": "1"}


def dmsetup(*args: str, timeout: float = 60, check: bool = True) -> runner.Completed:
    return runner.run(["dmsetup", *args], timeout=timeout, check=check, env=_env())


def words(what: str) -> tuple[str, ...]:
    """dmsetup's words for reading ``what`` (table, status, info). A status is always read
    with ``--noflush``: without it dm-cache commits its metadata on every status read, and a
    drain polling twice a second slowed the writeback down
    (docs/kernel-notes.md, "dm-cache table and status")."""
    return ("status", "--noflush") if what == "status" else (what,)


def one_line(what: str, name: str) -> str:
    """``dmsetup <what> NAME`` (:func:`words`): its one target line (a KernelFormatError
    otherwise)."""
    lines = [x for x in dmsetup(*words(what), name, timeout=30).stdout.splitlines()
             if x.strip()]
    if len(lines) != 1:
        raise KernelFormatError(f"dmsetup {what} {name} (one target expected)", "\n".join(lines))
    return lines[0]


def status_line(name: str) -> str:
    """``dmsetup status --noflush NAME``: the one target line."""
    return one_line("status", name)


class LiveDmsetup:
    def output(self, what: str) -> str:
        return dmsetup(*words(what), timeout=30).stdout


class CapturedDmsetup:
    """``dmsetup-<what>.txt`` files written by ``cachemgr capture`` next to ``sys/``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def output(self, what: str) -> str:
        p = self.dir / f"dmsetup-{what}.txt"
        try:
            text = p.read_text()
        except OSError:
            return ""
        if text.startswith("# dmsetup"):  # the capture recorded a failure
            raise CacheMgrError(text.strip().lstrip("# "))
        return text


def default_source(sysfs: Sysfs) -> DmsetupSource:
    """dmsetup itself on the live system; the capture's files beside a captured tree."""
    return LiveDmsetup() if sysfs.live else CapturedDmsetup(sysfs.root.parent)


def read_status(name: str) -> DmCacheStatus | FailWord:
    """``dmsetup status NAME``: one line without the name prefix."""
    return parse_status(status_line(name))


def read_table(name: str) -> str:
    return one_line("table", name).strip()
