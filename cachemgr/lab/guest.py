"""What a lab backend (cachemgr/lab/uml.py, qemu.py) boots and how it is watched: the spec of a
run, its result, the backend interface, the pipe pumps and the supervisor that enforces the
hard timeout and reads the control channel. cachemgr/lab/core.py's ``run`` prepares a run and
hands it to a backend; the backends build on this module, below both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from cachemgr.lab import kernels

HERE = Path(__file__).resolve().parent

# Modules every guest loads at boot (scsi_debug is left to the tests: its parameters matter;
# sd_mod is loaded here because without udevd nothing autoloads it for a new SCSI disk).
DEFAULT_MODULES = ("loop", "sd_mod", "bcache", "dm-mod", "dm-cache", "dm-cache-smq", "dm-delay",
                   "dm-flakey")
# Exit code of a command the lab ended on timeout (timeout(1)'s convention).
TIMEOUT_RC = 124

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


class Backend:
    def tty_names(self) -> dict[str, str]:
        raise NotImplementedError

    def boot(self, info: kernels.KernelInfo, spec: LabSpec, rundir: Path, disks: list[Path],
             console: Path, out: BinaryIO, err: BinaryIO, capture: bool) -> LabResult:
        raise NotImplementedError


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
