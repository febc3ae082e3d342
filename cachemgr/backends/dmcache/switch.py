"""Table switches: suspend -> load -> resume with SIGINT/SIGTERM/SIGHUP held, the old
table put back on any failure; the live migration_threshold carried into a new table."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from cachemgr.backends.dmcache import command
from cachemgr.backends.dmcache.parse import DEFAULT_MIGRATION_THRESHOLD
from cachemgr.core.errors import CommandError, UnsafeError
from cachemgr.core.model import DmCacheTable


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP while a table switch runs.

    A Ctrl-C between ``suspend`` and ``resume`` would leave the VMs' disk suspended (all IO
    hangs). The blocked mask is inherited by the dmsetup children (the terminal sends
    SIGINT to the whole process group), and the signal is delivered once the switch is
    complete, where the flush's handler restores the table.
    """
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def switch_table(name: str, old: str, new: str, *, require_clean: bool = False) -> None:
    """suspend -> load ``new`` -> resume; on any failure the ``old`` table runs again.

    ``require_clean``: refuse (UnsafeError) unless the status reads 0 dirty blocks while the
    device is suspended (no IO can dirty a block then).
    """
    with critical():
        command.dmsetup("suspend", name)
        try:
            if require_clean:
                st = command.read_status(name)
                if isinstance(st, str) or st.dirty:
                    dirty = "?" if isinstance(st, str) else str(st.dirty)
                    raise UnsafeError(f"/dev/mapper/{name}: {dirty} dirty blocks appeared "
                                      "again; not switching the table")
            command.dmsetup("load", name, "--table", new)
        except BaseException:
            command.dmsetup("resume", name, check=False)  # the old table is still the live one
            raise
        try:
            command.dmsetup("resume", name)
        except CommandError:
            # The kernel refused the new table at resume (preresume): passthrough with dirty
            # blocks gives EBUSY. The device is now suspended with the new table live.
            with contextlib.suppress(CommandError):
                command.dmsetup("clear", name)
            command.dmsetup("load", name, "--table", old)
            command.dmsetup("resume", name)
            raise


def with_threshold(t: DmCacheTable, threshold: int | None) -> DmCacheTable:
    """The table with ``migration_threshold`` set to the live value (a reload resets it to
    the table's). Unchanged when the table already says so (or says nothing and the value is
    the default)."""
    if threshold is None:
        return t
    args = t.policy_args
    pairs = list(zip(args[0::2], args[1::2], strict=False))
    current = next((int(v) for k, v in pairs if k == "migration_threshold" and v.isdigit()),
                   DEFAULT_MIGRATION_THRESHOLD)
    if threshold == current:
        return t
    pairs = [(k, v) for k, v in pairs if k != "migration_threshold"]
    pairs.append(("migration_threshold", str(threshold)))
    return t.with_policy(t.policy, tuple(x for kv in pairs for x in kv))
