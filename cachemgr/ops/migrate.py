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
    from collections.abc import Callable

    from cachemgr.backends.virsh import VirshSource
    from cachemgr.core.model import Snapshot
    from cachemgr.core.sysfs import Sysfs
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
          src: VirshSource | None = None, policy_problem: str | None = None) -> list[str]:
    """Pass (what was done, in words: nothing, the caches made safe, their copies dropped)
    or refuse (:class:`UnsafeError`, exit 3) the operation ``op`` (migrate, prepare) of
    ``domain``. Passing an arrival (``migrate``; ``prepare`` with the policy's
    ``guard_start``, or over a cache marked as holding copies of a disk written elsewhere)
    first drops every copy the caches under the VM's shared disks hold
    (:func:`_drop_copies`): what the VM reads next is what the shared disk holds."""
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
    return done + _drop_copies(sysfs, snap, found, domain, what)


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
    return said
