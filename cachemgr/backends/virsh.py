"""libvirt through ``virsh``: the one wrapper for it.

Read: the domains of a connection (``list --all --uuid``), each one's XML (``dumpxml``, the
live definition while it runs; ``--inactive`` the persistent one) and state (``domstate``).
Write: ``define`` of a changed persistent definition (the libvirt API call behind ``virsh
edit``: the daemon validates and stores it; cachemgr never edits the files under
/etc/libvirt). Domains are named to virsh by UUID, never by name: a name is the owner's
text and could start with ``-`` or hold anything else.

A :class:`VirshSource` answers the read calls: :class:`LiveVirsh` runs virsh; beside a
captured /sys tree :class:`CapturedVirsh` replays what ``cachemgr capture`` recorded
(``libvirt/`` in the capture: the outputs, and the device numbers of the disk sources).
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Protocol

from cachemgr.core import runner
from cachemgr.core.errors import CommandError, UsageError
from cachemgr.core.sysfs import Sysfs

DEFAULT_URI = "qemu:///system"
URI_ENV = "CACHEMGR_LIBVIRT_URI"
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


class LiveVirsh:
    def __init__(self, uri: str | None = None) -> None:
        self.uri = check_uri(uri or default_uri())

    def available(self) -> str | None:
        import shutil

        if shutil.which("virsh") is None:
            return "virsh is not installed (Debian: libvirt-clients)"
        if self.uri == DEFAULT_URI and not any(os.path.exists(s) for s in SYSTEM_SOCKETS):
            return "libvirt's daemon is not running (no socket under /run/libvirt)"
        return None

    def output(self, *args: str) -> str:
        return runner.run(["virsh", "-q", "-c", self.uri, *args], timeout=30).stdout

    def devno(self, path: str) -> tuple[str, bool] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if stat.S_ISBLK(st.st_mode):
            return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}", True
        return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", False


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


def default_source(sysfs: Sysfs, uri: str | None = None) -> VirshSource:
    """virsh itself on the live system; the capture's recording beside a captured tree."""
    return LiveVirsh(uri) if sysfs.live else CapturedVirsh(sysfs.root.parent, uri)


# ------------------------------------------------------------------------------- reading


def domain_uuids(src: VirshSource) -> list[str]:
    """Every domain of the connection, running or only defined."""
    out = src.output("list", "--all", "--uuid")
    return [u for u in (line.strip() for line in out.splitlines()) if _UUID.match(u)]


def dumpxml(src: VirshSource, uuid: str, *, inactive: bool = False) -> str:
    return src.output("dumpxml", *(["--inactive"] if inactive else []), _checked(uuid))


def domstate(src: VirshSource, uuid: str) -> str:
    return src.output("domstate", _checked(uuid)).strip()


def find(src: VirshSource, spec: str) -> str:
    """The UUID of the domain ``spec`` names (its name or UUID); exit 2 if none does."""
    uuids = domain_uuids(src)
    if spec.lower() in uuids:
        return spec.lower()
    from cachemgr.backends import vms  # the XML parser

    for u in uuids:
        if vms.domain_name(dumpxml(src, u, inactive=True)) == spec:
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


# ------------------------------------------------------------------------------ capture


def record(out: Path, sysfs: Sysfs, uri: str | None = None) -> None:
    """What :class:`CapturedVirsh` replays, written under ``out`` (a capture directory):
    the virsh outputs a VM scan asks for, the device numbers of the disk sources, the
    scopes' io.pressure / io.stat under machine.slice and the host's /proc/pressure/io and
    /proc/stat. Nothing when libvirt cannot be asked."""
    from cachemgr.backends import snapshot, vms

    live = LiveVirsh(uri)
    if live.available() is not None:
        return
    calls: dict[str, str] = {}
    devnos: dict[str, list[object]] = {}

    class Recording:
        def __init__(self) -> None:
            self.uri = live.uri

        def available(self) -> str | None:
            return None

        def output(self, *args: str) -> str:
            calls[" ".join(args)] = text = live.output(*args)
            return text

        def devno(self, path: str) -> tuple[str, bool] | None:
            num = live.devno(path)
            if num is not None:
                devnos[path] = [num[0], num[1]]
            return num

    vms.scan(sysfs, snapshot.take(sysfs), Recording())
    (out / "libvirt").mkdir(parents=True, exist_ok=True)
    (out / "libvirt" / "calls.json").write_text(json.dumps(calls, indent=1) + "\n")
    (out / "libvirt" / "devno.json").write_text(json.dumps(devnos, indent=1) + "\n")
    for scope in sysfs.listdir(vms.MACHINE_SLICE):
        for f in ("io.pressure", "io.stat"):
            text = sysfs.read_opt(f"{vms.MACHINE_SLICE}/{scope}/{f}")
            if text is not None:
                dst = out / "sys" / vms.MACHINE_SLICE / scope / f
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text(text + "\n")
    for path in (vms.PROC_PRESSURE_IO, vms.PROC_STAT):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        dst = out / path.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text)
