"""libvirt: the one wrapper for it, through its Python binding (``libvirt``) or ``virsh``.

Read: the domains of a connection (``list --all --uuid``), each one's XML (``dumpxml``, the
live definition while it runs; ``--inactive`` the persistent one) and state (``domstate``).
Write: ``define`` of a changed persistent definition (the libvirt API call behind ``virsh
edit``: the daemon validates and stores it; cachemgr never edits the files under
/etc/libvirt). Domains are named to virsh by UUID, never by name: a name is the owner's
text and could start with ``-`` or hold anything else.

A :class:`VirshSource` answers the read calls: :class:`LibvirtApi` asks the daemon through
the binding (issue #34: no process per domain; one call lists every domain with its state,
each XML is kept and asked again only when libvirt said the domain changed); where the
binding is missing (or ``CACHEMGR_LIBVIRT=virsh``) :class:`LiveVirsh` runs virsh, 1 + 2N
processes for N domains; beside a captured /sys tree :class:`CapturedVirsh` replays what
``cachemgr capture`` recorded (``libvirt/`` in the capture: the outputs, and the device numbers
of the disk sources). Writing (``define``) and capturing go through virsh.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import stat
import tempfile
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Protocol

from cachemgr.core import runner, safexml
from cachemgr.core.errors import CacheMgrError, CommandError, UsageError
from cachemgr.core.sysfs import Sysfs

DEFAULT_URI = "qemu:///system"
URI_ENV = "CACHEMGR_LIBVIRT_URI"
# "virsh": read through virsh even where the binding is installed (comparisons, a suspect
# binding); anything else, or unset: the binding when it imports
PATH_ENV = "CACHEMGR_LIBVIRT"
# qemu:///system's socket (libvirtd, or virtqemud's with the modular daemons); without it
# there is no daemon to ask and status does not spend a virsh call finding that out
SYSTEM_SOCKETS = ("/run/libvirt/libvirt-sock", "/run/libvirt/virtqemud-sock")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def default_uri() -> str:
    return os.environ.get(URI_ENV) or DEFAULT_URI


def check_uri(uri: str) -> str:
    """``uri`` if it can be handed to virsh as one argument (no option, no control char)."""
    if not uri or uri.startswith("-") or any(ord(c) < 32 or c == "\x7f" for c in uri):
        raise UsageError(f"not a libvirt connection URI: {uri!r}",
                         hint="e.g. qemu:///system (the default) or qemu+ssh://host/system")
    return uri


class VirshSource(Protocol):
    uri: str

    def available(self) -> str | None:
        """None when the daemon can be asked; else why not."""

    def output(self, *args: str) -> str:
        """The stdout of ``virsh -c URI ARGS`` (CommandError when it fails)."""

    def devno(self, path: str) -> tuple[str, bool] | None:
        """``(major:minor, is_block)`` of a disk source: a block device's own number, a
        file's filesystem's device; None when it cannot be stat'ed."""

    def domains(self) -> tuple[list[tuple[str, str, str]], list[str]]:
        """``(uuid, XML, state)`` of every domain, and a warning for each that went away
        between the listing and the question (CacheMgrError when the listing fails)."""


def stat_devno(path: str) -> tuple[str, bool] | None:
    """:meth:`VirshSource.devno` on this host: ``(major:minor, is_block)`` of a disk source,
    a block device's own number, a file's filesystem's device; None when it cannot be
    stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISBLK(st.st_mode):
        return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}", True
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", False


class LiveVirsh:
    def __init__(self, uri: str | None = None) -> None:
        self.uri = check_uri(uri or default_uri())

    def available(self) -> str | None:
        import shutil

        if shutil.which("virsh") is None:
            return "virsh is not installed (Debian: libvirt-clients)"
        if self.uri == DEFAULT_URI and not _daemon_socket():
            return "libvirt's daemon is not running (no socket under /run/libvirt)"
        return None

    def output(self, *args: str) -> str:
        return runner.run(["virsh", "-q", "-c", self.uri, *args], timeout=30).stdout

    def devno(self, path: str) -> tuple[str, bool] | None:
        return stat_devno(path)

    def domains(self) -> tuple[list[tuple[str, str, str]], list[str]]:
        return domains_by_output(self)


class CapturedVirsh:
    """What ``cachemgr capture`` recorded of libvirt: ``libvirt/calls.json`` maps each virsh
    argument list (joined by spaces) to its output, ``libvirt/devno.json`` each disk source
    to ``[major:minor, is_block]``."""

    def __init__(self, capture_dir: Path, uri: str | None = None) -> None:
        self.dir = capture_dir / "libvirt"
        self.uri = uri or DEFAULT_URI

    def _load(self, name: str) -> dict[str, object]:
        try:
            data = json.loads((self.dir / name).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def available(self) -> str | None:
        return None if (self.dir / "calls.json").is_file() else "no libvirt in this capture"

    def output(self, *args: str) -> str:
        out = self._load("calls.json").get(" ".join(args))
        if not isinstance(out, str):
            raise CommandError(["virsh", *args], 1, "", reason="not in the capture")
        return out

    def devno(self, path: str) -> tuple[str, bool] | None:
        v = self._load("devno.json").get(path)
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str):
            return v[0], bool(v[1])
        return None

    def domains(self) -> tuple[list[tuple[str, str, str]], list[str]]:
        return domains_by_output(self)


# ------------------------------------------------------------------ through the binding

# virsh domstate's words for virDomainState (virsh-domain-monitor.c, virshDomainStateToString)
STATES = ("no state", "running", "idle", "paused", "in shutdown", "shut off", "crashed",
          "pmsuspended")


def _binding_wanted() -> bool:
    return os.environ.get(PATH_ENV) != "virsh"


def _daemon_socket() -> bool:
    """Whether qemu:///system's daemon has its socket (it may still not answer)."""
    return any(os.path.exists(s) for s in SYSTEM_SOCKETS)


def _binding() -> Any:
    """The ``libvirt`` module, or None where it is not installed (or not wanted)."""
    if not _binding_wanted():
        return None
    try:
        import libvirt
    except ImportError:
        return None
    return libvirt


class _Connection:
    """A read-only connection kept for the life of the process, with each domain's last
    XML. libvirt's events (a thread runs its default event loop) mark a domain to be asked
    again: defined, undefined, started, stopped, a device added or removed, a block job
    (a copy's pivot changes a disk's source), a disk's media changed. A domain whose ID or
    state differ from the listing's last is asked again whatever the events said, and so is
    every domain when the events could not be had."""

    def __init__(self, lv: Any, uri: str) -> None:
        self.lv = lv
        self.uri = uri
        self.lock = threading.Lock()  # the events' marks
        self.asking = threading.Lock()
        self.stale: set[str] = set()
        self.all_stale = True
        self.closed = False
        self.xml: dict[str, tuple[int, int, str]] = {}  # uuid -> (ID, state, XML)
        self.events = _start_events(lv)
        self.conn = lv.openReadOnly(uri)
        self.conn.registerCloseCallback(self._closed, None)
        if self.events:
            ids = [getattr(lv, n) for n in (
                "VIR_DOMAIN_EVENT_ID_LIFECYCLE", "VIR_DOMAIN_EVENT_ID_DEVICE_ADDED",
                "VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED", "VIR_DOMAIN_EVENT_ID_BLOCK_JOB_2",
                "VIR_DOMAIN_EVENT_ID_DISK_CHANGE") if hasattr(lv, n)]
            try:
                for i in ids:
                    self.conn.domainEventRegisterAny(None, i, self._changed, None)
            except lv.libvirtError:
                self.events = False

    def _changed(self, conn: Any, dom: Any, *rest: Any) -> None:
        with self.lock:
            try:
                self.stale.add(dom.UUIDString())
            except Exception:  # never raise into libvirt's loop
                self.all_stale = True

    def _closed(self, conn: Any, reason: int, opaque: Any) -> None:
        self.closed = True

    def domains(self) -> tuple[list[tuple[str, str, str]], list[str]]:
        with self.asking:  # the listener's scrapes may come at once: one asks at a time
            return self._domains()

    def _domains(self) -> tuple[list[tuple[str, str, str]], list[str]]:
        lv = self.lv
        try:
            listing = [(d, int(st.get("state.state", 0)))
                       for d, st in self.conn.getAllDomainStats(lv.VIR_DOMAIN_STATS_STATE)]
        except lv.libvirtError:  # a daemon without the call: one state() per domain
            listing = [(d, d.state()[0]) for d in self.conn.listAllDomains(0)]
        with self.lock:
            stale, self.stale = self.stale, set()
            everything = self.all_stale or not self.events
            self.all_stale = False
        out: list[tuple[str, str, str]] = []
        warnings: list[str] = []
        seen: dict[str, tuple[int, int, str]] = {}
        for d, state in listing:
            uuid = d.UUIDString()
            dom_id = d.ID()
            had = self.xml.get(uuid)
            if everything or uuid in stale or had is None or had[:2] != (dom_id, state):
                try:
                    xml = d.XMLDesc(0)
                except lv.libvirtError as exc:  # undefined between the listing and now
                    warnings.append(f"VM {uuid}: {exc.get_error_message()}")
                    continue
            else:
                xml = had[2]
            seen[uuid] = (dom_id, state, xml)
            name = STATES[state] if 0 <= state < len(STATES) else f"state {state}"
            out.append((uuid, xml, name))
        self.xml = seen
        return out, warnings


_EVENTS: list[bool] = []  # [started] once the event loop thread runs (once per process)
_CONNECTIONS: dict[str, _Connection] = {}
_CONNECTING = threading.Lock()


def _start_events(lv: Any) -> bool:
    """libvirt's default event loop in a daemon thread, registered before the first
    connection (its rule); False when it cannot be had."""
    if not _EVENTS:
        try:
            lv.virEventRegisterDefaultImpl()
        except Exception:  # no events: every XML asked on every scan
            _EVENTS.append(False)
            return False

        def loop() -> None:
            while True:
                lv.virEventRunDefaultImpl()

        threading.Thread(target=loop, name="libvirt-events", daemon=True).start()
        _EVENTS.append(True)
    return _EVENTS[0]


class LibvirtApi(LiveVirsh):
    """libvirt's daemon through the binding: :meth:`domains` without a process; the
    connection and the domains' XML are kept per URI across sources (the listener, the TUI
    and status --watch scan again and again). virsh's ``output`` stays for the callers that
    name a domain (find) and for writing."""

    def __init__(self, lv: Any, uri: str | None = None) -> None:
        super().__init__(uri)
        self._lv = lv

    @property
    def lv(self) -> Any:
        """The ``libvirt`` module; :func:`live_source` leaves it to be imported here, on
        first use, where qemu:///system has no socket yet (its import is 0.1-0.2 s of a
        command's start in the UML lab, where status never needs it: :meth:`available`
        says "not running" from the socket alone)."""
        if self._lv is None:
            import libvirt

            self._lv = libvirt
        return self._lv

    def available(self) -> str | None:
        if self.uri == DEFAULT_URI and not _daemon_socket():
            return "libvirt's daemon is not running (no socket under /run/libvirt)"
        try:
            self._connection()
        except self.lv.libvirtError as exc:
            return f"libvirt: {exc.get_error_message()}"
        return None

    def _connection(self) -> _Connection:
        with _CONNECTING:
            c = _CONNECTIONS.get(self.uri)
            if c is not None and c.closed:
                _CONNECTIONS.pop(self.uri, None)
                try:
                    c.conn.close()
                except self.lv.libvirtError:
                    pass
                c = None
            if c is None:
                c = _CONNECTIONS[self.uri] = _Connection(self.lv, self.uri)
            return c

    def domains(self) -> tuple[list[tuple[str, str, str]], list[str]]:
        try:
            c = self._connection()
            return c.domains()
        except self.lv.libvirtError as exc:
            with _CONNECTING:  # asked afresh next time
                _CONNECTIONS.pop(self.uri, None)
            raise CacheMgrError(exc.get_error_message()) from None


def live_source(uri: str | None = None) -> VirshSource:
    """The binding where it imports, else virsh. While qemu:///system has no socket (no
    daemon to ask) the binding is only looked for, not imported: :class:`LibvirtApi` imports
    it when first asked beyond :meth:`LibvirtApi.available`."""
    src = LiveVirsh(uri)
    if src.uri == DEFAULT_URI and not _daemon_socket() and _binding_wanted() \
            and importlib.util.find_spec("libvirt") is not None:
        return LibvirtApi(None, src.uri)
    lv = _binding()
    return LibvirtApi(lv, uri) if lv is not None else src


def default_source(sysfs: Sysfs, uri: str | None = None) -> VirshSource:
    """libvirt itself on the live system (:func:`live_source`); the capture's recording
    beside a captured tree."""
    return live_source(uri) if sysfs.live else CapturedVirsh(sysfs.root.parent, uri)


# ------------------------------------------------------------------------------- reading


def domain_uuids(src: VirshSource) -> list[str]:
    """Every domain of the connection, running or only defined."""
    out = src.output("list", "--all", "--uuid")
    return [u for u in (line.strip() for line in out.splitlines()) if _UUID.match(u)]


def domains_by_output(src: VirshSource) -> tuple[list[tuple[str, str, str]], list[str]]:
    """:meth:`VirshSource.domains` through virsh's outputs: the listing, then each domain's
    XML and state (a process each on the live system)."""
    out: list[tuple[str, str, str]] = []
    warnings: list[str] = []
    for u in domain_uuids(src):
        try:
            out.append((u, dumpxml(src, u), domstate(src, u)))
        except CacheMgrError as exc:  # undefined between the listing and now
            warnings.append(f"VM {u}: {exc.message}")
    return out, warnings


def domain_xml(text: str) -> ET.Element:
    """A domain XML, parsed as data: a DOCTYPE or an entity declaration is refused first
    (core/safexml.py), so no entity is ever expanded."""
    try:
        safexml.check(text)
        return ET.fromstring(text)
    except (ET.ParseError, safexml.UnsafeXml) as exc:
        raise CacheMgrError(f"a domain XML that cachemgr does not read: {exc}") from None


def domain_name(xml: str) -> str | None:
    return domain_xml(xml).findtext("name")


def dumpxml(src: VirshSource, uuid: str, *, inactive: bool = False) -> str:
    return src.output("dumpxml", *(["--inactive"] if inactive else []), _checked(uuid))


def domstate(src: VirshSource, uuid: str) -> str:
    return src.output("domstate", _checked(uuid)).strip()


def find(src: VirshSource, spec: str) -> str:
    """The UUID of the domain ``spec`` names (its name or UUID); exit 2 if none does."""
    uuids = domain_uuids(src)
    if spec.lower() in uuids:
        return spec.lower()
    for u in uuids:
        if domain_name(dumpxml(src, u, inactive=True)) == spec:
            return u
    raise UsageError(f"no libvirt domain {spec!r} on {src.uri}",
                     hint="cachemgr vms lists the domains")


# ------------------------------------------------------------------------------- writing


def define(uri: str, xml: str) -> None:
    """Store ``xml`` as a domain's persistent definition (``virsh define``): libvirt checks
    it and keeps its own copy; the temporary file is the caller's only."""
    with tempfile.NamedTemporaryFile("w", prefix="cachemgr-domain-", suffix=".xml") as f:
        f.write(xml)
        f.flush()
        runner.run(["virsh", "-q", "-c", check_uri(uri), "define", f.name], timeout=60)


def _checked(uuid: str) -> str:
    if not _UUID.match(uuid):
        raise UsageError(f"not a domain UUID: {uuid!r}")
    return uuid
