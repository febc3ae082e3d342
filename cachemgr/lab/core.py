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
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from cachemgr.core.errors import LabError, UsageError
from cachemgr.core.model import parse_size as _parse_size
from cachemgr.lab import kernels

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
PROJECT_DIR = HERE.parent.parent

# Modules every guest loads at boot (scsi_debug is left to the tests: its parameters matter;
# sd_mod is loaded here because without udevd nothing autoloads it for a new SCSI disk).
DEFAULT_MODULES = ("loop", "sd_mod", "bcache", "dm-mod", "dm-cache", "dm-cache-smq", "dm-delay",
                   "dm-flakey")
# Exit code of a command the lab ended on timeout (timeout(1)'s convention).
TIMEOUT_RC = 124
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


def nvme_serial(i: int) -> str:
    """The serial of the lab's NVMe controller ``i`` (fixed: its identity is stable)."""
    return f"CMLABNVME{i:02d}"


def nvme_eui64(i: int, nsid: int = 1) -> int:
    """The EUI-64 of namespace ``nsid`` of the lab's NVMe controller ``i`` (namespace 1:
    the value the lab has always given, so captures and tests keep it)."""
    return 0x5254_00c0_ffee_0000 + ((nsid - 1) << 16) + i + 1


def nvme_uuid(i: int, nsid: int = 1) -> str:
    return f"5c0ffee0-{nsid - 1:04x}-4000-8000-{i + 1:012x}"


@dataclass(frozen=True)
class LabSpec:
    backend: str = "uml"
    disks: tuple[int, ...] = ()
    # qemu: one NVMe controller (own PCIe root port) per item, its namespaces' sizes
    nvme: tuple[tuple[int, ...], ...] = ()
    udev: bool = False
    # cgroup v2 with machine.slice and libvirt's daemon (qemu:///system) in the guest
    libvirt: bool = False
    timeout: float = 600.0
    mem_mb: int = 1536
    interactive: bool = False
    cwd: str = field(default_factory=os.getcwd)
    rw_paths: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    modules: tuple[str, ...] = DEFAULT_MODULES
    keep: bool = False
    rows: int = 24
    cols: int = 80
    # boot systemd as PID 1 and run the command as a service once multi-user.target is up
    systemd: bool = False
    # run first (before systemd starts, if it does) in the command's environment
    setup: tuple[str, ...] = ()
    # qemu: its QMP monitor on a virtio-serial port of the guest, to pull and insert drives
    # (cachemgr/lab/qmp.py); the guest gets the whole of its qemu through it
    monitor: bool = False
    # existing disk images, attached as they are after the fresh ``disks`` (and before the
    # NVMe ones) and never removed: a second boot on what an earlier run wrote, as after a
    # reboot or a power cut (``lab run --disk-image PATH``)
    disk_images: tuple[str, ...] = ()
    # qemu: a serial number for each plain disk, in $LAB_DISKS order ("" for none): the
    # virtio disk's ``serial=`` (/sys/block/vdX/serial), an identity that follows the disk
    # from slot to slot. UML's ubd disks cannot have one (refused)
    disk_serials: tuple[str, ...] = ()
    # qemu: the guest's CPUs (TCG runs one host thread each). A guest doing one thing at a
    # time costs less host CPU with one (a package install 137 against ~180 CPU-seconds, the
    # sizing test 66 against 90, the NVMe refusals 41 against 73); one running a procedure
    # beside fio's load costs less with two (an NVMe replacement 135 against 198), measured
    # alone on this project's 2-CPU machine (docs/benchmarks.md, "Test suite time")
    qemu_cpus: int = 2

    @property
    def n_disks(self) -> int:
        """The plain disks (fresh ones, then the images): the head of ``$LAB_DISKS``, which
        names the NVMe namespaces after them (lab-disks.sh)."""
        return len(self.disks) + len(self.disk_images)


@dataclass
class LabResult:
    returncode: int
    timed_out: bool
    rundir: Path
    console_log: Path
    kernel_release: str | None
    messages: list[str]
    stdout: bytes | None = None
    stderr: bytes | None = None

    @property
    def console_text(self) -> str:
        try:
            return self.console_log.read_text(errors="replace")
        except OSError:
            return ""


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


class _Pump(threading.Thread):
    """Copies one pipe to a sink as data arrives (and keeps it when capturing)."""

    def __init__(self, fd: int, sink: BinaryIO | None, keep: bool,
                 on_line: Callable[[str], None] | None = None) -> None:
        super().__init__(daemon=True)
        self.fd, self.sink, self.keep, self.on_line = fd, sink, keep, on_line
        self.data = bytearray()

    def run(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            if self.keep or self.on_line:
                self.data += chunk
            if self.sink is not None:
                self.sink.write(chunk)
                self.sink.flush()
            if self.on_line:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self.on_line(line.decode(errors="replace"))
        os.close(self.fd)


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


class Backend:
    def tty_names(self) -> dict[str, str]:
        raise NotImplementedError

    def boot(self, info: kernels.KernelInfo, spec: LabSpec, rundir: Path, disks: list[Path],
             console: Path, out: BinaryIO, err: BinaryIO, capture: bool) -> LabResult:
        raise NotImplementedError


def _backend(name: str) -> Backend:
    if name == "uml":
        from cachemgr.lab.uml import UmlBackend

        return UmlBackend()
    from cachemgr.lab.qemu import QemuBackend

    return QemuBackend()


def supervise(
    proc: subprocess.Popen[bytes],
    spec: LabSpec,
    rundir: Path,
    console: Path,
    pumps: tuple[_Pump, _Pump, _Pump],
    boot_allowance: float,
) -> LabResult:
    """Wait for a guest, enforce the hard timeout, and read the control channel."""
    out, err, ctl = pumps
    messages: list[str] = []
    lock = threading.Lock()

    def on_ctl(line: str) -> None:
        with lock:
            messages.append(line.strip())

    ctl.on_line = on_ctl
    for p in pumps:
        p.start()
    deadline = time.monotonic() + spec.timeout + boot_allowance
    killed = False
    try:
        while True:
            try:
                proc.wait(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    killed = True
                    _killpg(proc)
                    proc.wait()
                    break
    except KeyboardInterrupt:
        _killpg(proc)
        proc.wait()
        raise
    finally:
        for p in pumps:
            p.join(timeout=5)
        # UML leaves helper processes in its group; make sure none outlives the guest
        _killpg(proc, quiet=True)
    rc: int | None = None
    release = None
    timed_out = killed
    for m in messages:
        if m.startswith("rc="):
            rc = int(m[3:])
        elif m.startswith("booted "):
            release = m.split(None, 1)[1]
        elif m.startswith("timeout"):
            timed_out = True
        elif m.startswith(("modprobe-failed", "nvme-missing")):
            print(f"lab: {m}", file=sys.stderr)
    if killed:
        print(f"lab: the guest ran past its timeout ({spec.timeout:g} s + "
              f"{boot_allowance:g} s boot allowance) and was killed", file=sys.stderr)
        rc = TIMEOUT_RC
    elif timed_out:
        print(f"lab: the command timed out after {spec.timeout:g} s and was ended",
              file=sys.stderr)
        rc = TIMEOUT_RC
    elif rc is None:
        tail = _tail(console, 15)
        print(f"lab: the guest ended without reporting an exit code (host exit "
              f"{proc.returncode}); last console lines:\n{tail}", file=sys.stderr)
        rc = 1 if release else 125
    return LabResult(
        returncode=rc,
        timed_out=timed_out,
        rundir=rundir,
        console_log=console,
        kernel_release=release,
        messages=messages,
        stdout=bytes(out.data) if out.keep else None,
        stderr=bytes(err.data) if err.keep else None,
    )


def _tail(path: Path, n: int) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "  (no console log)"
    return "\n".join("  " + line for line in lines[-n:])


def _killpg(proc: subprocess.Popen[bytes], quiet: bool = False) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if not quiet:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
