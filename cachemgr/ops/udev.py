"""The udev handler's runtime: what ``cachemgr udev-event`` and its worker do (their face,
cachemgr/cli/udev.py, only parses and calls).

udev runs ``udev-event`` for every block-device uevent (udev/90-cachemgr.rules). A RUN
program must finish fast (udev.rules(7): long work belongs elsewhere; udevd kills what a RUN
program leaves behind once it runs under systemd), so the handler only:

1. writes the event (udev's environment) as one file into the queue
   ``<state dir>/autoattach/queue/`` (atomic rename; a storm of events is a pile of files);
2. starts a worker unless one is already *pending* (holding ``autoattach-pending.lock``):
   that worker will look at the queue again before it goes, so it will see this event too.
   Under systemd the worker is a transient unit (``systemd-run --no-block``, as lvm2's
   69-dm-lvm.rules does); without systemd as PID 1 (the lab, some initramfs) a
   double-forked process in its own session.

The worker holds the pending lock for its whole life (one worker at a time), imports what a
pass needs, and then, under the run lock (shared with the boot pass), waits until the oldest
queued event is ``settle`` seconds old so a burst lands in one batch, drains the queue and
makes one :func:`cachemgr.procedures.autoattach.reconcile` pass for the whole batch; it
repeats while events keep coming and waits ``linger`` seconds for more before it goes.
Lost wake-ups are impossible: after it lets the pending lock go the worker looks at the
queue once more, and an event queued after that look finds the lock free and starts a new
worker.

The rule's fast entry point (``python -m cachemgr.cli.udev udev-event``) runs this module:
on the rule's own call it imports nothing beyond os, sys, time, fcntl and stat (which os
loads anyway) (no argparse, json, logging, pathlib or re: with them a handler took
0.10-0.13 s of CPU on the UML lab, without them 0.02-0.03 s, and a hot-added pair of disks
runs the handler for 6-8 events on the CPU the worker needs; docs/benchmarks.md, "udev
auto-attach latency"). Its top level imports the standard library and cachemgr.core.safefs
only (which imports os and stat), and the packages' ``__init__`` load nothing on import
(tests/unit/test_autoattach_stages.py checks what the rule's call loads). The queue files
are therefore NUL-separated ``KEY=VALUE`` lists, like /proc/PID/environ (an environment
holds no NUL); the worker still reads the JSON files of earlier versions.

Everything the handler and the worker keep under the state directory (the queue, the
pending and run locks, worker.log) is opened as cachemgr/core/state.py opens its files,
through the same primitives (cachemgr/core/safefs.py): never through a symbolic link, and,
run as root, not in a state directory (or a directory in or above it) that another user
owns or could write to. A refused state directory is the handler's failure (:func:`failed`:
one line on stderr and to syslog, exit 1), before anything is written.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time

from cachemgr.core import safefs

TYPE_CHECKING = False  # typing's import costs what the handler saves; mypy reads it as True
if TYPE_CHECKING:
    import logging
    from collections.abc import Mapping
    from typing import Any

LOGGER = "cachemgr.procedures.autoattach"
DEFAULT_POLICY = "/etc/cachemgr/cachemgr.toml"
SYSLOG_SOCKET = "/dev/log"
SETTLE_S = 0.15
LINGER_S = 5.0  # how long a worker waits for more events after its last pass
POLL_S = 0.05  # how often a lingering worker looks at the queue
WORKER_NICE = -10
SANE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ACTIONS = ("add", "change", "remove", "bind", "move")


def resolve_policy(given: str | None) -> str:
    """The policy file: ``given``, else $CACHEMGR_POLICY, else DEFAULT_POLICY."""
    return given or os.environ.get("CACHEMGR_POLICY") or DEFAULT_POLICY


def _dir(*parts: str) -> int:
    """The descriptor of a directory under the state directory, made (mode 0700) if
    missing, every directory on the way opened without following links and, run as root,
    refused (:class:`cachemgr.core.safefs.UnsafePathError`) when another user could change
    it (what cachemgr.core.state does, without that module's imports). The caller closes
    it."""
    fd = safefs.open_dir(*parts, create=True)
    assert fd is not None
    return fd


def _shown(*parts: str) -> str:
    return os.path.join(safefs.configured(), *parts)


_QUEUE = ("autoattach", "queue")


def _queue() -> str:
    """The queue directory's path (made and checked)."""
    os.close(_dir(*_QUEUE))
    return _shown(*_QUEUE)


def _log() -> logging.Logger:
    import logging

    return logging.getLogger(LOGGER)


# ---------------------------------------------------------------------------------------
# logging: syslog/journald when there is one, stderr otherwise


def setup_logging(*, stderr: bool = True, level: int | None = None) -> None:
    """Log decisions to syslog (journald reads /dev/log) and, if ``stderr``, to stderr."""
    import logging
    import logging.handlers

    log = _log()
    log.setLevel(logging.INFO if level is None else level)
    have = {type(h) for h in log.handlers}
    if os.path.exists(SYSLOG_SOCKET) and logging.handlers.SysLogHandler not in have:
        try:
            h: logging.Handler = logging.handlers.SysLogHandler(
                address=SYSLOG_SOCKET, facility=logging.handlers.SysLogHandler.LOG_DAEMON)
            h.setFormatter(logging.Formatter("cachemgr-autoattach[%(process)d]: %(message)s"))
            log.addHandler(h)
        except OSError:
            pass
    if os.environ.get("JOURNAL_STREAM") and _stderr_is_journal() and any(
            isinstance(h, logging.handlers.SysLogHandler) for h in log.handlers):
        # a systemd unit: stderr is the journal too, and each line came twice (three times
        # under the CLI, whose own handler on the root logger also writes to stderr)
        stderr = False
        log.propagate = False
    if stderr and not logging.getLogger().handlers and logging.StreamHandler not in have:
        s = logging.StreamHandler(sys.stderr)
        s.setFormatter(logging.Formatter(
            "%(asctime)s cachemgr-autoattach[%(process)d]: %(levelname)s: %(message)s"))
        log.addHandler(s)


def _stderr_is_journal() -> bool:
    """systemd.exec(5): JOURNAL_STREAM is "DEV:INODE" of the journal stream on stderr."""
    try:
        st = os.fstat(2)
    except OSError:
        return False
    return os.environ.get("JOURNAL_STREAM") == f"{st.st_dev}:{st.st_ino}"


# ---------------------------------------------------------------------------------------
# the queue


def event_from(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The parts of a udev environment worth keeping, or None for events we skip."""
    if env.get("SUBSYSTEM", "block") != "block":
        return None
    action = env.get("ACTION", "change")
    if action not in _ACTIONS:
        return None
    name = os.path.basename(env.get("DEVNAME", ""))
    if name.startswith(("loop", "ram", "zram", "sr", "fd", "nbd")):
        return None
    keep = ("ACTION", "DEVNAME", "DEVPATH", "DEVTYPE", "SEQNUM", "SUBSYSTEM", "DEVLINKS",
            "ID_FS_TYPE", "ID_FS_UUID", "ID_WWN", "ID_WWN_WITH_EXTENSION", "ID_SERIAL",
            "ID_SERIAL_SHORT", "ID_SCSI_SERIAL", "ID_PATH", "MAJOR", "MINOR")
    ev: dict[str, Any] = {k: env[k] for k in keep if env.get(k)}
    ev["ACTION"] = action
    started = process_started()
    if started is not None:
        ev["_started"] = round(started, 3)
    ev["_received"] = time.time()
    return ev


def process_started() -> float | None:
    """When this process started, as a time.time() value (10 ms steps): proc(5) gives its
    start in clock ticks after boot (/proc/self/stat, field 22), the clock CLOCK_BOOTTIME
    counts; None where /proc cannot say. The handler's start is the first stage of an event
    the action journal shows (the interpreter's own start precedes any line of ours)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            # the command name (field 2) may hold spaces and parentheses: split after its ")"
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / hz)


def enqueue(ev: Mapping[str, Any]) -> str:
    """Write ``ev`` into the queue (atomically: a worker never reads half of it); its path."""
    name = f"{time.time_ns()}-{ev.get('SEQNUM', 0)}-{os.getpid()}.env"
    # str values as os.environ decoded them (surrogateescape): os.fsencode gives the bytes back
    data = b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in sorted(ev.items()))
    q = _dir(*_QUEUE)
    try:
        # a temporary file ".NAME.RANDOM.tmp" (drain skips dot files), made O_EXCL, renamed
        # within q; not synced: a crash loses the event, which the boot pass covers
        safefs.write_at(q, name, data, fsync=False)
    finally:
        os.close(q)
    return _shown(*_QUEUE, name)


def parse_queued(data: bytes) -> dict[str, Any]:
    """One queue file: NUL-separated KEY=VALUE (str values, as enqueue wrote them), or the
    JSON object of an earlier version. ValueError for anything else."""
    if data[:1] == b"{":
        import json

        obj = json.loads(data)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        return obj
    out: dict[str, Any] = {}
    for item in data.split(b"\0"):
        if not item:
            continue
        key, eq, value = os.fsdecode(item).partition("=")
        if not eq or not key:
            raise ValueError(f"not KEY=VALUE: {item[:60]!r}")
        out[key] = value
    return out


def drain() -> list[dict[str, Any]]:
    """Take every queued event (oldest first); unreadable files are dropped with a warning."""
    q = _dir(*_QUEUE)
    out = []
    try:
        for name in sorted(os.listdir(q)):
            if name.startswith("."):
                continue
            try:
                fd = safefs.open_file(q, name, _shown(*_QUEUE, name),
                                      os.O_RDONLY | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f:
                    out.append(parse_queued(f.read()))
            except (OSError, ValueError, safefs.UnsafePathError) as exc:
                _log().warning("dropping unreadable queued event %s: %s", name, exc)
            try:
                os.unlink(name, dir_fd=q)
            except FileNotFoundError:
                pass
    finally:
        os.close(q)
    return out


def oldest_queued() -> float | None:
    """When the oldest queued event was queued (its file name starts with time.time_ns()),
    None for an empty queue."""
    times = []
    q = _dir(*_QUEUE)
    try:
        names = os.listdir(q)
    finally:
        os.close(q)
    for name in names:
        head = name.split("-", 1)[0]
        if not name.startswith(".") and head.isdigit():
            times.append(int(head) / 1e9)
        elif not name.startswith("."):
            return 0.0  # not ours to date: take it now (drain says what it is)
    return min(times, default=None)


def _lock_fd(name: str) -> int:
    """The lock file ``locks/NAME.lock``, opened (made if missing) as cachemgr.core.state
    opens its locks: never through a link; run as root, only a file of root's with one
    link."""
    d = _dir("locks")
    try:
        return safefs.open_file(d, f"{name}.lock", _shown("locks", f"{name}.lock"),
                                os.O_RDWR | os.O_CREAT | os.O_NONBLOCK)
    finally:
        os.close(d)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def worker_pending() -> bool:
    """True while a worker holds the pending lock (it will read the queue later)."""
    fd = _lock_fd("autoattach-pending")
    try:
        return not _try_lock(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------
# starting a worker


def systemd_booted() -> bool:
    """sd_booted(3): systemd is PID 1."""
    return os.path.isdir("/run/systemd/system")


def _worker_argv(policy: str, settle: float) -> list[str]:
    # the worker command of the face (cachemgr/cli/udev.py), named here, not imported
    return [sys.executable, "-m", "cachemgr.cli.udev", "worker", "--policy", policy,
            "--settle", str(settle)]


def spawn(policy: str, *, how: str = "auto", settle: float = SETTLE_S) -> str:
    """Start a worker without waiting for it; returns how ("systemd" or "fork")."""
    if how == "auto":
        import shutil

        how = "systemd" if systemd_booted() and shutil.which("systemd-run") else "fork"
    if how == "systemd":
        argv = ["systemd-run", "--no-block", "--quiet", "--collect",
                f"--unit=cachemgr-autoattach-{time.time_ns()}",
                "--description=cachemgr auto-attach (udev event)",
                "--property=DefaultDependencies=no"]
        for var in ("CACHEMGR_STATE_DIR", "CACHEMGR_SYSFS"):
            if os.environ.get(var):
                argv.append(f"--setenv={var}={os.environ[var]}")
        import subprocess

        r = subprocess.run([*argv, *_worker_argv(policy, settle)], capture_output=True,
                           text=True, timeout=10, stdin=subprocess.DEVNULL, check=False)
        if r.returncode == 0:
            return "systemd"
        _log().warning("systemd-run failed (%s); falling back to a forked worker",
                    r.stderr.strip() or r.returncode)
    _double_fork(policy, settle)
    return "fork"


def _double_fork(policy: str, settle: float) -> None:
    """A worker in its own session, reparented to init; the handler returns at once. Its
    log (``autoattach/worker.log``) is opened here, by the handler, never through a link:
    a refusal is the handler's."""
    d = _dir("autoattach")
    try:
        out = safefs.open_file(d, "worker.log", _shown("autoattach", "worker.log"),
                               os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    finally:
        os.close(d)
    try:
        pid = os.fork()
    except BaseException:
        os.close(out)
        raise
    if pid:
        os.close(out)
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, 1024)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        prioritise()
        rc = worker(policy, settle=settle)
    except BaseException:
        import traceback

        traceback.print_exc()
        rc = 1
    os._exit(rc)


# ---------------------------------------------------------------------------------------
# the worker


def worker(policy_path: str, *, settle: float = SETTLE_S, linger: float = LINGER_S,
           sysfs_root: str | None = None) -> int:
    """Drain the queue in batches, one reconcile pass per batch, one worker at a time.

    The worker holds the pending lock from its start to its end, so the handlers start no
    other worker while it lives: it takes the events queued during a pass after that pass,
    and waits ``linger`` seconds for more before it goes, with its modules imported (the
    other disk of a pair, a bcache device's own events). A batch is taken once its oldest
    event has waited ``settle`` seconds (the rest of a burst lands in it), counted from when
    that event was queued: the worker's start and imports are part of that wait. The run
    lock is held only during passes (the boot pass takes it too)."""
    started = time.time()
    setup_logging()
    imported: float | None = None
    while True:
        pending = _lock_fd("autoattach-pending")
        if not _try_lock(pending):
            os.close(pending)
            return 0  # another worker is pending: it will read what is queued
        try:
            if imported is None:
                _warm()
                imported = time.time()
            while _events_within(linger):
                _batches(policy_path, settle, sysfs_root,
                         {"worker": started, "imported": imported})
        finally:
            os.close(pending)
        # an event queued after the last look but before the unlock found the pending lock
        # held and started no worker: it is this worker's
        if oldest_queued() is None:
            return 0


def _events_within(linger: float) -> bool:
    """Whether an event is queued or comes within ``linger`` seconds (polled)."""
    deadline = time.time() + linger
    while oldest_queued() is None:
        if time.time() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def _batches(policy_path: str, settle: float, sysfs_root: str | None,
             stages: dict[str, float]) -> None:
    """Under the run lock, one pass per batch until the queue is empty."""
    run = _lock_fd("autoattach-run")
    fcntl.flock(run, fcntl.LOCK_EX)  # wait for the boot pass, if it is acting
    ready = time.time()  # run lock taken
    os.pwrite(run, f"pid {os.getpid()}\n".encode(), 0)
    try:
        while (oldest := oldest_queued()) is not None:
            time.sleep(max(0.0, min(settle, oldest + settle - time.time())))
            batch = drain()
            if batch:
                try:
                    _process(batch, policy_path, sysfs_root,
                             {**stages, "ready": ready, "drained": time.time()})
                except Exception:  # the worker goes on with the next batch
                    _log().exception("a pass over %d event(s) failed", len(batch))
            ready = time.time()  # the next batch: its events came during this pass
    finally:
        os.close(run)


def prioritise() -> None:
    """The worker process runs at nice WORKER_NICE: a hot-add is a burst of events that
    udevd's workers and their RUN programs handle on the same CPUs, and the worker's imports
    and pass are what the attachment waits for (on the one-CPU UML lab a cold worker's
    imports took 1.6 s at nice 0, 0.9 s at -5 and 0.5 s at -10 in such a burst,
    docs/benchmarks.md, "udev auto-attach latency"). Its CPU time is a fraction of a second
    per burst; the programs it runs (bcache-super-show, lvm2) inherit the nice, and with it
    a higher best-effort IO priority (ioprio_set(2)). Needs CAP_SYS_NICE (root's); without
    it the worker runs at its inherited nice."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, WORKER_NICE)
    except OSError:
        pass


def _warm() -> None:
    """Import what a pass needs (about 0.25 s of CPU on the UML lab: most of a pass) before
    the settle wait and the run lock, not after them."""
    import contextlib

    from cachemgr.ops import autoattach  # noqa: F401

    for name in ("pyudev", "blkid"):  # identity's udev database and superblock probes
        with contextlib.suppress(ImportError):
            __import__(name)


def _process(batch: list[dict[str, Any]], policy_path: str, sysfs_root: str | None,
             stages: dict[str, float]) -> None:
    from cachemgr.core.sysfs import DEFAULT_ROOT, Sysfs
    from cachemgr.ops import autoattach as autoattach_ops

    sysfs = Sysfs(sysfs_root or os.environ.get("CACHEMGR_SYSFS", DEFAULT_ROOT))
    autoattach_ops.event_pass(sysfs, policy_path, batch, stages)


# ---------------------------------------------------------------------------------------
# the handler


def handle_event(env: Mapping[str, str], policy: str | None, *, how: str = "auto") -> int:
    """udev-event: queue the event and make sure a worker will see it. Always fast."""
    path = resolve_policy(policy)
    # udevd gives RUN programs the device's properties as their whole environment: no PATH,
    # and make-bcache / bcache-super-show / wipefs live in /usr/sbin
    os.environ["PATH"] = os.environ.get("PATH") or SANE_PATH
    if not os.path.exists(path) and not safefs.any_dmcache_record():
        # no policy and no recorded dm-cache device: no auto-attach (69-bcache.rules still
        # registers bcache devices)
        return 0
    ev = event_from(env)
    if ev is None:
        return 0
    enqueue(ev)
    if not worker_pending():
        spawn(path, how=how)
    return 0


def failed(exc: Exception) -> int:
    """A udev RUN program: say why on stderr and to syslog, exit 1. udevd logs a RUN
    program's exit code at info level but its stderr at debug level only (udev/README.md),
    so without the syslog line an admin would see that it failed, not why."""
    from cachemgr.core.text import printable

    why = f"{type(exc).__name__}: {printable(exc, newlines=True)}"
    print(f"cachemgr udev: {why}", file=sys.stderr)
    try:
        setup_logging(stderr=False)
        if _log().handlers:  # else logging's last resort would print it on stderr again
            _log().error("the udev handler failed: %s", why)
    except Exception:  # the stderr line above is what is left
        pass
    return 1
