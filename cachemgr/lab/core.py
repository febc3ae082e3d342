"""The lab: run a command as root on a real Linux kernel and bring its results back.

``run(argv, LabSpec(...))`` boots a guest (User-Mode Linux, or qemu with Debian's own kernel),
runs ``argv`` there as root in the same working directory, and returns its exit code. The
command's stdout and stderr travel on two separate serial lines and are kept apart; a third
line carries the guest's control messages (boot, module failures, exit code). The host's / is
the guest's root, read-only under an overlay with a tmpfs upper; the project directory (and
any other ``rw_paths``) is mounted read-write at the same path, so results come back. Scratch
disks are sparse files of the sizes asked. A timeout always ends the guest; the kernel console
log is kept (and its path printed) when something went wrong.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from cachemgr.core.errors import LabError, UsageError
from cachemgr.core.model import parse_size as _parse_size
from cachemgr.lab import kernels
from cachemgr.lab.guest import DEFAULT_MODULES as DEFAULT_MODULES
from cachemgr.lab.guest import HERE as HERE
from cachemgr.lab.guest import TIMEOUT_RC as TIMEOUT_RC
from cachemgr.lab.guest import Backend as Backend
from cachemgr.lab.guest import LabResult as LabResult
from cachemgr.lab.guest import LabSpec as LabSpec
from cachemgr.lab.guest import nvme_eui64 as nvme_eui64
from cachemgr.lab.guest import nvme_serial as nvme_serial
from cachemgr.lab.guest import nvme_uuid as nvme_uuid

log = logging.getLogger(__name__)

PROJECT_DIR = HERE.parent.parent

# Host variables the guest command inherits (the rest of the host environment stays out).
PASS_ENV = re.compile(
    r"^(PATH|TERM|LANG|LC_[A-Z]+|TZ|COLUMNS|LINES|PYTHON[A-Z_]*|PYTEST_[A-Z_]*|HYPOTHESIS_[A-Z_]*"
    r"|CACHEMGR_[A-Z_]*|VIRTUAL_ENV|CI|NO_COLOR|FORCE_COLOR|TEXTUAL_[A-Z_]*)$"
)


def parse_size(text: str) -> int:
    """A lab disk's size (``1G``, ``256M``, ``512k``): :func:`cachemgr.core.model.parse_size`."""
    size = _parse_size(text, hint="use a disk size like 1G, 256M or 512K")
    if size < 1 << 20:
        raise UsageError(f"disk size {text!r} is below 1 MiB")
    return size


NVME = "nvme:"
# namespaces one lab NVMe controller may have (qemu allows 256; a lab needs a few)
NVME_MAX_NAMESPACES = 8
NVME_HINT = ("nvme:SIZE is one NVMe controller with one namespace; nvme:160M+32M one with "
             f"two (namespaces 1 and 2); at most {NVME_MAX_NAMESPACES} per controller")


def parse_nvme(item: str) -> tuple[int, ...]:
    """``nvme:160M+32M`` -> (160 MiB, 32 MiB): one controller's namespace sizes, namespace 1
    first."""
    body = item[len(NVME):]
    parts = [p.strip() for p in body.split("+")]
    if len(parts) > NVME_MAX_NAMESPACES:
        raise UsageError(f"lab disk {item!r}: {len(parts)} namespaces on one controller, "
                         f"more than {NVME_MAX_NAMESPACES}", hint=NVME_HINT)
    sizes = []
    for nsid, part in enumerate(parts, 1):
        if not part:
            raise UsageError(f"lab disk {item!r}: namespace {nsid} has no size", hint=NVME_HINT)
        try:
            sizes.append(parse_size(part))
        except UsageError as exc:
            raise UsageError(f"lab disk {item!r}, namespace {nsid}: {exc.message}",
                             hint=exc.hint or NVME_HINT) from None
    return tuple(sizes)


def parse_disk_specs(text: str) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """``1G,nvme:512M,256M`` -> (virtio/ubd disk sizes, NVMe controllers), each in the
    order given. An ``nvme:SIZE`` item is one emulated NVMe controller with one namespace,
    ``nvme:SIZE+SIZE...`` one with a namespace per size (qemu only); a controller is the
    tuple of its namespaces' sizes."""
    disks: list[int] = []
    nvme: list[tuple[int, ...]] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if item.lower().startswith(NVME):
            nvme.append(parse_nvme(item))
        else:
            disks.append(parse_size(item))
    return tuple(disks), tuple(nvme)


def parse_disks(text: str) -> tuple[int, ...]:
    """Plain scratch disks only (``1G,256M``)."""
    disks, nvme = parse_disk_specs(text)
    if nvme:
        raise UsageError("nvme: disks are not taken here", hint="use cachemgr lab run "
                         "--backend qemu --disks 1G,nvme:512M")
    return disks


def make_image(path: str | os.PathLike[str], size: int) -> Path:
    """A sparse disk image of ``size`` bytes at ``path``. From inside a guest (a drive to
    put in through the monitor, cachemgr/lab/qmp.py) it goes in the run directory, which
    the host's qemu sees at the same path."""
    with open(path, "wb") as f:
        f.truncate(size)
    return Path(path)


def runs_dir() -> Path:
    """Where runs keep their disks and logs; created on first use (the pytest plugin makes
    its result directories here before the first guest boots)."""
    d = Path(os.environ.get("CACHEMGR_LAB_RUNS", "/var/tmp/cachemgr-lab"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _guest_env(spec: LabSpec) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if PASS_ENV.match(k)}
    if spec.env:
        env.update(spec.env)
    return env


def _disk_names(backend: str, n: int) -> list[str]:
    prefix = "/dev/ubd" if backend == "uml" else "/dev/vd"
    return [prefix + chr(ord("a") + i) for i in range(n)]


def run(
    argv: Sequence[str],
    spec: LabSpec,
    *,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    capture: bool = False,
) -> LabResult:
    """Boot a guest, run ``argv`` in it, return its exit code and (if ``capture``) output.

    Without ``capture`` the command's output streams to ``stdout``/``stderr`` (default: this
    process's). The run directory is removed afterwards unless the run failed or
    ``spec.keep`` is set; then its console log stays for diagnosis.
    """
    if not argv:
        raise UsageError("lab run needs a command", hint="cachemgr lab run -- COMMAND [ARGS]")
    if spec.backend not in ("uml", "qemu"):
        raise UsageError(f"unknown lab backend {spec.backend!r}", hint="use uml or qemu")
    if spec.nvme and spec.backend != "qemu":
        raise UsageError("NVMe disks need the qemu backend",
                         hint="cachemgr lab run --backend qemu --disks 1G,nvme:512M -- CMD")
    if spec.monitor and spec.backend != "qemu":
        raise UsageError("the machine monitor needs the qemu backend",
                         hint="cachemgr lab run --backend qemu --monitor -- CMD")
    if spec.disk_serials and spec.backend != "qemu":
        raise UsageError("disk serials are the qemu lab's (UML's ubd disks have none)")
    if len(spec.disk_serials) > spec.n_disks or not all(
            re.fullmatch(r"[A-Za-z0-9_-]{0,20}", s) for s in spec.disk_serials):
        raise UsageError("disk serials: one for each plain disk at most, each up to 20 "
                         "letters, digits, '-' or '_'")
    for p in spec.rw_paths:
        # a guest cannot mount what the host does not have (it died at boot: exit 125)
        if not Path(p).is_dir():
            raise UsageError(f"--rw {p}: no such directory on the host",
                             hint=f"create it first: mkdir -p {p}")
    manifest = kernels.load_manifest()
    info = manifest.get(spec.backend)
    if info is None or not Path(info.kernel).exists():
        raise LabError(
            f"the {spec.backend} lab kernel is not installed",
            hint="run scripts/setup.sh (or: cachemgr lab setup)",
        )
    images = [Path(p).resolve() for p in spec.disk_images]
    for img in images:
        if not img.is_file():
            raise UsageError(f"lab disk image {img}: no such file")
    base = runs_dir()
    base.mkdir(parents=True, exist_ok=True)
    rundir = Path(tempfile.mkdtemp(prefix=f"{spec.backend}-", dir=base))
    fresh = [make_image(rundir / f"disk{i}.img", size) for i, size in enumerate(spec.disks)]
    disks = [*fresh, *images]
    # controller i's namespaces, in nsid order
    disks += [make_image(rundir / f"nvme{i}n{nsid}.img", size)
              for i, sizes in enumerate(spec.nvme) for nsid, size in enumerate(sizes, 1)]
    (rundir / "argv").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (rundir / "setup-argv").write_bytes(b"".join(a.encode() + b"\0" for a in spec.setup))
    (rundir / "env").write_bytes(
        b"".join(f"{k}={v}".encode() + b"\0" for k, v in _guest_env(spec).items())
    )
    (rundir / "modprobe.err").write_bytes(b"")
    rw_paths = [str(PROJECT_DIR), str(rundir), *spec.rw_paths]
    libvirt_cache = kernels.lab_dir() / f"libvirt-cache-{spec.backend}"
    if spec.libvirt:
        libvirt_cache.mkdir(parents=True, exist_ok=True)
        rw_paths.append(str(libvirt_cache))
    cwd = spec.cwd
    if not any(cwd == p or cwd.startswith(p.rstrip("/") + "/") for p in rw_paths):
        log.info("lab: %s is not a read-write path; it will be read-only in the guest", cwd)
    backend = _backend(spec.backend)
    settings = {
        "LAB_BACKEND": spec.backend,
        "LAB_HOSTNAME": f"lab-{spec.backend}",
        "LAB_CWD": cwd,
        "LAB_TIMEOUT": str(int(spec.timeout)),
        "LAB_UDEV": "1" if spec.udev else "0",
        "LAB_SYSTEMD": "1" if spec.systemd else "0",
        "LAB_LIBVIRT": "1" if spec.libvirt else "0",
        "LAB_LIBVIRT_CACHE": str(libvirt_cache) if spec.libvirt else "",
        "LAB_INTERACTIVE": "1" if spec.interactive else "0",
        "LAB_ROWS": str(spec.rows),
        "LAB_COLS": str(spec.cols),
        "LAB_MODULES": info.modules,
        "LAB_MODULES_LOAD": " ".join(spec.modules + (("nvme",) if spec.nvme else ())
                                     + (("virtio_console",) if spec.monitor else ())),
        # the plain disks; the guest adds the NVMe namespaces after them (lab-disks.sh)
        "LAB_DISKS": " ".join(_disk_names(spec.backend, spec.n_disks)),
        # NVMe namespaces by controller serial (their kernel names follow the probe order)
        # and how many namespaces each controller has
        "LAB_NVME_SERIALS": " ".join(nvme_serial(i) for i in range(len(spec.nvme))),
        "LAB_NVME_NAMESPACES": " ".join(str(len(sizes)) for sizes in spec.nvme),
        "LAB_RW_PATHS": " ".join(rw_paths),
        "LAB_STAGE2": str(HERE / "stage2.sh"),
        "LAB_UPPER_SIZE": "2g",
        "LAB_STDIN": "/dev/null",
        **backend.tty_names(),
    }
    for k, v in settings.items():
        if " " in v and k not in ("LAB_MODULES_LOAD", "LAB_DISKS", "LAB_RW_PATHS",
                                  "LAB_NVME_SERIALS", "LAB_NVME_NAMESPACES"):
            raise UsageError(f"lab: {k} may not contain spaces: {v!r}")
    (rundir / "lab.env").write_text(
        "".join(f"{k}={_shq(v)}\n" for k, v in settings.items())
    )
    console = rundir / "console.log"
    result = backend.boot(info, spec, rundir, disks, console,
                          stdout if stdout is not None else sys.stdout.buffer,
                          stderr if stderr is not None else sys.stderr.buffer, capture)
    failed = result.returncode != 0 or result.timed_out
    if failed or spec.keep:
        if failed:
            print(f"lab: console log kept in {console}", file=sys.stderr)
        for d in disks:
            if d in images:
                continue  # the caller's: never removed
            with contextlib.suppress(OSError):
                d.unlink()
    else:
        shutil.rmtree(rundir, ignore_errors=True)
    return result


def _shq(v: str) -> str:
    return "'" + v.replace("'", "'\\''") + "'"


def _backend(name: str) -> Backend:
    if name == "uml":
        from cachemgr.lab.uml import UmlBackend

        return UmlBackend()
    from cachemgr.lab.qemu import QemuBackend

    return QemuBackend()


