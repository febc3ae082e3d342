"""libvirt through its Python binding (cachemgr/backends/virsh.py, LibvirtApi), against
libvirt's own test driver (``test:///default``: a daemonless connection inside this process,
one running domain ``test`` to begin with, shared by every connection to it here)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import snapshot, virsh, vms
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.sysfs import Sysfs

lv: Any = pytest.importorskip("libvirt")
URI = "test:///default"
WAIT = 60.0  # for libvirt's event thread to pass an event on (a bound, not a measurement)


def domain_xml(name: str, cache: str, dev: str = "/dev/bcache0", uuid: str = "") -> str:
    u = f"<uuid>{uuid}</uuid>" if uuid else ""
    return (f"<domain type='test'><name>{name}</name>{u}<memory unit='MiB'>64</memory>"
            "<os><type arch='i686'>hvm</type></os><devices>"
            f"<disk type='block' device='disk'><driver name='qemu' cache='{cache}'/>"
            f"<source dev='{dev}'/><target dev='vda' bus='virtio'/></disk>"
            "</devices></domain>")


@pytest.fixture
def rw() -> Iterator[Any]:
    """A read-write connection to the test driver (the owner's side: define, start...),
    with the domains this test defined taken away after it."""
    conn = lv.open(URI)
    before = {d.UUIDString() for d in conn.listAllDomains(0)}
    yield conn
    for d in conn.listAllDomains(0):
        if d.UUIDString() not in before:
            if d.isActive():
                d.destroy()
            d.undefine()
    conn.close()


class Asked:
    """How often each domain's XML was asked for (virDomain.XMLDesc, counted)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        real = lv.virDomain.XMLDesc

        def counted(dom: Any, flags: int = 0) -> str:
            self.names.append(dom.name())
            return str(real(dom, flags))

        monkeypatch.setattr(lv.virDomain, "XMLDesc", counted)

    def take(self) -> list[str]:
        out, self.names = sorted(self.names), []
        return out


def _by_name(src: virsh.LibvirtApi) -> dict[str, tuple[str, str]]:
    listing, warnings = src.domains()
    assert warnings == []
    return {vms.parse_domain(xml)[0]: (xml, state) for _, xml, state in listing}


def _await_event(src: virsh.LibvirtApi, uuid: str) -> None:
    conn = src._connection()
    done = threading.Event()
    for _ in range(int(WAIT / 0.05)):
        with conn.lock:
            if uuid in conn.stale:
                return
        done.wait(0.05)
    raise AssertionError(f"no libvirt event for {uuid} within {WAIT} s")


def test_the_binding_lists_domains_with_their_xml_and_virsh_words(
        monkeypatch: pytest.MonkeyPatch, rw: Any) -> None:
    src = virsh.LibvirtApi(lv, URI)
    assert src.available() is None
    by = _by_name(src)
    assert by["test"][1] == "running"
    assert "<name>test</name>" in by["test"][0]
    rw.lookupByName("test").suspend()
    try:
        assert _by_name(src)["test"][1] == "paused"
    finally:
        rw.lookupByName("test").resume()
    assert virsh.STATES[lv.VIR_DOMAIN_SHUTOFF] == "shut off"


def test_xml_is_asked_again_only_for_what_changed(monkeypatch: pytest.MonkeyPatch,
                                                   rw: Any) -> None:
    src = virsh.LibvirtApi(lv, URI)
    asked = Asked(monkeypatch)
    _by_name(src)
    # a new domain: its XML asked (the event of its definition waited for first: libvirt's
    # thread passes events on when it runs; another test's domain may get a late one)
    dom = rw.defineXML(domain_xml("vm-a", "writeback"))
    _await_event(src, dom.UUIDString())
    by = _by_name(src)
    assert "vm-a" in asked.take()
    assert by["vm-a"][1] == "shut off" and "cache='writeback'" in by["vm-a"][0]
    # nothing changed: the listing only, its XML not asked again
    assert "vm-a" in _by_name(src)
    assert "vm-a" not in asked.take()
    # its definition changed, state the same: libvirt's event says so, the XML is asked again
    rw.defineXML(domain_xml("vm-a", "none", uuid=dom.UUIDString()))
    _await_event(src, dom.UUIDString())
    by = _by_name(src)
    assert "vm-a" in asked.take() and "cache='none'" in by["vm-a"][0]
    # started: a new ID and state, asked again (with or without the event)
    dom.create()
    by = _by_name(src)
    assert "vm-a" in asked.take() and by["vm-a"][1] == "running"
    assert vms.parse_domain(by["vm-a"][0])[2] is not None  # the running domain's ID
    # gone: no longer listed
    dom.destroy()
    dom.undefine()
    assert "vm-a" not in _by_name(src)


def test_a_domain_name_stays_data(rw: Any) -> None:
    """A name that looks like an option, or markup, comes back as it is."""
    name = "--help [b]x[b]"
    rw.defineXML(domain_xml(name, "none"))
    assert name in _by_name(virsh.LibvirtApi(lv, URI))


def test_the_scan_through_the_binding(rw: Any) -> None:
    """vms.scan with the binding's source on a captured sysfs: the domains are there, their
    disks followed where the sources exist (here none: the test driver's paths)."""
    capture = Path(__file__).resolve().parents[1] / "fixtures" / "vms-uml" / "sys"
    sysfs = Sysfs(capture)
    rw.defineXML(domain_xml("vm-b", "unsafe", "/nonexistent/disk"))
    scan = vms.scan(sysfs, snapshot.take(sysfs), virsh.LibvirtApi(lv, URI))
    by = {v.name: v for v in scan.vms}
    assert scan.warnings == ()
    assert by["vm-b"].state == "shut off" and by["vm-b"].disks[0].cache == "unsafe"
    assert by["vm-b"].disks[0].unresolved == "/nonexistent/disk cannot be read here"
    assert any("ignores the guest's flushes" in w for w in by["vm-b"].disks[0].warnings)


def test_a_connection_that_fails_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    src = virsh.LibvirtApi(lv, "test:///nonexistent-file.xml")
    why = src.available()
    assert why is not None and why.startswith("libvirt: ")
    with pytest.raises(CacheMgrError):
        src.domains()


def test_the_source_is_the_binding_unless_missing_or_virsh_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(virsh.PATH_ENV, raising=False)
    assert isinstance(virsh.live_source(URI), virsh.LibvirtApi)
    monkeypatch.setenv(virsh.PATH_ENV, "virsh")
    s = virsh.live_source(URI)
    assert isinstance(s, virsh.LiveVirsh) and not isinstance(s, virsh.LibvirtApi)
    monkeypatch.delenv(virsh.PATH_ENV)
    monkeypatch.setitem(__import__("sys").modules, "libvirt", None)  # not installed
    s = virsh.live_source(URI)
    assert isinstance(s, virsh.LiveVirsh) and not isinstance(s, virsh.LibvirtApi)


def test_without_the_daemons_socket_the_binding_is_imported_only_when_asked(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """qemu:///system with no socket (no daemon to ask: status on a host without libvirtd):
    the binding is not imported for status's look, only when something asks libvirt."""
    import sys

    monkeypatch.delenv(virsh.PATH_ENV, raising=False)
    monkeypatch.delenv(virsh.URI_ENV, raising=False)
    monkeypatch.setattr(virsh, "SYSTEM_SOCKETS", (str(tmp_path / "libvirt-sock"),))
    monkeypatch.delitem(sys.modules, "libvirt")
    src = virsh.live_source()
    assert isinstance(src, virsh.LibvirtApi)
    assert src.available() == "libvirt's daemon is not running (no socket under /run/libvirt)"
    assert "libvirt" not in sys.modules
    assert src.lv.virConnect is not None and "libvirt" in sys.modules
    # with the socket there, the binding is imported at once, as before
    (tmp_path / "libvirt-sock").touch()
    monkeypatch.delitem(sys.modules, "libvirt")
    virsh.live_source()
    assert "libvirt" in sys.modules
