"""Fetching the lab kernels (set-up time only).

Two kernels, neither installed on the host (nothing under /etc/apt or dpkg's database is
touched):

* User-Mode Linux from Debian's *testing* suite. Debian 12's (6.1) and 13's (6.12) UML die on
  AVX-512/AMX CPUs ("ptrace set fp regs failed, errno = 14"); testing's (7.2um1 when written)
  works but needs libc6 >= 2.38, so libc6 comes from Debian 13 and the binary is pointed at it
  with patchelf (--set-interpreter/--set-rpath; calling that ld.so directly does not work).
* Debian 12's own kernel (linux-image-6.1.0-*-amd64) for the qemu backend, extracted with
  ``dpkg -x`` and indexed with ``depmod -b``.

Both are fetched with ``apt-get download`` under a private apt configuration (own sources list,
lists and cache directories) whose mirror is taken from the machine's own apt sources, so no
mirror host name lives in this repository. Versions are resolved at set-up time.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cachemgr.core import runner
from cachemgr.core.errors import LabError

log = logging.getLogger(__name__)

DEFAULT_LAB_DIR = Path(os.environ.get("CACHEMGR_LAB_DIR", "/var/cache/cachemgr/lab"))
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
APT_SOURCES = Path("/etc/apt/sources.list")
APT_SOURCES_D = Path("/etc/apt/sources.list.d")


def lab_dir() -> Path:
    return Path(os.environ.get("CACHEMGR_LAB_DIR", str(DEFAULT_LAB_DIR)))


def _debian_uris_from_deb822(text: str) -> list[tuple[str, list[str]]]:
    """(URI, suites) pairs of the deb822 stanzas in ``text`` (sources.list.d/*.sources)."""
    out: list[tuple[str, list[str]]] = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if "deb" not in fields.get("types", "").split():
            continue
        for uri in fields.get("uris", "").split():
            out.append((uri, fields.get("suites", "").split()))
    return out


def _debian_uris_from_list(text: str) -> list[tuple[str, list[str]]]:
    """(URI, [suite]) pairs of one-line ``deb`` entries (sources.list)."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        parts = line.split()[1:]
        if parts and parts[0].startswith("["):
            while parts and not parts[0].endswith("]"):
                parts.pop(0)
            parts.pop(0)
        if len(parts) >= 2:
            out.append((parts[0], [parts[1]]))
    return out


def debian_mirror(
    sources: Path = APT_SOURCES, sources_d: Path = APT_SOURCES_D
) -> str:
    """The Debian archive URI this machine's apt uses (not the security archive).

    An entry whose suites are plain Debian release names (bookworm, bookworm-updates...)
    qualifies; ``*-security`` entries live on a different archive layout and are skipped.
    """
    entries: list[tuple[str, list[str]]] = []
    if sources.exists():
        entries += _debian_uris_from_list(sources.read_text(errors="replace"))
    if sources_d.is_dir():
        for f in sorted(sources_d.iterdir()):
            if f.suffix == ".sources":
                entries += _debian_uris_from_deb822(f.read_text(errors="replace"))
            elif f.suffix == ".list":
                entries += _debian_uris_from_list(f.read_text(errors="replace"))
    names = ("bookworm", "trixie", "forky", "sid", "testing", "stable", "unstable")
    for uri, suites in entries:
        if any(s.split("-")[0] in names and not s.endswith("-security") for s in suites):
            return uri.rstrip("/")
    raise LabError(
        "cannot find a Debian mirror in this machine's apt sources",
        hint=f"add a Debian 'deb' entry to {sources} or {sources_d}",
    )


class PrivateApt:
    """apt-get/apt-cache with their own sources, lists and cache under ``root``."""

    def __init__(self, root: Path, suites: list[str], mirror: str | None = None) -> None:
        self.root = root
        self.mirror = mirror or debian_mirror()
        (root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (root / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        lines = [f"deb [signed-by={KEYRING}] {self.mirror} {s} main" for s in suites]
        (root / "sources.list").write_text("\n".join(lines) + "\n")

    def _opts(self) -> list[str]:
        r = self.root
        return [
            "-o", f"Dir::Etc::SourceList={r / 'sources.list'}",
            "-o", "Dir::Etc::SourceParts=/dev/null",
            "-o", f"Dir::State::Lists={r / 'lists'}",
            "-o", f"Dir::Cache={r / 'cache'}",
            "-o", "Dir::State::status=/dev/null",
            "-o", "APT::Sandbox::User=root",
            "-o", "Debug::NoLocking=1",
        ]

    def update(self) -> None:
        runner.run(["apt-get", *self._opts(), "-q", "update"], timeout=600)

    def candidate(self, package: str, suite: str | None = None) -> str:
        """The version ``apt-get download`` would take (highest, or the one in ``suite``)."""
        out = runner.run(
            ["apt-cache", *self._opts(), "madison", package], timeout=120
        ).stdout
        best = None
        for line in out.splitlines():
            cols = [c.strip() for c in line.split("|")]
            if len(cols) < 3 or cols[0] != package:
                continue
            if suite is None or f" {suite}/" in f" {cols[2]}":
                cand = cols[1]
                if best is None or _vercmp(cand, best) > 0:
                    best = cand
        if best is None:
            raise LabError(f"package {package} not found in {suite or 'the private sources'}")
        return best

    def depends(self, package: str) -> list[str]:
        out = runner.run(["apt-cache", *self._opts(), "depends", package], timeout=120).stdout
        return [
            line.split(":", 1)[1].strip()
            for line in out.splitlines()
            if line.strip().startswith("Depends:")
        ]

    def download(self, dest: Path, specs: list[str]) -> list[Path]:
        dest.mkdir(parents=True, exist_ok=True)
        before = set(dest.glob("*.deb"))
        runner.run(["apt-get", *self._opts(), "-q", "download", *specs], cwd=str(dest),
                   timeout=1200)
        return sorted(set(dest.glob("*.deb")) - before) or sorted(dest.glob("*.deb"))


def _vercmp(a: str, b: str) -> int:
    if a == b:
        return 0
    r = subprocess.run(["dpkg", "--compare-versions", a, "gt", b], check=False)
    return 1 if r.returncode == 0 else -1


@dataclass(frozen=True)
class KernelInfo:
    backend: str
    version: str  # Debian package version
    release: str  # uname -r
    kernel: str  # UML binary or vmlinuz
    modules: str  # directory holding <release>/modules.dep
    extra: dict[str, str]

    def to_json(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "version": self.version,
            "release": self.release,
            "kernel": self.kernel,
            "modules": self.modules,
            "extra": self.extra,
        }


def manifest_path(root: Path | None = None) -> Path:
    return (root or lab_dir()) / "lab.json"


def load_manifest(root: Path | None = None) -> dict[str, KernelInfo]:
    p = manifest_path(root)
    if not p.exists():
        return {}
    data = json.loads(p.read_text())
    return {k: KernelInfo(**v) for k, v in data.items()}


def _save(root: Path, info: KernelInfo) -> None:
    data = {k: v.to_json() for k, v in load_manifest(root).items()}
    data[info.backend] = info.to_json()
    tmp = manifest_path(root).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(manifest_path(root))


def _extract(deb: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    runner.run(["dpkg-deb", "-x", str(deb), str(dest)], timeout=600)


def fetch_uml(root: Path | None = None, *, force: bool = False) -> KernelInfo:
    """Fetch testing's user-mode-linux and Debian 13's libc6; patch the binary to use it."""
    root = root or lab_dir()
    apt = PrivateApt(root / "apt-uml", ["testing", "trixie"])
    have = load_manifest(root).get("uml")
    try:
        apt.update()
        version = apt.candidate("user-mode-linux", "testing")
        libc = apt.candidate("libc6", "trixie")
    except Exception as exc:  # network trouble: keep a working kernel if we have one
        if have and Path(have.kernel).exists():
            log.warning("cannot refresh the UML kernel (%s); keeping %s", exc, have.version)
            return have
        raise
    if have and not force and have.version == version and Path(have.kernel).exists():
        log.info("UML kernel %s already present", version)
        return have
    dest = root / "uml" / version
    if dest.exists():
        shutil.rmtree(dest)
    debs = apt.download(root / "debs-uml", [f"user-mode-linux={version}", f"libc6={libc}"])
    for name in (f"user-mode-linux_{_fname(version)}", f"libc6_{_fname(libc)}"):
        deb = next((d for d in debs if d.name.startswith(name)), None)
        if deb is None:
            raise LabError(f"download of {name}* did not produce a .deb in {debs}")
        _extract(deb, dest / "x")
    binary = dest / "linux"
    shutil.copy2(dest / "x/usr/bin/linux.uml", binary)
    libdir = dest / "x/usr/lib/x86_64-linux-gnu"
    runner.run(["patchelf", "--set-interpreter", str(libdir / "ld-linux-x86-64.so.2"),
                "--set-rpath", str(libdir), str(binary)])
    release = runner.run([str(binary), "--version"]).stdout.strip().splitlines()[-1].strip()
    modules = dest / "x/usr/lib/uml/modules"
    if not (modules / release / "modules.dep").exists():
        raise LabError(f"UML package {version} has no modules for {release} under {modules}")
    info = KernelInfo("uml", version, release, str(binary), str(modules), {"libc6": libc})
    _save(root, info)
    for old in (root / "uml").iterdir():
        if old.name != version:
            shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(root / "debs-uml", ignore_errors=True)
    return info


def _fname(version: str) -> str:
    # apt-get download writes epochs as %3a
    return version.replace(":", "%3a")


def fetch_qemu_kernel(root: Path | None = None, *, force: bool = False) -> KernelInfo:
    """Fetch Debian 12's own kernel (linux-image-6.1.0-*-amd64) for the qemu backend."""
    root = root or lab_dir()
    apt = PrivateApt(root / "apt-qemu", ["bookworm", "bookworm-updates"])
    have = load_manifest(root).get("qemu")
    try:
        apt.update()
        meta = apt.candidate("linux-image-amd64")
        image = next(
            (d.split()[0] for d in apt.depends(f"linux-image-amd64={meta}")
             if d.startswith("linux-image-")), None)
        if image is None:
            raise LabError(f"linux-image-amd64 {meta} names no kernel image package")
        version = apt.candidate(image)
    except Exception as exc:
        if have and Path(have.kernel).exists():
            log.warning("cannot refresh the qemu kernel (%s); keeping %s", exc, have.version)
            return have
        raise
    if have and not force and have.extra.get("package") == image and have.version == version \
            and Path(have.kernel).exists():
        log.info("qemu kernel %s %s already present", image, version)
        return have
    dest = root / "qemu" / image
    if dest.exists():
        shutil.rmtree(dest)
    debs = apt.download(root / "debs-qemu", [f"{image}={version}"])
    deb = next((d for d in debs if d.name.startswith(image + "_")), None)
    if deb is None:
        raise LabError(f"download of {image} did not produce a .deb in {debs}")
    _extract(deb, dest / "x")
    release = image.removeprefix("linux-image-")
    vmlinuz = dest / "x/boot" / f"vmlinuz-{release}"
    moddir = dest / "x/lib/modules"
    if not (moddir / release).is_dir():
        moddir = dest / "x/usr/lib/modules"
    # depmod -b BASE reads BASE/lib/modules/<release>
    runner.run(["depmod", "-b", str(moddir.parent.parent), release], timeout=300)
    info = KernelInfo("qemu", version, release, str(vmlinuz), str(moddir),
                      {"package": image})
    _save(root, info)
    for old in (root / "qemu").iterdir():
        if old.name != image:
            shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(root / "debs-qemu", ignore_errors=True)
    return info
