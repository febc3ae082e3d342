"""``python -m cachemgr.cli.hook NAME OP SUBOP EXTRA``: cachemgr's libvirt qemu hook, run by
/etc/libvirt/hooks/qemu.d/cachemgr (libvirt/qemu-hook) with the domain XML on stdin. What it
decides, and why it passes or refuses on an error, is cachemgr/ops/migrate.py.

Contract with libvirt (its hooks page, hooks.html): exit 0 lets the operation go on; any
other exit stops it (an incoming migration is cancelled, a start fails) and libvirt shows
the exit status and this program's stderr to the user. For ``migrate`` and ``restore``
libvirt takes stdout as a replacement domain XML: nothing is ever written to stdout (fd 1 is
pointed at /dev/null first). Exit 3: refused (the message names the command that makes it
safe); exit 1: an error while a cached device is under a disk of an arriving VM (refused:
fail-closed).

The top level imports the standard library and cachemgr.ops.migrate only (which imports
nothing more than cachemgr.core's safexml and sysfs_lite): a VM with no cache under it
passes without the snapshot's imports.
"""

from __future__ import annotations

import os
import sys

from cachemgr.core import sysfs_lite
from cachemgr.ops import migrate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

POLICY_ENV = "CACHEMGR_POLICY"  # procedures/policy.py's ENV_PATH
SYSFS_ENV = "CACHEMGR_HOOK_SYSFS"  # tests: a captured tree instead of /sys


def _say(text: str) -> None:
    try:
        os.write(2, (text.rstrip("\n") + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def _quiet_stdout() -> None:
    """fd 1 to /dev/null: libvirt reads a migrate hook's stdout as the new domain XML."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.close(fd)
    except OSError:
        pass


def _policy(path: str | None) -> tuple[object, str | None]:
    """The ``[migration]`` table (defaults when there is no policy file) and, when the file
    is there but cannot be used, why."""
    from cachemgr.procedures import policy

    try:
        return policy.load(path).migration, None
    except policy.PolicyError as exc:
        if exc.missing:
            return policy.MigrationPolicy(), None
        return policy.MigrationPolicy(), "; ".join(x.render(exc.path) for x in exc.problems)


def _marked() -> bool:
    """Whether any cache is marked as holding copies of a disk written elsewhere, or has an
    invalidation pending (procedures/coherence.py): a start over one drops them first."""
    try:
        from cachemgr.procedures import coherence

        return bool(coherence.marks())
    except Exception:  # unreadable: the start is looked at
        return True


def run(argv: Sequence[str], xml: str, *, sys_root: str | None = None,
        policy_path: str | None = None) -> int:
    """The hook's decision for ``argv`` (NAME OP SUBOP EXTRA) and the domain ``xml``."""
    if len(argv) < 2 or argv[1] not in migrate.GUARDED:
        return 0
    name, op = argv[0], argv[1]
    sys_root = sys_root or sysfs_lite.ROOT
    try:
        if not migrate.needs_a_look(xml, sys_root=sys_root):
            return 0
    except Exception as exc:  # the hook answers libvirt by its exit code, whatever failed
        if op != "migrate":
            return 0
        _say(f"cachemgr: cannot read the domain's disks ({exc}): the incoming migration is "
             "refused (docs/admin-guide.md, \"Live migration over shared storage\")")
        return 1
    from cachemgr.core.errors import CacheMgrError
    from cachemgr.core.sysfs import Sysfs

    if op == "release":  # the VM has left: its caches are marked; never refused
        try:
            from cachemgr.core.sysfs import Sysfs as _Sysfs
            from cachemgr.core.text import printable

            for line in migrate.release(_Sysfs(sys_root), name, xml):
                _say(f"cachemgr: {line}")
        except Exception as exc:  # the hook answers libvirt by its exit code
            _say(f"cachemgr: the caches under domain '{printable(name)}' were not marked "
                 f"({exc})")
        return 0
    pol, problem = _policy(policy_path)
    if op == "prepare" and not getattr(pol, "guard_start", False) and not _marked():
        return 0
    try:
        done = migrate.guard(Sysfs(sys_root), name, op, xml, pol,  # type: ignore[arg-type]
                             policy_problem=problem)
    except CacheMgrError as exc:
        if op != "migrate" and exc.exit_code != 3:
            return 0
        _say(f"cachemgr: {exc.message}")
        if exc.hint:
            _say(f"cachemgr: to make it safe: {exc.hint}")
        return int(exc.exit_code)
    except Exception as exc:  # likewise
        if op != "migrate":
            return 0
        _say(f"cachemgr: cannot tell whether the caches under this VM are safe to migrate "
             f"({type(exc).__name__}: {exc}): the incoming migration is refused")
        return 1
    for line in done:
        _say(f"cachemgr: {line}")
    return 0


def warm_after(args: Sequence[str]) -> int:
    """``--warm-after --traces DIR -- DOMAIN NODE...``: the warm an arrival left running
    (cachemgr/ops/migrate.py ``start_warm``, ``warm_after``), detached from libvirt; its
    outcome goes to the devices' warm records and to syslog."""
    import logging
    import logging.handlers

    rest = list(args)
    if rest[:1] != ["--traces"] or len(rest) < 5 or rest[2] != "--":
        _say("cachemgr: usage: python -m cachemgr.cli.hook --warm-after --traces DIR -- "
             "DOMAIN NODE...")
        return 2
    traces, domain, nodes = rest[1], rest[3], rest[4:]
    log = logging.getLogger("cachemgr")
    log.setLevel(logging.INFO)
    if os.path.exists("/dev/log"):
        try:
            h = logging.handlers.SysLogHandler(
                address="/dev/log", facility=logging.handlers.SysLogHandler.LOG_DAEMON)
            h.setFormatter(logging.Formatter("cachemgr-warm[%(process)d]: %(message)s"))
            log.addHandler(h)
        except OSError:
            pass
    import signal

    from cachemgr.core.signals import Terminated
    from cachemgr.core.sysfs import Sysfs

    def stop(signum: int, _frame: object) -> None:  # migrate.stop_warm: the VM left
        # once: a second signal while the first is handled (the records written, what the
        # warm set put back) must not cut that short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Terminated, a subclass, never a plain KeyboardInterrupt: CPython 3.11 marks a
        # plain one that leaves code run by exec() of a string (a dataclass being made
        # during an import) as unhandled for good, caught or not, and the process then
        # ends killed by SIGINT whatever it returned (pythonrun.c run_eval_code_obj sets
        # _Py_UnhandledKeyboardInterrupt on the exact type; main.c exit_sigint)
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        return migrate.warm_after(Sysfs(os.environ.get(SYSFS_ENV) or sysfs_lite.ROOT),
                                  domain, nodes, traces)
    except KeyboardInterrupt as exc:  # before its records said waiting: nothing was read
        _say(f"cachemgr: warm after the arrival of {domain!r} stopped "
             f"({getattr(exc, 'name', 'SIGINT')}) before it began")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """``[--policy PATH] NAME OP SUBOP EXTRA`` (the wrapper puts ``--policy`` first when
    install-udev was given one; libvirt's four arguments follow); or the warm an arrival
    left running (:func:`warm_after`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [migrate.WARM_FLAG]:
        return warm_after(args[1:])
    policy_path = os.environ.get(POLICY_ENV) or None
    if args[:1] == ["--policy"] and len(args) >= 2:
        policy_path, args = args[1], args[2:]
    _quiet_stdout()
    try:
        xml = sys.stdin.buffer.read().decode("utf-8", "replace")
    except (OSError, ValueError, AttributeError):
        xml = ""
    return run(args, xml, sys_root=os.environ.get(SYSFS_ENV) or None,
               policy_path=policy_path)


if __name__ == "__main__":
    sys.exit(main())
