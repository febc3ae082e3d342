"""qemu backend of the lab (the fallback: Debian 12's own kernel under TCG, ~10-15 s a boot).

The guest is ``qemu-system-x86_64 -accel tcg`` booting Debian's kernel (its uncompressed ELF,
through the PVH entry: the bzImage's decompressor alone costs ~5 s under TCG) with a small
busybox initramfs; both are built here and cached under the lab directory. The initramfs's
``/init`` (qemu-init.sh) loads the virtio, 9p and overlay drivers, mounts the host's / over
virtio-9p read-only under an overlay with a tmpfs upper, the read-write paths as further 9p
shares, and runs the common stage 2.

Channels: four 8250 UARTs. ``ttyS0`` is the kernel console -> the console log; ``ttyS1``,
``ttyS2``, ``ttyS3`` carry the command's stdout, stderr and the control channel to host pipes
(``-chardev file,path=/proc/self/fd/N`` on the pipes' write ends: qemu 7.2's file chardev
refuses ``-add-fd``'s ``/dev/fdset/N`` with EINVAL). In interactive mode the guest terminal
is a virtio console, ``/dev/hvc0``, on qemu's stdin/stdout (``-chardev stdio``). Scratch disks
are virtio-blk, ``/dev/vda``...
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import lzma
import os
import shlex
import shutil
import stat
import struct
import subprocess
import tempfile
import termios
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from cachemgr.core.errors import LabError
from cachemgr.lab import kernels, qmp
from cachemgr.lab.guest import (
    HERE,
    Backend,
    LabResult,
    LabSpec,
    _Pump,
    nvme_eui64,
    nvme_serial,
    nvme_uuid,
    supervise,
)

log = logging.getLogger(__name__)

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
        kernel = pvh_kernel(info)
        initrd = initramfs(info, rundir)
        rw_paths = _lab_env(rundir).get("LAB_RW_PATHS", "").split()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        con_fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        append = " ".join([
            "console=ttyS0", "panic=-1", f"labrun={rundir}",
            "quiet" if not os.environ.get("CACHEMGR_LAB_VERBOSE") else "loglevel=7",
        ])
        argv = [
            qemu, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-accel", "tcg", "-machine", "q35" if spec.nvme else "pc", "-cpu", "max",
            "-smp", str(spec.qemu_cpus),
            "-m", str(spec.mem_mb),
            "-kernel", kernel, "-initrd", str(initrd), "-append", append,
            "-chardev", f"file,id=con,path={_opt(console)},append=on",
            "-serial", "chardev:con",
        ]
        for name, fd in (("out", out_w), ("err", err_w), ("ctl", ctl_w)):
            argv += [
                "-chardev", f"file,id={name},path=/proc/self/fd/{fd}",
                "-serial", f"chardev:{name}",
            ]
        # disks first: virtio-blk names follow the PCI order (vda = disk0)
        plain, nvme = disks[:spec.n_disks], disks[spec.n_disks:]
        argv += virtio_disks(plain, spec.disk_serials)
        # NVMe: the images in controller order, each controller's in namespace order
        images = iter(nvme)
        argv += nvme_devices([[next(images) for _ in sizes] for sizes in spec.nvme])
        shares = [("hostroot", "/", True)]
        shares += [(f"rw{i}", p, False) for i, p in enumerate(rw_paths)]
        for i, (tag, path, ro) in enumerate(shares):
            argv += [
                "-fsdev", f"local,id=fs{i},path={_opt(Path(path))},"
                          f"security_model=passthrough,multidevs=remap"
                          + (",readonly=on" if ro else ""),
                "-device", f"virtio-9p-pci,fsdev=fs{i},mount_tag={tag}",
            ]
        if spec.monitor:
            argv += monitor_devices()
        if spec.interactive:
            argv += [
                "-chardev", "stdio,id=term,signal=off",
                "-device", "virtio-serial-pci",
                "-device", "virtconsole,chardev=term",
            ]
        pass_fds = [con_fd, out_w, err_w, ctl_w]
        # qemu puts a terminal on stdio in raw mode; a killed qemu cannot restore it
        saved = _term_state() if spec.interactive else None
        try:
            proc = subprocess.Popen(
                argv,
                stdin=None if spec.interactive else subprocess.DEVNULL,
                stdout=None if spec.interactive else con_fd,
                stderr=con_fd,
                pass_fds=pass_fds,
                start_new_session=not spec.interactive,
                cwd=rundir,
            )
        except OSError as exc:
            for fd in (out_r, err_r, ctl_r):
                os.close(fd)
            raise LabError(f"cannot start {QEMU}: {exc}") from exc
        finally:
            for fd in (out_w, err_w, ctl_w, con_fd):
                os.close(fd)
        pumps = (
            _Pump(out_r, None if capture else out, capture),
            _Pump(err_r, None if capture else err, capture),
            _Pump(ctl_r, None, False),
        )
        try:
            return supervise(proc, spec, rundir, console, pumps,
                             boot_allowance=BOOT_ALLOWANCE)
        finally:
            if saved is not None:
                _term_restore(saved)


def virtio_disks(images: Sequence[Path], serials: Sequence[str] = ()) -> list[str]:
    """The -drive and -device options of the plain disks (virtio-blk, vda = the first),
    each with its serial when ``serials`` gives one (LabSpec.disk_serials)."""
    argv: list[str] = []
    for i, d in enumerate(images):
        serial = f",serial={serials[i]}" if i < len(serials) and serials[i] else ""
        argv += [
            "-drive", f"file={_opt(d)},format=raw,if=none,id=disk{i},"
                      "cache=writeback,discard=unmap",
            "-device", f"virtio-blk-pci,drive=disk{i}{serial}",
        ]
    return argv


def nvme_devices(controllers: list[list[Path]]) -> list[str]:
    """qemu options for the lab's NVMe controllers: controller ``i`` has namespace ``n + 1``
    on the image ``controllers[i][n]``. Each controller is on its own PCIe root port (q35),
    so that it can be removed and found again (its PCI function's remove, a rescan) like a
    hot-pluggable slot; each namespace has its own EUI-64 and UUID (core.nvme_eui64)."""
    argv: list[str] = []
    for i, images in enumerate(controllers):
        argv += [
            "-device", f"pcie-root-port,id=rp{i},chassis={i + 1},slot={i + 1}",
            "-device", f"nvme,id=nvmec{i},bus=rp{i},serial={nvme_serial(i)}",
        ]
        for nsid, d in enumerate(images, 1):
            drive = f"nvme{i}" if nsid == 1 else f"nvme{i}n{nsid}"
            argv += [
                "-drive", f"file={_opt(d)},format=raw,if=none,id={drive},"
                          "cache=writeback,discard=unmap",
                "-device", f"nvme-ns,drive={drive},bus=nvmec{i},nsid={nsid},"
                          f"eui64={nvme_eui64(i, nsid)},uuid={nvme_uuid(i, nsid)}",
            ]
    return argv


def monitor_devices(sock: str = "qmp.sock") -> list[str]:
    """qemu options for a QMP monitor the guest reaches (``LabSpec.monitor``): the monitor
    listens on a Unix socket in the run directory (qemu's working directory; a relative path
    keeps under the 108-byte limit of a socket's name), and a virtio-serial port named
    qmp.PORT_NAME is connected to that same socket, so what the guest writes to the port is
    the monitor's input (cachemgr/lab/qmp.py)."""
    return [
        "-chardev", f"socket,id=qmpsrv,path={sock},server=on,wait=off",
        "-mon", "chardev=qmpsrv,mode=control",
        "-chardev", f"socket,id=qmpport,path={sock}",
        "-device", "virtio-serial-pci,id=qmpser",
        "-device", f"virtserialport,bus=qmpser.0,chardev=qmpport,name={qmp.PORT_NAME}",
    ]


def _term_state() -> list[Any] | None:
    try:
        return termios.tcgetattr(0)
    except (termios.error, OSError):
        return None


def _term_restore(state: list[Any]) -> None:
    with contextlib.suppress(termios.error, OSError):
        termios.tcsetattr(0, termios.TCSADRAIN, state)


def _lab_env(rundir: Path) -> dict[str, str]:
    """The settings core.run wrote to ``rundir/lab.env`` (``K='v'`` lines)."""
    env: dict[str, str] = {}
    for line in (rundir / "lab.env").read_text().splitlines():
        words = shlex.split(line)
        if words and "=" in words[0]:
            k, _, v = words[0].partition("=")
            env[k] = v
    return env


def _opt(p: Path) -> str:
    """A path as a value inside a qemu option list (a comma is written as two)."""
    return str(p).replace(",", ",,")


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


def _store(target: Path, data: bytes) -> bool:
    """Write ``data`` to ``target`` atomically, dropping older siblings of the same kind.

    The siblings are the files whose name starts with the same word (``initramfs-``,
    ``vmlinux-``): images of another kernel or of older inputs. False when the directory is
    not writable.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return False
    kind = target.name.split("-", 1)[0]
    for old in target.parent.glob(f"{kind}-*"):
        if old != target:
            old.unlink(missing_ok=True)
    return True


def initramfs(info: kernels.KernelInfo, fallback_dir: Path) -> Path:
    """The cached initramfs for ``info`` (built when missing or when its inputs changed).

    Cached as ``<lab dir>/qemu/initramfs-<release>-<stamp>``; when the lab directory is not
    writable it is built into ``fallback_dir`` (the run directory) instead.
    """
    if not BUSYBOX.exists():
        raise LabError(f"{BUSYBOX} is missing", hint="apt-get install busybox-static")
    modules = resolve_modules(Path(info.modules) / info.release, INITRAMFS_MODULES)
    target = kernels.lab_dir() / "qemu" / f"initramfs-{info.release}-{_stamp(info, modules)}"
    if target.exists():
        return target
    image = build_initramfs(info, modules)
    if not _store(target, image):
        target = fallback_dir / "initramfs.cpio.gz"
        target.write_bytes(image)
    return target


# --- the kernel: uncompressed, booted through its PVH entry ----------------------------------

# Where a compressed kernel's payload can start, and how to unpack it (extract-vmlinux's list).
_PAYLOADS: tuple[tuple[bytes, str], ...] = (
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\x1f\x8b\x08", "gzip"),
)
_PVH_NOTE = 18  # XEN_ELFNOTE_PHYS32_ENTRY: the kernel has a PVH entry point


def _unpack(kind: str, data: bytes) -> bytes | None:
    try:
        if kind == "xz":
            return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)
        if kind == "gzip":
            return zlib.decompressobj(wbits=31).decompress(data)
        if shutil.which("zstd") is None:
            return None
        r = subprocess.run(["zstd", "-dcq"], input=data, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, check=False)
        return r.stdout or None
    except (lzma.LZMAError, zlib.error):
        return None


def has_pvh_entry(elf: bytes) -> bool:
    """Whether ``elf`` is an x86-64 ELF kernel with a PVH entry note (qemu boots it directly)."""
    if elf[:5] != b"\x7fELF\x02" or len(elf) < 64:
        return False
    try:
        return _pvh_note(elf)
    except struct.error:  # truncated or not a kernel
        return False


def _pvh_note(elf: bytes) -> bool:
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        ph = phoff + i * phentsize
        p_type, = struct.unpack_from("<I", elf, ph)
        if p_type != 4:  # PT_NOTE
            continue
        off, = struct.unpack_from("<Q", elf, ph + 0x08)
        size, = struct.unpack_from("<Q", elf, ph + 0x20)
        pos, end = off, off + size
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12: pos + 12 + namesz]
            if name == b"Xen\x00" and ntype == _PVH_NOTE:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def extract_vmlinux(bzimage: bytes) -> bytes | None:
    """The uncompressed ELF kernel inside a bzImage, if it has a PVH entry; else None."""
    for magic, kind in _PAYLOADS:
        pos = bzimage.find(magic)
        while pos >= 0:
            elf = _unpack(kind, bzimage[pos:])
            if elf and has_pvh_entry(elf):
                return elf
            pos = bzimage.find(magic, pos + 1)
    return None


def pvh_kernel(info: kernels.KernelInfo) -> str:
    """The kernel image to boot: the bzImage's uncompressed ELF (cached) when possible.

    Under TCG the bzImage's own decompressor costs ~5 s a boot; the uncompressed vmlinux,
    entered through its PVH note, skips it (and the BIOS's kernel loading). Cached as
    ``<lab dir>/qemu/vmlinux-<release>-<stamp>``; the bzImage is the fallback.
    """
    src = Path(info.kernel)
    st = src.stat()
    stamp = hashlib.sha256(f"{src}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    target = kernels.lab_dir() / "qemu" / f"vmlinux-{info.release}-{stamp}"
    marker = target.with_name(target.name + ".nopvh")
    if target.exists():
        return str(target)
    if marker.exists():
        return info.kernel
    elf = extract_vmlinux(src.read_bytes())
    if elf is None:
        log.info("lab: %s has no PVH entry; booting the compressed kernel", src)
        _store(marker, b"")
        return info.kernel
    return str(target) if _store(target, elf) else info.kernel
