"""`cachemgr trace` on a kernel without debugfs (the UML lab's) says what does work there,
not "mount debugfs" (issue #32 item 8). /proc/filesystems of both lab kernels is captured in
tests/fixtures/proc; the /sys trees are lab captures (neither has kernel/debug)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.backends import blktrace
from cachemgr.core.errors import UsageError
from cachemgr.core.sysfs import Sysfs
from tests.unit.tui_helpers import fx

PROC = Path(__file__).resolve().parent.parent / "fixtures" / "proc"
UML = (PROC / "filesystems-uml-7.2.7").read_text()
QEMU = (PROC / "filesystems-qemu-6.1.0-50-amd64").read_text()
IN_UML_LAB = {"CACHEMGR_IN_LAB": "1", "LAB_BACKEND": "uml"}


def test_the_captures_say_which_kernel_has_debugfs() -> None:
    assert blktrace.kernel_has_debugfs(UML) is False
    assert blktrace.kernel_has_debugfs(QEMU) is True
    assert blktrace.kernel_has_debugfs(None) is None


def refusal(sysfs: Sysfs, filesystems: str | None, env: dict[str, str]) -> UsageError:
    with pytest.raises(UsageError) as e:
        blktrace.preflight(sysfs, ["ubda"], filesystems=filesystems, env=env)
    return e.value


def test_in_the_uml_lab_the_hint_is_the_qemu_lab() -> None:
    e = refusal(Sysfs(fx("bcache-writeback-dirty")), UML, IN_UML_LAB)
    assert "has no debugfs, so no block tracing" in e.message
    assert e.hint is not None and "mount" not in e.hint
    assert "cachemgr lab run --backend qemu" in e.hint and "cachemgr trace /dev/vda" in e.hint


def test_elsewhere_without_debugfs_the_hint_is_a_kernel_that_has_it() -> None:
    e = refusal(Sysfs(fx("bcache-writeback-dirty")), UML, {})
    assert e.hint is not None and "CONFIG_BLK_DEV_IO_TRACE" in e.hint
    assert "mount" not in e.hint and "lab" not in e.hint


def test_a_kernel_with_debugfs_unmounted_is_told_to_mount_it() -> None:
    # the qemu capture's tree has no kernel/debug (debugfs unmounted), its kernel has debugfs
    e = refusal(Sysfs(fx("nvme-pair")), QEMU, IN_UML_LAB)
    assert e.message.startswith("debugfs is not mounted")
    assert e.hint == "mount -t debugfs none /sys/kernel/debug"
    # and when /proc/filesystems is unknown (a capture, AUTO), the same as before
    e = refusal(Sysfs(fx("nvme-pair")), None, {})
    assert e.message.startswith("debugfs is not mounted")


def test_the_qemu_lab_command_in_the_hint_parses() -> None:
    """The hint's command line is one the CLI takes (lab run ... -- cachemgr trace ...)."""
    import shlex

    from cachemgr.cli.main import build_parser

    words = shlex.split(blktrace.QEMU_LAB_TRACE)
    assert words[0] == "cachemgr"
    cut = words.index("--")
    p = build_parser()
    args = p.parse_args(words[1:])
    assert args.backend == "qemu" and args.command[-len(words[cut + 1:]):] == words[cut + 1:]
    inner = p.parse_args(words[cut + 2:])
    assert inner.devices == ["/dev/vda"] and inner.seconds == 30
