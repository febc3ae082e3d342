"""The live-migration guard: what cachemgr's libvirt qemu hook decides
(/etc/libvirt/hooks/qemu.d/cachemgr runs ``python -m cachemgr.cli.hook``; docs/admin-guide.md,
"Live migration over shared storage").

Where libvirt calls a hook (libvirt's hooks page, hooks.html, "QEMU guest migration"): a
live migration runs ``qemu NAME migrate begin -`` on the **destination** host only, at the
start of the incoming migration, with the domain XML on stdin and its stdout taken as a
replacement XML (empty: unchanged); a non-zero exit cancels the incoming migration, and
libvirt reports the exit status and the hook's stderr to whoever asked (``virsh migrate``
prints it). The source host runs no hook before a migration: only ``stopped end`` and
``release end`` once the guest has left. So this guard judges the disks as this host (the
destination) sees them: a disk that sits on a host-local cache (bcache, dm-cache, dm-
writecache, an LVM cache) over shared storage (:func:`cachemgr.backends.vms.shared_kind`) is
refused while that cache is in writeback or holds dirty data, with the command that makes it
safe. With the policy's ``guard_start`` the same check runs at ``prepare begin`` (a start),
which is where a VM starts writing into a host-local cache of shared storage on the host
that is later the source (procedures/policy.py, ``[migration]``).

Speed: libvirt waits for the hook. Every operation but ``migrate`` and ``prepare`` is passed
by the installed shell wrapper without starting Python. Here, :func:`disk_sources`,
:func:`devno` and :func:`may_be_cached` use the standard library only (this module's top
level imports nothing more than cachemgr.core.safexml and cachemgr.core.sysfs_lite): a VM
none of whose disks has a bcache or device-mapper device under it passes on them alone. Only
a VM with one reads the snapshot (:func:`hazards`), and only a hazard reads the policy.

Failing open or closed: a refused incoming migration leaves the VM running on the source,
unchanged, and can be retried; a migration let through over a dirty cache reads stale
blocks. So for ``migrate`` an error after a cached device was seen under a disk refuses
(exit 1, the error on stderr); a VM with no cached device under any disk is never held up.
For ``prepare`` (an optional guard) an error passes: a start is not refused for a fault of
cachemgr's own.
"""

from __future__ import annotations

import os
import stat
from xml.parsers import expat

from cachemgr.core import safexml, sysfs_lite

TYPE_CHECKING = False  # typing's import costs what the fast path saves; mypy reads it as True
if TYPE_CHECKING:
    import logging
    from collections.abc import Callable

    from cachemgr.backends.virsh import VirshSource
    from cachemgr.core.model import Snapshot
    from cachemgr.core.sysfs import Sysfs
    from cachemgr.procedures.kinds import Kind
    from cachemgr.procedures.policy import MigrationPolicy

# the qemu hook operations the guard looks at (every other one passes): an arrival, a start,
# and a departure (release: the VM has left; its caches are marked, never refused)
GUARDED = ("migrate", "prepare", "release")
# the kernel names of the devices a cache can be: bcache's, device-mapper's
_CACHE_PREFIXES = ("bcache", "dm-")


# ---------------------------------------------------------------------- the fast path


def disk_sources(xml: str) -> list[tuple[str, str]]:
    """(target, source path) of every disk (and lun) of a domain XML that has a host path: a
    ``block`` disk's ``dev``, a ``file`` disk's ``file``. A DOCTYPE or an entity declaration
    is refused (:class:`cachemgr.core.safexml.UnsafeXml`): the XML is data."""
    safexml.check(xml)
    out: list[tuple[str, str]] = []
    path: list[str] = []
    cur: dict[str, str] = {}

    def start(tag: str, attrs: dict[str, str]) -> None:
        path.append(tag)
        if path == ["domain", "devices", "disk"]:
            cur.clear()
            cur["type"] = attrs.get("type", "file")
            cur["device"] = attrs.get("device", "disk")
        elif path[:3] == ["domain", "devices", "disk"] and len(path) == 4:
            if tag == "source":
                src = attrs.get("dev") if cur.get("type") == "block" else attrs.get("file")
                if src and cur.get("type") in ("block", "file"):
                    cur["source"] = src
            elif tag == "target":
                cur["target"] = attrs.get("dev", "?")

    def end(_: str) -> None:
        if path == ["domain", "devices", "disk"] and cur.get("source") \
                and cur.get("device") in ("disk", "lun"):
            out.append((cur.get("target", "?"), cur["source"]))
        path.pop()

    p = expat.ParserCreate()
    p.StartElementHandler = start
    p.EndElementHandler = end
    p.Parse(xml, True)
    return out


def devno(path: str) -> str | None:
    """MAJ:MIN of a disk source on this host: a block device's own, a file's filesystem's;
    None when it is not here (libvirt then fails the migration itself)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    num = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
    return f"{os.major(num)}:{os.minor(num)}"


def may_be_cached(sys_root: str, num: str) -> bool:
    """Whether a bcache or device-mapper device is at or under the block device ``num``
    (MAJ:MIN; a partition counts as its disk): only those can be caches. Unreadable: True
    (the snapshot decides)."""
    try:
        return any(n.startswith(_CACHE_PREFIXES) for n in sysfs_lite.names_under(sys_root, num))
    except OSError:
        return True


def needs_a_look(xml: str, *, sys_root: str = sysfs_lite.ROOT,
                 devno_of: Callable[[str], str | None] = devno) -> bool:
    """The fast path: whether any disk of the domain may sit on a cache on this host."""
    for _, src in disk_sources(xml):
        num = devno_of(src)
        if num is not None and may_be_cached(sys_root, num):
            return True
    return False


# ------------------------------------------------------------------------ the full look


class Hazard:
    """A disk of the domain on a host-local cache over shared storage, and that cache's
    state now. (A plain class: dataclasses' import costs the fast path 50 ms.)"""

    __slots__ = ("can_invalidate", "can_writethrough", "dirty", "disk", "key", "mode", "node",
                 "shared", "shared_why", "source")

    def __init__(self, *, disk: str, source: str, node: str, mode: str | None,
                 dirty: int | None, shared: str, shared_why: str,
                 can_writethrough: bool, key: str | None = None,
                 can_invalidate: bool = False) -> None:
        self.disk = disk  # the disk's target (vda)
        self.source = source  # its source path in the domain XML
        self.node = node  # the cached device (/dev/bcache0, /dev/mapper/NAME)
        self.mode = mode  # its cache mode; None: unknown
        self.dirty = dirty  # its dirty bytes; None: unknown
        self.shared = shared  # the shared-storage device under it (/dev/dm-0)
        self.shared_why = shared_why  # what that is ("a multipath device")
        self.can_writethrough = can_writethrough  # `cachemgr mode NODE writethrough` exists
        self.key = key  # its records' key (procedures/coherence.py); None: not a known kind
        self.can_invalidate = can_invalidate  # its kind can drop its copies (`invalidate`)

    def __repr__(self) -> str:
        return f"Hazard({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"

    @property
    def unsafe(self) -> bool:
        """In writeback (or an unknown mode), or dirty (or dirty data unknown)."""
        return self.mode in (None, "writeback") or self.dirty != 0

    def words(self) -> str:
        from cachemgr.core.model import human

        mode = f"in {self.mode}" if self.mode else "in an unknown mode"
        dirty = ("dirty data unknown" if self.dirty is None else
                 "clean" if self.dirty == 0 else f"{human(self.dirty)} dirty")
        return (f"disk {self.disk} sits on {self.node}, a host-local cache over shared "
                f"storage ({self.shared}: {self.shared_why}), {mode}, {dirty}")

    def fix(self) -> str:
        if self.can_writethrough:
            return f"cachemgr mode {self.node} writethrough --drain"
        return f"cachemgr detach {self.node}"


class _StatOnly:
    """A VirshSource that only stats paths: a hook must never call back into libvirt (the
    daemon waits for it; libvirt's docs: a deadlock is likely)."""

    uri = "-"

    def available(self) -> str | None:
        return "a hook does not call libvirt"

    def output(self, *args: str) -> str:
        raise AssertionError("a libvirt hook must not call libvirt")

    def devno(self, path: str) -> tuple[str, bool] | None:
        from cachemgr.backends import virsh  # past the fast path: the full look

        return virsh.stat_devno(path)

    def domains(self) -> tuple[list[tuple[str, str, str]], list[str]]:
        raise AssertionError("a libvirt hook must not call libvirt")


def hazards(sysfs: Sysfs, xml: str, src: VirshSource | None = None,
            snap: Snapshot | None = None) -> list[Hazard]:
    """Every disk of the domain XML on a host-local cache over shared storage, as this
    host's snapshot (``snap``, or one taken now) sees it (hazardous or not:
    :attr:`Hazard.unsafe` says)."""
    from cachemgr.backends import snapshot as snapshot_mod
    from cachemgr.backends import vms as vms_mod
    from cachemgr.core.model import CacheMode
    from cachemgr.procedures import kinds

    source_of: VirshSource = src or _StatOnly()
    snap = snap or snapshot_mod.take(sysfs, stats=False)
    caches = vms_mod.cached_devices(snap)
    _, _, _, disks = vms_mod.parse_domain(xml)
    out: list[Hazard] = []
    for d in disks:
        source = d["source"]
        if d["source_type"] not in ("block", "file") or not isinstance(source, str):
            continue
        num = source_of.devno(source)
        name = vms_mod.block_name(sysfs, num[0]) if num else None
        if name is None:
            continue
        _, found = vms_mod.walk(sysfs, name, caches)
        for n in found:
            shared = vms_mod.shared_under(sysfs, n)
            if shared is None:
                continue
            node = caches[n][0]
            k = kinds.find(snap, node, sysfs, kinds.devices_only())
            mode = k.mode if k is not None else caches[n][1]
            out.append(Hazard(
                disk=str(d["target"]), source=source, node=node,
                mode=mode.value if mode else None,
                dirty=k.dirty_bytes if k is not None else None,
                shared=f"/dev/{shared[0]}", shared_why=shared[1],
                can_writethrough=k is not None and "mode" in k.actions
                and CacheMode.WRITETHROUGH in k.modes,
                key=k.locks[0][0] if k is not None else None,
                can_invalidate=k is not None and k.can("invalidate")))
    return out


def _make_safe(sysfs: Sysfs, nodes: list[str], timeout: int) -> list[str]:
    """``cachemgr mode NODE writethrough --drain`` for each, through the command layer and
    its gate (locks, journal trail) as the command runs it; what happened, in words."""
    from cachemgr.core.errors import AlreadyError, CacheMgrError
    from cachemgr.ops import cache as cache_ops
    from cachemgr.ops.control import Control

    said = []
    for node in nodes:
        try:
            try:
                cache_ops.mode(sysfs, node, "writethrough", drain=True, timeout=timeout,
                               ctl=Control(what=f"mode writethrough on {node}"))
            except AlreadyError:  # writethrough already: what is dirty is drained
                cache_ops.drain(sysfs, node, timeout=timeout,
                                ctl=Control(what=f"drain of {node}"))
            said.append(f"{node}: switched to writethrough and drained")
        except AlreadyError:
            said.append(f"{node}: writethrough and clean already")
        except CacheMgrError as exc:
            said.append(f"{node}: not made safe: {exc.message}")
    return said


def _drop_copies(sysfs: Sysfs, snap: Snapshot, found: list[Hazard], domain: str,
                what: str) -> list[str]:
    """``cachemgr invalidate NODE`` for each cache in ``found``, through the command layer
    and its gate (ops/coherence.py: journaled); what was done, in words. A cache whose copies
    could not be dropped refuses ``what`` (UnsafeError, exit 3): the VM would read them."""
    from cachemgr.core.errors import AlreadyError, CacheMgrError, UnsafeError
    from cachemgr.core.text import printable
    from cachemgr.ops import coherence as coherence_ops

    said: list[str] = []
    failed: list[tuple[str, str]] = []
    for node in dict.fromkeys(h.node for h in found):
        h = next(x for x in found if x.node == node)
        if not h.can_invalidate:
            failed.append((node, "cachemgr cannot drop this kind of cache's copies"))
            continue
        try:
            r = coherence_ops.invalidate(sysfs, node, snap=snap)
            said.append(r.lines[0] if r.lines else f"{node}: copies dropped")
        except AlreadyError as exc:
            said.append(exc.message)
        except CacheMgrError as exc:
            failed.append((node, exc.message))
    if failed:
        raise UnsafeError(
            f"refused {what} of domain '{printable(domain)}': "
            + "; ".join(f"the copies {n} holds could not be dropped ({why})" for n, why in failed)
            + ": the VM would read blocks older than its shared disk"
            + (f" ({'; '.join(said)})" if said else ""),
            hint=" && ".join(f"cachemgr invalidate {n} --yes" for n, _ in failed)
            + " (or cachemgr detach NODE) on this host")
    return said


def guard(sysfs: Sysfs, domain: str, op: str, xml: str, pol: MigrationPolicy, *,
          src: VirshSource | None = None, policy_problem: str | None = None,
          spawn: Callable[[list[str]], int] | None = None) -> list[str]:
    """Pass (what was done, in words: nothing, the caches made safe, their copies dropped)
    or refuse (:class:`UnsafeError`, exit 3) the operation ``op`` (migrate, prepare) of
    ``domain``. Passing an arrival (``migrate``; ``prepare`` with the policy's
    ``guard_start``, or over a cache marked as holding copies of a disk written elsewhere)
    first drops every copy the caches under the VM's shared disks hold
    (:func:`_drop_copies`): what the VM reads next is what the shared disk holds. With the
    policy's ``warm_after`` it then leaves a process running that warms them again
    (:func:`start_warm`; ``spawn``: how, for tests) and returns at once."""
    from cachemgr.backends import snapshot as snapshot_mod
    from cachemgr.core.errors import UnsafeError
    from cachemgr.core.text import printable

    snap = snapshot_mod.take(sysfs, stats=False)
    found = _looked_at(hazards(sysfs, xml, src, snap), op, pol)
    if not found:
        return []
    bad = [h for h in found if h.unsafe]
    done: list[str] = []
    if bad and pol.on_hazard == "writethrough":
        done = _make_safe(sysfs, list(dict.fromkeys(h.node for h in bad if h.can_writethrough)),
                          pol.drain_timeout)
        snap = snapshot_mod.take(sysfs, stats=False)
        found = _looked_at(hazards(sysfs, xml, src, snap), op, pol)
        bad = [h for h in found if h.unsafe]
    what = "the incoming migration" if op == "migrate" else "the start"
    if bad:
        msg = (f"refused {what} of domain '{printable(domain)}': "
               + "; ".join(h.words() for h in bad)
               + ": the VM would read stale blocks after a migration"
               + (f" ({'; '.join(done)})" if done else "")
               + (f" (the policy was not read: {policy_problem})" if policy_problem else ""))
        fixes = list(dict.fromkeys(h.fix() for h in bad))
        return_hint = ("on this host: " + " && ".join(fixes)
                       + (", and the same on the host the VM runs on now before it migrates"
                          if op == "migrate" else ""))
        raise UnsafeError(msg, hint=return_hint)
    done += _drop_copies(sysfs, snap, found, domain, what)
    if pol.warm_after:
        done += start_warm(domain, [h for h in found if h.key], pol.warm_traces, spawn=spawn)
    return done


def _looked_at(found: list[Hazard], op: str, pol: MigrationPolicy) -> list[Hazard]:
    """The caches an operation looks at: all of them on an arrival (``migrate``) and on a
    start with ``guard_start``; on a start without it only those marked as holding copies of
    a disk written elsewhere, or with an invalidation pending (procedures/coherence.py)."""
    from cachemgr.procedures import coherence

    if op == "migrate" or pol.guard_start:
        return found
    keys = {h.key for h in found if h.key}
    marked = {m.key for m in coherence.marked(keys)} if keys else set()
    return [h for h in found if h.key in marked]


def release(sysfs: Sysfs, domain: str, xml: str, src: VirshSource | None = None) -> list[str]:
    """The VM has left this host (libvirt's ``release``, after it stopped or migrated away):
    mark every host-local cache over its shared disks (procedures/coherence.py ``left``), so
    status and ``vms`` show a cache that may hold copies of a disk now written elsewhere;
    the next arrival or ``cachemgr invalidate`` clears the mark. What was marked, in words."""
    from cachemgr.core.errors import require_root
    from cachemgr.core.text import printable
    from cachemgr.procedures import coherence

    require_root("marking the caches of a VM that left")
    said = []
    for h in hazards(sysfs, xml, src):
        if h.key:
            coherence.left(h.key, h.node, domain, h.disk)
            said.append(f"{h.node}: marked: VM '{printable(domain)}' left; its disk {h.disk} "
                        "may be "
                        "written elsewhere")
            if stop_warm(h.key):
                said.append(f"{h.node}: the warm its arrival started was stopped")
    return said


def stop_warm(key: str) -> bool:
    """Stop the warm an arrival left running on ``key``'s device (SIGTERM: warm puts back
    what it set and its record says stopped), whether it was there. The VM left: what the
    warm would read next may be rewritten elsewhere, and its gate would refuse the next
    arrival's invalidation while it runs. The pid is signalled only while it is still that
    warm (its command line), never a process that took its number since."""
    import signal

    from cachemgr.procedures import coherence

    for w in coherence.warms():
        pid = w.data.get("pid")
        if w.key != key or w.state not in coherence.WARM_ACTIVE or not isinstance(pid, int):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return False
        if WARM_FLAG.encode() not in argv or b"cachemgr.cli.hook" not in argv:
            return False
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            return False
        return True
    return False


# --------------------------------------------------------------- the warm after an arrival
#
# Once an arrival has dropped a cache's copies the VM starts cold. With the policy's
# ``warm_after`` the hook leaves a process behind (:func:`start_warm`) and returns: libvirt
# waits for the hook, never for the warm. That process (:func:`warm_after`, run as
# ``python -m cachemgr.cli.hook --warm-after``) first waits until libvirt reports the domain
# running on this host: during an incoming live migration the VM still runs on the source
# host and writes the shared disk there, so a block read into this host's cache before the
# switch-over could be overwritten on the source a moment later and served stale here (the
# very hazard the invalidation removed). Then, per device, the newest trace in the policy's
# ``warm_traces`` directory that maps onto it (procedures/warm.py ``find_trace``) is read
# through the cache by ``cachemgr warm``'s own command (ops/warm.py: the gate, its undo
# journal, its pacing behind the VMs' IO). Each step is written to the device's warm record
# (procedures/coherence.py), which status and ``vms`` show; nothing it meets fails the
# arrival, which has passed already.

WARM_WAIT_S = 3600.0  # longest wait for the VM to run here (a long live migration)
WARM_POLL_S = 1.0  # how often libvirt is asked meanwhile
WARM_FLAG = "--warm-after"


def warm_argv(domain: str, nodes: list[str], traces: str) -> list[str]:
    """The detached process's command line (cli/hook.py ``main`` reads it)."""
    import sys

    return [sys.executable, "-m", "cachemgr.cli.hook", WARM_FLAG, "--traces", traces, "--",
            domain, *nodes]


def _spawn(argv: list[str]) -> int:
    """Start ``argv`` detached (its own session, no terminal, stdin/stdout/stderr on
    /dev/null: libvirt reads the hook's output until it closes, so an inherited pipe would
    make libvirt wait for the warm); its pid."""
    import subprocess

    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)
    return p.pid


def start_warm(domain: str, found: list[Hazard], traces: str, *,
               spawn: Callable[[list[str]], int] | None = None) -> list[str]:
    """Leave the warm of ``found``'s devices running (see above) and record it for each:
    waiting, with the process's pid. Never raises: a warm that cannot start is recorded and
    said, and the arrival goes on."""
    from cachemgr.core.text import printable

    devs = {h.node: h.key for h in found if h.key}
    if not devs:
        return []
    nodes = list(devs)
    try:
        pid = (spawn or _spawn)(warm_argv(domain, nodes, traces))
    except OSError as exc:
        for node, key in devs.items():
            _record(key, node, "failed", domain=domain,
                    words=f"the warm could not start: {exc}")
        return [f"{', '.join(nodes)}: the warm could not start ({exc}); the VM starts cold"]
    for node, key in devs.items():
        _record(key, node, "waiting", domain=domain, pid=pid, started=_now(),
                traces=traces, trace=None, ended=None, admitted_fraction=None,
                words=f"pid {pid}, traces in {traces}")
    return [f"{', '.join(nodes)}: warm started in the background (pid {pid}) from the "
            f"traces in {printable(traces)}, once VM '{printable(domain)}' runs here; "
            f"cachemgr status shows it"]


def _now() -> float:
    import time

    return time.time()


def _record(key: str, node: str, state_word: str, **extra: object) -> None:
    """Write a warm record, never raising (a full state directory costs the record only)."""
    from cachemgr.procedures import coherence as c

    try:
        c.warm_record(key, node, state_word, **extra)
    except Exception:  # the warm goes on without its record
        _log().warning("%s: the warm record could not be written", node)


def _log() -> logging.Logger:
    import logging

    return logging.getLogger("cachemgr.warm_after")


def wait_running(src: VirshSource, domain: str, *, timeout: float = WARM_WAIT_S,
                 poll: float = WARM_POLL_S, sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] | None = None) -> str:
    """Wait until libvirt reports ``domain`` running on this host: "running", or what it
    was when the wait ended (its last state, "not found", or why libvirt cannot be asked)."""
    import time

    from cachemgr.backends import virsh
    from cachemgr.core.errors import CacheMgrError

    sleep = sleep or time.sleep
    clock = clock or time.monotonic
    why = src.available()
    if why is not None:
        return f"libvirt cannot be asked ({why})"
    end = clock() + timeout
    last = "not found"
    uuid: str | None = None  # found once (a lookup by name reads every domain's XML)
    while True:
        try:
            uuid = uuid or virsh.find(src, domain)
            last = virsh.domstate(src, uuid)
        except CacheMgrError:
            uuid, last = None, "not found"
        if last == "running":
            return last
        if clock() >= end:
            return last
        sleep(poll)


def warm_after(sysfs: Sysfs, domain: str, nodes: list[str], traces: str, *,
               src: VirshSource | None = None, wait_s: float = WARM_WAIT_S,
               poll_s: float = WARM_POLL_S) -> int:
    """The detached warm (see above): 0 when every device was warmed, 1 otherwise; every
    outcome in the devices' warm records and the log."""
    from cachemgr.backends import snapshot as snapshot_mod
    from cachemgr.procedures import kinds

    log = _log()
    snap = snapshot_mod.take(sysfs, stats=False)
    devs: list[tuple[str, str, kinds.Kind | None]] = []
    for node in nodes:
        k = kinds.find(snap, node, sysfs, kinds.devices_only())
        devs.append((node, k.locks[0][0] if k is not None else node, k))
    for node, key, _ in devs:
        _record(key, node, "waiting", domain=domain)
    try:
        return _warm_after(sysfs, domain, devs, traces, src, wait_s, poll_s)
    except KeyboardInterrupt as exc:  # SIGTERM (stop_warm: the VM left) or SIGINT
        from cachemgr.procedures import coherence

        why = getattr(exc, "name", None) or "SIGINT"
        for node, key, _ in devs:
            w = next((x for x in coherence.warms() if x.key == key), None)
            if w is None or w.data.get("state") in coherence.WARM_ACTIVE:
                _record(key, node, "failed", ended=_now(),
                        words=f"stopped ({why}: the VM left this host, or the admin); "
                              "what the warm set was put back")
        log.warning("%s: warm stopped (%s)", ", ".join(n for n, _, _ in devs), why)
        return 1


def _warm_after(sysfs: Sysfs, domain: str, devs: list[tuple[str, str, Kind | None]],
                traces: str, src: VirshSource | None, wait_s: float, poll_s: float) -> int:
    """:func:`warm_after` once the records say waiting."""
    from cachemgr.backends import virsh
    from cachemgr.core.errors import CacheMgrError
    from cachemgr.core.text import printable
    from cachemgr.ops import warm as warm_ops
    from cachemgr.ops.control import Control
    from cachemgr.procedures import warm as warm_mod

    log = _log()
    state_now = wait_running(src or virsh.live_source(), domain, timeout=wait_s, poll=poll_s)
    if state_now != "running":
        words = (f"VM '{printable(domain)}' did not run here ({state_now}): nothing read "
                 "(a warm before it runs here could cache blocks its source host still writes)")
        for node, key, _ in devs:
            _record(key, node, "skipped", ended=_now(), words=words)
            log.warning("%s: warm not run: %s", node, words)
        return 1
    ok = True
    for node, key, k in devs:
        if k is None:
            _record(key, node, "skipped", ended=_now(),
                    words="no longer a cached device here")
            ok = False
            continue
        path, why = warm_mod.find_trace(sysfs, k, traces)
        if path is None:
            words = (f"no trace in {traces} maps onto {node}"
                     + (f" ({'; '.join(why[:3])})" if why else "")
                     + f": record one with cachemgr trace {node} --rate 1 -o "
                       f"{traces}/NAME.trace")
            _record(key, node, "skipped", ended=_now(), words=words)
            log.warning("%s", words)
            ok = False
            continue
        _record(key, node, "running", trace=path, words=f"from {path}")
        try:
            r = warm_ops.warm(sysfs, node, path, ctl=Control(what=f"warm {node}"))
        except CacheMgrError as exc:
            words = exc.message + (f" (next: {exc.hint})" if exc.hint else "")
            _record(key, node, "failed", ended=_now(), words=words)
            log.warning("%s: warm failed: %s", node, words)
            ok = False
            continue
        except Exception as exc:  # recorded; the next device is warmed
            _record(key, node, "failed", ended=_now(),
                    words=f"{type(exc).__name__}: {exc}")
            log.exception("%s: warm failed", node)
            ok = False
            continue
        doc = r.data or {}
        ad = doc.get("admitted") if isinstance(doc, dict) else None
        frac = ad.get("fraction") if isinstance(ad, dict) else None
        words = r.lines[0] if r.lines else "warmed"
        _record(key, node, "failed" if r.failed else "done", ended=_now(),
                words=words, admitted_fraction=frac, seconds=doc.get("seconds"))
        log.info("%s", words)
        ok = ok and not r.failed
    return 0 if ok else 1
