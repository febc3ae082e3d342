"""qemu backend of the lab (the fallback: Debian 12's own kernel under TCG, ~15 s a boot).

The guest is ``qemu-system-x86_64 -accel tcg`` booting Debian's vmlinuz with a small busybox
initramfs (built here, cached under the lab directory). Its ``/init`` (qemu-init.sh) loads the
virtio, 9p and overlay drivers, mounts the host's / over virtio-9p read-only under an overlay
with a tmpfs upper, the read-write paths as further 9p shares, and runs the common stage 2.

Channels: four 8250 UARTs. ``ttyS0`` is the kernel console -> the console log; ``ttyS1``,
``ttyS2``, ``ttyS3`` carry the command's stdout, stderr and the control channel to host pipes
(``-add-fd`` + ``-chardev file,path=/dev/fdset/N``). In interactive mode the guest terminal is
a virtio console, ``/dev/hvc0``, on qemu's stdin/stdout (``-chardev stdio``). Scratch disks
are virtio-blk, ``/dev/vda``...
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from cachemgr.errors import LabError
from cachemgr.lab import kernels
from cachemgr.lab.core import HERE, Backend, LabResult, LabSpec, _Pump, supervise

QEMU = "qemu-system-x86_64"
BUSYBOX = Path("/bin/busybox")
INIT_SCRIPT = HERE / "qemu-init.sh"
# Drivers the initramfs loads (their dependencies come from modules.dep).
INITRAMFS_MODULES = ("virtio_pci", "virtio_blk", "virtio_console", "9pnet_virtio", "9p",
                     "overlay")
# Bumped when the initramfs layout changes, so cached images are rebuilt.
_LAYOUT = "1"
# TCG is slow to boot: the lab's timeout counts from the command's start in the guest.
BOOT_ALLOWANCE = 180.0
_KO_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


class QemuBackend(Backend):
    def tty_names(self) -> dict[str, str]:
        return {
            "LAB_TTY_OUT": "/dev/ttyS1",
            "LAB_TTY_ERR": "/dev/ttyS2",
            "LAB_TTY_CTL": "/dev/ttyS3",
            "LAB_TTY_TERM": "/dev/hvc0",
        }

    def boot(self, info: kernels.KernelInfo, spec: LabSpec, rundir: Path, disks: list[Path],
             console: Path, out: BinaryIO, err: BinaryIO, capture: bool) -> LabResult:
        qemu = shutil.which(QEMU)
        if qemu is None:
            raise LabError(f"{QEMU} is not installed", hint="apt-get install qemu-system-x86")
        initrd = initramfs(info, rundir)
        rw_paths = _lab_env(rundir).get("LAB_RW_PATHS", "").split()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        con_fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        append = " ".join([
            "console=ttyS0", "panic=-1", *os.environ.get("QX", "").split(), f"labrun={rundir}",
            "quiet" if not os.environ.get("CACHEMGR_LAB_VERBOSE") else "loglevel=7",
        ])
        argv = [
            qemu, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-accel", "tcg", "-machine", "pc", "-cpu", "max", "-smp", "2",
            "-m", str(spec.mem_mb),
            "-kernel", info.kernel, "-initrd", str(initrd), "-append", append,
            "-chardev", f"file,id=con,path={_chardev_path(console)},append=on",
            "-serial", "chardev:con",
        ]
        for name, fd in (("out", out_w), ("err", err_w), ("ctl", ctl_w)):
            argv += [
                "-chardev", f"file,id={name},path=/proc/self/fd/{fd}",
                "-serial", f"chardev:{name}",
            ]
        # disks first: virtio-blk names follow the PCI order (vda = disk0)
        for i, d in enumerate(disks):
            argv += [
                "-drive", f"file={_drive_path(d)},format=raw,if=none,id=disk{i},"
                          "cache=writeback,discard=unmap",
                "-device", f"virtio-blk-pci,drive=disk{i}",
            ]
        shares = [("hostroot", "/", True)]
        shares += [(f"rw{i}", p, False) for i, p in enumerate(rw_paths)]
        for i, (tag, path, ro) in enumerate(shares):
            argv += [
                "-fsdev", f"local,id=fs{i},path={_drive_path(Path(path))},"
                          f"security_model=passthrough,multidevs=remap"
                          + (",readonly=on" if ro else ""),
                "-device", f"virtio-9p-pci,fsdev=fs{i},mount_tag={tag}",
            ]
        if spec.interactive:
            argv += [
                "-chardev", "stdio,id=term,signal=off",
                "-device", "virtio-serial-pci",
                "-device", "virtconsole,chardev=term",
            ]
        pass_fds = [con_fd, out_w, err_w, ctl_w]
        proc = subprocess.Popen(
            argv,
            stdin=None if spec.interactive else subprocess.DEVNULL,
            stdout=None if spec.interactive else con_fd,
            stderr=con_fd,
            pass_fds=pass_fds,
            start_new_session=not spec.interactive,
            cwd=rundir,
        )
        for fd in (out_w, err_w, ctl_w, con_fd):
            os.close(fd)
        pumps = (
            _Pump(out_r, None if capture else out, capture),
            _Pump(err_r, None if capture else err, capture),
            _Pump(ctl_r, None, False),
        )
        return supervise(proc, spec, rundir, console, pumps, boot_allowance=BOOT_ALLOWANCE)


def _lab_env(rundir: Path) -> dict[str, str]:
    """The settings core.run wrote to ``rundir/lab.env`` (``K='v'`` lines)."""
    env: dict[str, str] = {}
    for line in (rundir / "lab.env").read_text().splitlines():
        words = shlex.split(line)
        if words and "=" in words[0]:
            k, _, v = words[0].partition("=")
            env[k] = v
    return env


def _chardev_path(p: Path) -> str:
    # qemu's option syntax: a comma is written as two
    return str(p).replace(",", ",,")


_drive_path = _chardev_path


# --- the initramfs -------------------------------------------------------------------------

def _module_table(moddir: Path) -> dict[str, tuple[str, list[str]]]:
    """modules.dep as {name: (relative path, [dependency paths])}, names with ``_``."""
    table: dict[str, tuple[str, list[str]]] = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        path, sep, deps = line.partition(":")
        if not sep:
            continue
        table[_mod_name(path)] = (path, deps.split())
    return table


def _mod_name(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    for suffix in _KO_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")


def _builtin(moddir: Path) -> set[str]:
    try:
        text = (moddir / "modules.builtin").read_text()
    except OSError:
        return set()
    return {_mod_name(line.strip()) for line in text.splitlines() if line.strip()}


def resolve_modules(moddir: Path, names: Iterable[str]) -> list[str]:
    """The module files (relative to ``moddir``) to load for ``names``, dependencies first.

    Built-in modules are skipped; a name that is neither built in nor a module is an error.
    """
    table = _module_table(moddir)
    by_path = {path: deps for path, deps in table.values()}
    builtin = _builtin(moddir)
    order: list[str] = []
    seen: set[str] = set()

    def visit(path: str) -> None:
        if path in seen:
            return
        seen.add(path)
        for dep in by_path.get(path, []):
            visit(dep)
        order.append(path)

    for name in names:
        key = name.replace("-", "_")
        if key in table:
            visit(table[key][0])
        elif key not in builtin:
            raise LabError(f"kernel module {name} not found under {moddir}")
    return order


def _module_bytes(path: Path) -> bytes:
    """A module file, decompressed (busybox insmod takes plain .ko files)."""
    name = path.name
    if name.endswith(".ko.xz"):
        return lzma.decompress(path.read_bytes())
    if name.endswith(".ko.gz"):
        return gzip.decompress(path.read_bytes())
    if name.endswith(".ko.zst"):
        return subprocess.run(["zstd", "-dc", str(path)], check=True,
                              stdout=subprocess.PIPE).stdout
    return path.read_bytes()


class _Cpio:
    """A newc cpio archive (what the kernel unpacks as an initramfs)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.ino = 1

    def _entry(self, name: str, mode: int, body: bytes = b"", rdev: tuple[int, int] = (0, 0),
               nlink: int = 1) -> None:
        nm = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, nlink, 0, len(body), 0, 0, rdev[0], rdev[1],
                  len(nm), 0]
        self.ino += 1
        self.data += b"070701" + b"".join(b"%08X" % f for f in fields) + nm
        self.data += b"\0" * (-len(self.data) % 4)
        self.data += body
        self.data += b"\0" * (-len(self.data) % 4)

    def dir(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755, nlink=2)

    def file(self, name: str, body: bytes, perm: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | perm, body)

    def chardev(self, name: str, major: int, minor: int) -> None:
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0, nlink=1)
        self.data += b"\0" * (-len(self.data) % 512)
        return bytes(self.data)


def build_initramfs(info: kernels.KernelInfo, modules: list[str]) -> bytes:
    """The gzip'ed initramfs: busybox, /init, the listed modules and their load order."""
    moddir = Path(info.modules) / info.release
    cpio = _Cpio()
    for d in ("bin", "dev", "proc", "sys", "run", "modules"):
        cpio.dir(d)
    cpio.chardev("dev/console", 5, 1)
    cpio.chardev("dev/null", 1, 3)
    cpio.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
    cpio.file("init", INIT_SCRIPT.read_bytes(), 0o755)
    load = []
    for rel in modules:
        name = _mod_name(rel) + ".ko"
        cpio.file(f"modules/{name}", _module_bytes(moddir / rel))
        load.append(name)
    cpio.file("modules.load", "".join(n + "\n" for n in load).encode())
    return gzip.compress(cpio.finish(), compresslevel=6, mtime=0)


def _stamp(info: kernels.KernelInfo, modules: list[str]) -> str:
    """What the cached image depends on: kernel, modules, busybox, /init and the layout."""
    h = hashlib.sha256()
    moddir = Path(info.modules) / info.release
    parts = [_LAYOUT, info.kernel, info.version, info.release]
    for p in (BUSYBOX, *(moddir / m for m in modules)):
        st = p.stat()
        parts.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
    h.update("\0".join(parts).encode())
    h.update(INIT_SCRIPT.read_bytes())
    return h.hexdigest()[:12]


def initramfs(info: kernels.KernelInfo, fallback_dir: Path) -> Path:
    """The cached initramfs for ``info`` (built when missing or when its inputs changed).

    Cached as ``<lab dir>/qemu/initramfs-<release>-<stamp>.cpio.gz``; when the lab directory
    is not writable it is built into ``fallback_dir`` (the run directory) instead.
    """
    if not BUSYBOX.exists():
        raise LabError(f"{BUSYBOX} is missing", hint="apt-get install busybox-static")
    modules = resolve_modules(Path(info.modules) / info.release, INITRAMFS_MODULES)
    name = f"initramfs-{info.release}-{_stamp(info, modules)}.cpio.gz"
    cache = kernels.lab_dir() / "qemu"
    target = cache / name
    if target.exists():
        return target
    image = build_initramfs(info, modules)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".initramfs-", dir=cache)
        with os.fdopen(fd, "wb") as f:
            f.write(image)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError:
        target = fallback_dir / "initramfs.cpio.gz"
        target.write_bytes(image)
        return target
    for old in cache.glob("initramfs-*.cpio.gz"):
        if old != target:
            old.unlink(missing_ok=True)
    return target
