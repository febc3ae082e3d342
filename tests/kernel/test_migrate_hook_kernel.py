"""The live-migration guard with libvirt's own daemon calling it (issue #35 item 3).

A bcache device over a multipath device (dm-multipath over a lab disk: shared storage as the
kernel shows it) in writeback with dirty data. libvirt's hook (libvirt/qemu-hook) is
installed as cachemgr install-udev installs it, into /etc/libvirt/hooks/qemu.d, and libvirtd
is told to read its hooks again (SIGHUP; a daemon hook that records the reload says when it
has).

A real live migration needs a second libvirtd with a host UUID of its own and a running qemu
on the source: two system daemons cannot share one guest (the qemu driver's state
directories are fixed for root), and qemu under the lab's TCG takes minutes. The incoming
half is libvirt's own, though: the test calls virDomainMigratePrepare3 (the call a source
libvirtd makes on the destination; libvirt.so exports it) on the lab's libvirtd with a
domain XML, and libvirtd runs ``qemu.d/cachemgr NAME migrate begin -`` with that XML on
stdin exactly as for a migration. The error the call returns is what ``virsh migrate``
prints on the source. A start (``virsh start``) runs ``prepare begin`` through the same
hook: with the policy's ``guard_start`` it is refused before qemu would start. With
``on_hazard = "writethrough"`` the hook switches and drains the cache itself and the
migration passes. Where the hook passes, a second script in qemu.d that sorts first
(``00-lab-stop``) stops the migration before qemu would start: libvirt runs every script and
reports the last failure, so its words mean cachemgr's hook passed, cachemgr's words that it
refused.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from cachemgr.core import runner
from tests.kernel import clirun, measure

ROOT = Path(__file__).resolve().parents[2]
DISKS = "256M,128M,64M"
HOOKS = Path("/etc/libvirt/hooks")
LOG = "CACHEMGR_MIGRATE_HOOK_LOG"
STOP = "lab: the rest of this migration is not run here"


def _domain(name: str, disk_xml: str) -> str:
    return (f"<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>"
            "<os><type arch='x86_64'>hvm</type></os>"
            f"<devices>{disk_xml}</devices></domain>")


def _block(dev: str) -> str:
    return (f"<disk type='block' device='disk'><driver name='qemu' type='raw' cache='none'/>"
            f"<source dev='{dev}'/><target dev='vda' bus='virtio'/></disk>")


class Libvirt:
    """libvirt.so through ctypes: the destination's half of a migration."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libvirt.so.0")
        lib.virConnectOpen.restype = ctypes.c_void_p
        lib.virConnectOpen.argtypes = [ctypes.c_char_p]
        lib.virDomainMigratePrepare3.restype = ctypes.c_int
        lib.virDomainMigratePrepare3.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_ulong, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        lib.virGetLastErrorMessage.restype = ctypes.c_char_p
        self.lib = lib
        self.conn = lib.virConnectOpen(b"qemu:///system")
        assert self.conn, lib.virGetLastErrorMessage()

    def prepare(self, xml: str) -> tuple[int, str]:
        """virDomainMigratePrepare3 (VIR_MIGRATE_LIVE) of ``xml``: (its return, the error)."""
        cookie, cookielen, uri = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_void_p()
        rc = self.lib.virDomainMigratePrepare3(
            self.conn, None, 0, ctypes.byref(cookie), ctypes.byref(cookielen),
            b"tcp://127.0.0.1:49152", ctypes.byref(uri), 1, None, 0, xml.encode())
        err = self.lib.virGetLastErrorMessage() or b""
        return rc, err.decode(errors="replace")


def _hup_libvirtd_and_wait() -> None:
    """libvirt reads which hooks exist at start and again on SIGHUP, when it also runs the
    daemon hook with ``- reload begin SIGHUP``: that hook's record is the sign."""
    seen = Path("/run/lab-libvirt-reloaded")
    seen.unlink(missing_ok=True)
    daemon = HOOKS / "daemon"
    daemon.write_text(f"#!/bin/sh\n[ \"$2\" = reload ] && echo \"$*\" >>{seen}\nexit 0\n")
    daemon.chmod(0o755)
    pid = int(runner.run(["pidof", "libvirtd"]).stdout.split()[0])
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + 120  # a bound on the wait, not a measurement
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert seen.exists(), "libvirtd did not run its daemon hook after SIGHUP"


def _hook_as_libvirt(args: list[str], xml: str) -> tuple[int, str, float]:
    """The installed hook run as virHookCall runs it (its arguments, the XML on stdin, the
    common environment): (exit status, stderr, seconds)."""
    import subprocess

    env = {"LC_ALL": "C", "HOME": "/"}  # what the lab's libvirtd passes (its error shows it)
    t0 = time.perf_counter()
    r = subprocess.run([str(HOOKS / "qemu.d" / "cachemgr"), *args], input=xml.encode(),
                       capture_output=True, env=env, timeout=120, check=False)
    dt = time.perf_counter() - t0
    assert r.stdout == b"", r.stdout  # libvirt would take it as a replacement XML
    return r.returncode, r.stderr.decode(errors="replace"), dt


@pytest.mark.kernel(disks=DISKS, libvirt=True, timeout=600)
def test_libvirt_refuses_an_incoming_migration_over_a_dirty_writeback_cache_on_multipath(
        lab_disks: list[str]) -> None:
    t_start = time.monotonic()  # the body's run time is recorded (never asserted)
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - t_start, 1)
    hdd, ssd, bare = lab_disks
    # shared storage: a multipath device (multipathd's UUID form) over the lab disk
    runner.run(["modprobe", "dm-multipath"], check=False)
    runner.run(["modprobe", "dm-round-robin"], check=False)
    sectors = runner.run(["blockdev", "--getsz", hdd]).stdout.strip()
    runner.run(["dmsetup", "create", "mpatha", "--uuid", "mpath-36001405lab0000001",
                "--table", f"0 {sectors} multipath 0 0 1 1 round-robin 0 1 1 {hdd} 1000"])
    r = clirun.in_process("create", "bcache", "--backing", "/dev/mapper/mpatha", "--cache",
                          ssd, "--bucket", "128k", "--mode", "writeback")
    assert r.returncode == 0, r.stderr
    # dirty data: 4 MiB written, under writeback_percent's 10 % of the cache (the kernel
    # writes it back at its 4 KiB/s floor)
    runner.run(["dd", "if=/dev/urandom", "of=/dev/bcache0", "bs=1M", "count=4",
                "oflag=direct", "status=none"], timeout=120)

    phase("cache built, dirty")
    # the hook, as install-udev installs it; an interpreter that has this checkout (libvirt
    # passes no PYTHONPATH)
    py = Path("/run/cachemgr-hook/python")
    py.parent.mkdir(parents=True, exist_ok=True)
    py.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    r_inst = runner.run([str(ROOT / "scripts" / "install-udev.sh"), "--python", str(py),
                         "--rules-dir", "/run/cachemgr-hook/rules", "--hooks-dir", str(HOOKS),
                         "--no-systemd", "--no-reload"])
    assert f"installed {HOOKS}/qemu.d/cachemgr" in r_inst.stderr
    _hup_libvirtd_and_wait()
    lv = Libvirt()

    phase("hook installed, libvirtd reloaded")
    # the VM view marks the hazard
    doc = clirun.in_process("vms", "--json")
    assert doc.returncode == 0, doc.stderr
    runner.run(["virsh", "-q", "-c", "qemu:///system", "define", "/dev/stdin"],
               input=_domain("vm1", _block("/dev/bcache0")))
    doc = clirun.in_process("vms")
    assert "migration hazard: /dev/bcache0 is a host-local cache over shared storage" in \
        doc.stdout and "multipath" in doc.stdout, doc.stdout

    phase("VM view")
    # 1. refused: libvirt ran the hook and reports its exit status and stderr
    xml = _domain("vm1", _block("/dev/bcache0"))
    rc, err = lv.prepare(xml)
    assert rc < 0
    assert "Hook script execution failed" in err and "unexpected exit status 3" in err, err
    assert "qemu.d/cachemgr vm1 migrate begin -" in err, err
    assert "cachemgr: refused the incoming migration of domain 'vm1'" in err, err
    assert "in writeback" in err and "cachemgr mode /dev/bcache0 writethrough --drain" in err
    measure.report(LOG, "refused", libvirt_error=err)
    # nothing was started
    assert runner.run(["virsh", "-q", "-c", "qemu:///system", "list"]).stdout.strip() == ""

    # a stand-in for the rest of the migration, sorting before cachemgr: its failure is the
    # one libvirt reports only when cachemgr's hook passed
    stop = HOOKS / "qemu.d" / "00-lab-stop"
    stop.write_text(f"#!/bin/sh\ncat >/dev/null\n[ \"$2\" = migrate ] && "
                    f"{{ echo '{STOP}' >&2; exit 1; }}\nexit 0\n")
    stop.chmod(0o755)
    rc, err = lv.prepare(xml)
    assert rc < 0 and "cachemgr: refused" in err and STOP not in err, err

    phase("refused by libvirtd")
    # 2. a VM on no cache (a file on ext4 on a bare disk): passes, and fast
    runner.run(["mkfs.ext4", "-q", "-F", bare], timeout=120)
    mnt = Path("/run/cachemgr-hook/bare")
    mnt.mkdir(exist_ok=True)
    runner.run(["mount", bare, str(mnt)])
    (mnt / "vm.img").write_bytes(b"\0" * (1 << 20))
    plain = _domain("vm2", "<disk type='file' device='disk'><driver name='qemu' "
                                f"type='raw' cache='none'/><source file='{mnt}/vm.img'/>"
                                "<target dev='vda' bus='virtio'/></disk>")
    rc, err = lv.prepare(plain)
    assert rc < 0 and STOP in err and "cachemgr" not in err, err
    times = []
    for _ in range(5):
        code, stderr, dt = _hook_as_libvirt(["vm2", "migrate", "begin", "-"], plain)
        assert (code, stderr) == (0, "")
        times.append(dt)
    others = []
    for _ in range(5):
        code, stderr, dt = _hook_as_libvirt(["vm2", "started", "begin", "-"], plain)
        assert (code, stderr) == (0, "")
        others.append(dt)
    # the interpreter's own start, for comparison: the hook's floor
    bare_py = []
    for _ in range(5):
        t0 = time.perf_counter()
        runner.run([str(py), "-c", "pass"])
        bare_py.append(time.perf_counter() - t0)
    # a VM on a device-mapper device with no cache under it (the multipath device itself):
    # the full look (the snapshot), then a pass
    on_dm = _domain("vm3", _block("/dev/mapper/mpatha"))
    dm_times = []
    for _ in range(2):
        code, stderr, dt = _hook_as_libvirt(["vm3", "migrate", "begin", "-"], on_dm)
        assert (code, stderr) == (0, "")
        dm_times.append(dt)
    dirty = [_hook_as_libvirt(["vm1", "migrate", "begin", "-"], xml) for _ in range(2)]
    assert all(c == 3 for c, _, _ in dirty), dirty
    measure.report(LOG, "hook run time", no_cache_migrate_s=sorted(times),
                   other_ops_s=sorted(others), python_start_s=sorted(bare_py),
                   dm_no_cache_migrate_s=sorted(dm_times),
                   dirty_cache_migrate_s=sorted(
                       d for _, _, d in dirty))

    phase("timings")
    # 3. made safe by the command the refusal names: the migration passes the hook
    r = clirun.in_process("mode", "/dev/bcache0", "writethrough", "--drain")
    assert r.returncode == 0, r.stderr
    rc, err = lv.prepare(xml)
    assert rc < 0 and STOP in err and "cachemgr" not in err, err
    code, stderr, _ = _hook_as_libvirt(["vm1", "migrate", "begin", "-"], xml)
    # passed, the cache's copies dropped first (issue #42: tests/kernel/test_coherence_kernel.py)
    assert code == 0 and "/dev/bcache0: every cached copy dropped" in stderr, stderr

    phase("made safe, passed")
    # 4. the policy's guard_start: libvirt's own `virsh start` runs the hook ("prepare
    # begin") and fails before qemu starts
    r = clirun.in_process("mode", "/dev/bcache0", "writeback")
    assert r.returncode == 0, r.stderr
    runner.run(["dd", "if=/dev/urandom", "of=/dev/bcache0", "bs=1M", "count=4",
                "oflag=direct", "status=none"], timeout=120)
    pol = Path("/etc/cachemgr/cachemgr.toml")
    pol.parent.mkdir(parents=True, exist_ok=True)
    pol.write_text("version = 1\n[migration]\nguard_start = true\n")
    r_start = runner.run(["virsh", "-c", "qemu:///system", "start", "vm1"], check=False,
                         timeout=300)
    assert r_start.returncode != 0, r_start.stdout
    assert "Hook script execution failed" in r_start.stderr, r_start.stderr
    assert "vm1 prepare begin -) unexpected exit status 3" in r_start.stderr, r_start.stderr
    assert "cachemgr: refused the start of domain 'vm1'" in r_start.stderr, r_start.stderr
    assert runner.run(["virsh", "-q", "-c", "qemu:///system", "list"]).stdout.strip() == ""
    measure.report(LOG, "start refused", virsh_stderr=r_start.stderr)

    phase("start refused")
    # 5. on_hazard = "writethrough": the hook makes the cache safe itself (cachemgr mode
    # through the gate) and the migration passes it
    pol.write_text('version = 1\n[migration]\non_hazard = "writethrough"\n')
    rc, err = lv.prepare(xml)
    assert rc < 0 and STOP in err and "refused" not in err, err
    b = Path("/sys/block/bcache0/bcache")
    assert "[writethrough]" in (b / "cache_mode").read_text()
    assert (b / "state").read_text().strip() == "clean"
    pol.unlink()
    stop.unlink()
    phase("hook made it safe, passed")
    measure.report(LOG, "test body", phases_s=phases)
