"""Capture a kernel's bcache and device-mapper state into a fixture folder.

Unit tests run on these captures (tests/fixtures/<scenario>/), never on hand-written trees.
Run inside the lab after building a scenario, e.g.::

    cachemgr lab run --disks 1G,256M -- scripts/capture-fixtures.sh

What is copied: /sys/fs/bcache (every file, links kept as links), every /sys/block entry
(the link and its device directory, its bcache/, dm/, holders/, slaves/, queue/ basics with
the IO scheduler's tunables (queue/iosched/) and partitions) and the SCSI device attributes
behind ``device`` (vendor, model, wwid, vpd pages),
plus ``dmsetup table`` / ``dmsetup status`` / ``dmsetup info`` output, kernel/uevent_seqnum,
the kernel log's records (``kmsg.txt``: the first line of each /dev/kmsg record, what
backends/kernlog.py reads) and a meta.json naming the kernel. Write-only files are
recorded as empty files with their mode, so their presence is part of the capture.
``priority_stats`` is never read (it locks every bucket).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import time
from pathlib import Path

from cachemgr.backends import inuse
from cachemgr.backends.dmcache.command import words as dm_words
from cachemgr.core import runner
from cachemgr.core.errors import CommandError, UsageError
from cachemgr.core.sysfs import NEVER_READ, Sysfs

# Directory names not worth copying under a block device (large, volatile or irrelevant).
SKIP_DIRS = frozenset({"power", "trace", "mq", "integrity", "subsystem", "driver",
                       "bdi", "firmware_node", "physical_node", "generic", "bsg", "scsi_generic",
                       "scsi_disk", "block", "mpath"})
SKIP_FILES = frozenset({"uevent_seqnum"}) | NEVER_READ
MAX_FILE = 64 * 1024


class Capturer:
    def __init__(self, sysfs: Sysfs, out: Path) -> None:
        self.sys = sysfs
        self.out = out
        # deepest (depth, follow) each directory was walked with: a device first reached
        # through another's slaves/ link at depth 1 must be walked again from block/
        self.seen: dict[str, tuple[int, int]] = {}

    def dest(self, rel: str) -> Path:
        return self.out / "sys" / rel

    def copy_file(self, rel: str) -> None:
        src = self.sys.path(rel)
        dst = self.dest(rel)
        dst.parent.mkdir(parents=True, exist_ok=True)
        mode = stat.S_IMODE(src.lstat().st_mode)
        data = b""
        if mode & 0o444 and src.name not in SKIP_FILES:
            try:
                with open(src, "rb") as f:
                    data = f.read(MAX_FILE)
            except OSError:
                data = b""
        dst.write_bytes(data)
        os.chmod(dst, mode | 0o200)

    def copy_link(self, rel: str) -> str | None:
        target = self.sys.readlink(rel)
        if target is None:
            return None
        dst = self.dest(rel)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        os.symlink(target, dst)
        return os.path.normpath(os.path.join(os.path.dirname(rel), target))

    def copy_tree(self, rel: str, depth: int, follow: int = 1) -> None:
        """Copy ``rel`` (a directory) ``depth`` levels deep; follow links ``follow`` hops."""
        real = os.path.normpath(rel)
        done = self.seen.get(real)
        if done is not None and done[0] >= depth and done[1] >= follow:
            return
        self.seen[real] = (max(depth, done[0] if done else 0), max(follow, done[1] if done else 0))
        self.dest(rel).mkdir(parents=True, exist_ok=True)
        for name in self.sys.listdir(rel):
            child = f"{rel}/{name}"
            p = self.sys.path(child)
            if p.is_symlink():
                target = self.copy_link(child)
                if target and follow > 0 and name not in SKIP_DIRS and self.sys.is_dir(target):
                    self.copy_tree(target, depth=min(depth, 2), follow=follow - 1)
            elif p.is_dir():
                if depth > 0 and name not in SKIP_DIRS:
                    self.copy_tree(child, depth - 1, follow)
            elif p.is_file():
                self.copy_file(child)

    def capture_block(self) -> None:
        for name in self.sys.listdir("block"):
            if name.startswith(("loop", "ram")) and not self._in_use(name):
                continue
            target = self.copy_link(f"block/{name}")
            if target is None:
                continue
            # the device dir: bcache/ and dm/ fully, stats files, partitions, holders/slaves
            self.copy_tree(target, depth=2, follow=1)

    def _in_use(self, name: str) -> bool:
        """A loop or ram device worth capturing: set up (a size), or used by something
        (:func:`cachemgr.backends.inuse.uses`; a mounted or swapping one has a size, so
        /proc is not read)."""
        return (self.sys.read_opt(f"block/{name}/size") or "0") != "0" or bool(
            inuse.uses(self.sys, f"block/{name}", mountinfo=None, swaps=None))

    def capture_nvme(self) -> None:
        """NVMe controllers (serial, model, address...), each one's PCI function (its
        ``remove`` file) as bus/pci/devices/<function> reaches it, and bus/pci/rescan."""
        if not self.sys.is_dir("class/nvme"):
            return
        self.copy_tree("class/nvme", depth=1, follow=1)
        for c in self.sys.listdir("class/nvme"):
            addr = (self.sys.read_opt(f"class/nvme/{c}/address") or "").strip()
            target = self.copy_link(f"bus/pci/devices/{addr}") if addr and "/" not in addr \
                else None
            if target:
                self.copy_tree(target, depth=0, follow=0)
        if self.sys.exists("bus/pci/rescan"):
            self.copy_file("bus/pci/rescan")

    def capture_scsi(self) -> None:
        """SCSI hosts (scan, proc_name), scsi_debug's pseudo bus, each disk's device/ dir."""
        if self.sys.is_dir("class/scsi_host"):
            self.copy_tree("class/scsi_host", depth=1, follow=1)
        if self.sys.is_dir("bus/pseudo"):
            self.copy_tree("bus/pseudo", depth=3, follow=1)
        for name in self.sys.listdir("block"):
            dev = self.sys.resolve(f"block/{name}/device")
            if dev:
                self.copy_tree(dev, depth=2, follow=0)

    def capture_devnums(self) -> None:
        """dev/block/MAJ:MIN links (sysfs root): how a device node maps to its kernel name."""
        for entry in self.sys.listdir("dev/block"):
            self.copy_link(f"dev/block/{entry}")

    def capture_seqnum(self) -> None:
        """kernel/uevent_seqnum as it read at the end of the capture: what a poll's
        ScanCache compares (backends/scancache.py); a tree without it is read in full on
        every scan."""
        text = self.sys.read_opt("kernel/uevent_seqnum")
        if text is not None:
            self.dest("kernel").mkdir(parents=True, exist_ok=True)
            self.dest("kernel/uevent_seqnum").write_text(text + "\n")

    def capture_bcache(self) -> None:
        if self.sys.is_dir("fs/bcache"):
            self.copy_tree("fs/bcache", depth=4, follow=1)

    def capture_tools(self) -> None:
        """What the system's own tools say, for cross-checks in unit tests."""
        cmds = {
            "lsblk.json": ["lsblk", "-J", "-b", "-o",
                           "NAME,KNAME,MAJ:MIN,SIZE,TYPE,SERIAL,WWN,FSTYPE,UUID,MODEL"],
        }
        if os.path.exists("/run/udev/control"):
            cmds["udev-db.txt"] = ["udevadm", "info", "--export-db"]
        for fname, argv in cmds.items():
            try:
                (self.out / fname).write_text(runner.run(argv, timeout=60).stdout)
            except CommandError as exc:
                (self.out / fname).write_text(f"# {' '.join(argv)} failed: {exc}\n")
        lines = []
        for name in self.sys.listdir("block"):
            if name.startswith(("loop", "ram")):
                continue
            r = runner.run(["blkid", "-p", "-o", "export", f"/dev/{name}"], timeout=30,
                           check=False)
            if r.stdout.strip():
                lines.append(f"# /dev/{name}\n{r.stdout.strip()}\n")
        (self.out / "blkid.txt").write_text("\n".join(lines))

    def capture_dmsetup(self) -> None:
        outputs = {}
        for what in ("table", "status", "info"):
            try:
                outputs[what] = runner.run(["dmsetup", *dm_words(what)], timeout=30).stdout
            except CommandError as exc:
                outputs[what] = f"# dmsetup {what} failed: {exc}\n"
        for what, text in outputs.items():
            (self.out / f"dmsetup-{what}.txt").write_text(text)

    def capture_kmsg(self) -> None:
        """``kmsg.txt``: each /dev/kmsg record's first line (``PRI,SEQ,TS_USEC,FLAGS;MSG``),
        and ``uptime`` in meta.json: the log's clock when it was read (kernlog.Reader)."""
        from cachemgr.backends import kernlog

        (self.out / "kmsg.txt").write_text(
            "".join(r.split("\n", 1)[0] + "\n" for r in kernlog.records()))

    def capture_lvs(self) -> None:
        """``lvs.json``: lvm2's report (the fields cachemgr reads), when LVM owns a dm device."""
        from cachemgr.backends.dmcache.discover import dm_devices
        from cachemgr.backends.lvm import command as lvm_command

        if not any((d.uuid or "").startswith("LVM-") for d in dm_devices(Sysfs()).values()):
            return
        try:
            text = lvm_command.lvm(*lvm_command.lvs_argv(), timeout=60).stdout
        except CommandError as exc:
            text = f"# lvs failed: {exc}\n"
        (self.out / "lvs.json").write_text(text)

    def run(self, scenario: str, description: str) -> None:
        if self.out.exists() or self.out.is_symlink():
            # only an earlier capture is replaced: --out /home must not empty /home
            if not self.out.is_dir() or self.out.is_symlink() or (
                    any(self.out.iterdir()) and not (self.out / "meta.json").is_file()):
                raise UsageError(f"{self.out} exists and is not a capture",
                                 hint="name a new directory (or an earlier capture, which is "
                                      "replaced)")
            shutil.rmtree(self.out)
        self.out.mkdir(parents=True)
        self.capture_block()  # before fs/bcache, whose links reach devices at shallower depth
        self.capture_bcache()
        self.capture_scsi()
        self.capture_nvme()
        self.capture_devnums()
        self.capture_dmsetup()
        self.capture_lvs()
        self.capture_tools()
        self.capture_seqnum()
        self.capture_kmsg()
        record_libvirt(self.out, self.sys)  # libvirt's domains and the VMs' cgroups
        meta = {
            "scenario": scenario,
            "description": description,
            "kernel": platform.release(),
            "captured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "lab_backend": os.environ.get("LAB_BACKEND"),
            "uptime": time.clock_gettime(time.CLOCK_MONOTONIC),
        }
        (self.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def capture(out: Path, scenario: str, description: str = "", sysfs: Sysfs | None = None) -> None:
    Capturer(sysfs or Sysfs(), out).run(scenario, description)


def record_libvirt(out: Path, sysfs: Sysfs, uri: str | None = None) -> None:
    """What :class:`cachemgr.backends.virsh.CapturedVirsh` replays, written under ``out`` (a
    capture directory): the virsh outputs a VM scan asks for, the device numbers of the disk
    sources, the scopes' io.pressure / io.stat under machine.slice and the host's
    /proc/pressure/io and /proc/stat. Nothing when libvirt cannot be asked."""
    from cachemgr.backends import snapshot, virsh, vms

    live = virsh.LiveVirsh(uri)
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

        def domains(self) -> tuple[list[tuple[str, str, str]], list[str]]:
            return virsh.domains_by_output(self)

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
