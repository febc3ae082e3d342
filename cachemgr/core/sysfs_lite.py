"""The block-device stack under a device, read from sysfs with the standard library only: for
the entry points that must start fast (the libvirt hook, cachemgr/cli/hook.py), where
cachemgr/core/sysfs.py's imports (pathlib, the error types) cost more than the whole answer.
Everything else reads the kernel through :class:`cachemgr.core.sysfs.Sysfs`."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = "/sys"  # Sysfs's DEFAULT_ROOT (tests/unit/test_migrate_hook.py keeps them equal)


class Unreadable(OSError):
    """A directory of the walk could not be listed."""


def names_under(sys_root: str, devno: str) -> Iterator[str]:
    """The kernel names of the block device ``devno`` (MAJ:MIN) and of every device under it
    (``slaves/``; a partition leads to its disk), nearest first. Nothing when ``devno`` is no
    block device here. :class:`Unreadable` when a ``slaves`` directory cannot be listed."""
    first = os.path.realpath(os.path.join(sys_root, "dev", "block", devno))
    if not os.path.isdir(first):
        return
    todo, seen = [first], set()
    while todo:
        d = todo.pop(0)
        if d in seen:
            continue
        seen.add(d)
        yield os.path.basename(d)
        if os.path.exists(os.path.join(d, "partition")):
            todo.append(os.path.dirname(d))
            continue
        try:
            slaves = os.listdir(os.path.join(d, "slaves"))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise Unreadable(exc.errno, f"{d}/slaves: {exc.strerror}") from None
        todo += [os.path.realpath(os.path.join(d, "slaves", s)) for s in slaves]
