"""The live-migration guard (cachemgr/ops/migrate.py, cachemgr/cli/hook.py, libvirt/qemu-hook)
on the VMs capture (tests/fixtures/vms-uml: vm-bc's disk is /dev/bcache0 over the dm device
"hdd"), made shared storage here by giving that dm device a multipath UUID, and its cache
writeback and dirty by writing bcache's files in the copy. The kernel test runs it in the lab
with libvirtd calling it (tests/kernel/test_migrate_hook_kernel.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cachemgr.backends import snapshot, virsh, vms
from cachemgr.cli import hook
from cachemgr.core import safexml
from cachemgr.core.errors import UnsafeError
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import migrate
from cachemgr.procedures import policy as policy_mod
from cachemgr.procedures.policy import MigrationPolicy

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "tests" / "fixtures" / "vms-uml"
HDD = "devices/virtual/block/dm-0"  # bcache0's backing device in the capture
BC = "devices/virtual/block/bcache0/bcache"


def _xml(name: str) -> str:
    calls = json.loads((CAPTURE / "libvirt" / "calls.json").read_text())
    return next(v for k, v in calls.items()
                if k.startswith("dumpxml") and f"<name>{name}</name>" in v)


def _capture(tmp_path: Path, *, shared: bool = True, mode: str = "writeback",
             dirty: str = "12.0M") -> tuple[Sysfs, virsh.VirshSource]:
    cap = tmp_path / "cap"
    shutil.copytree(CAPTURE, cap, symlinks=True)
    sys_ = cap / "sys"
    if shared:
        (sys_ / HDD / "dm" / "uuid").write_text("mpath-3600140512345\n")
    words = ["writethrough", "writeback", "writearound", "none"]
    (sys_ / BC / "cache_mode").write_text(
        " ".join(f"[{w}]" if w == mode else w for w in words) + "\n")
    (sys_ / BC / "dirty_data").write_text(dirty + "\n")
    debug = sys_ / BC / "writeback_rate_debug"  # where the scan reads dirty data first
    debug.write_text("".join(f"dirty:\t\t{dirty}\n" if line.startswith("dirty:") else line
                             for line in debug.read_text().splitlines(keepends=True)))
    (sys_ / BC / "state").write_text(("dirty" if dirty != "0.0k" else "clean") + "\n")
    return Sysfs(sys_), virsh.CapturedVirsh(cap)


@pytest.fixture
def dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The invalidations the guard asks for (recorded, not run: the capture is no kernel),
    with the state directory in ``tmp_path``."""
    from cachemgr.ops import coherence
    from cachemgr.ops.control import Result

    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    calls: list[str] = []

    def fake(sysfs: Sysfs, target: str, **_: object) -> Result:
        calls.append(target)
        return Result(lines=[f"{target}: dropped"])

    monkeypatch.setattr(coherence, "invalidate", fake)
    return calls


def test_a_cache_over_multipath_in_writeback_and_dirty_is_refused(tmp_path: Path) -> None:
    sysfs, src = _capture(tmp_path)
    (h,) = migrate.hazards(sysfs, _xml("vm-bc"), src)
    assert (h.disk, h.node, h.mode, h.dirty, h.shared) == (
        "vda", "/dev/bcache0", "writeback", 12 << 20, "/dev/dm-0")
    assert h.unsafe and h.shared_why == "a multipath device"
    with pytest.raises(UnsafeError) as e:
        migrate.guard(sysfs, "vm-bc", "migrate", _xml("vm-bc"), MigrationPolicy(), src=src)
    assert e.value.exit_code == 3
    assert "refused the incoming migration of domain 'vm-bc'" in e.value.message
    assert "/dev/bcache0" in e.value.message and "in writeback, 12.0 MiB dirty" in e.value.message
    assert e.value.hint is not None
    assert "cachemgr mode /dev/bcache0 writethrough --drain" in e.value.hint


@pytest.mark.parametrize(("mode", "dirty", "unsafe"), [
    ("writethrough", "0.0k", False),  # what `mode writethrough --drain` leaves
    ("writethrough", "4.0k", True),  # switched, not drained yet
    ("writeback", "0.0k", True),  # clean now, dirty again with the VM's next write
    ("none", "0.0k", False),
])
def test_only_writethrough_or_none_and_clean_passes(tmp_path: Path, mode: str, dirty: str,
                                                    unsafe: bool,
                                                    dropped: list[str]) -> None:
    sysfs, src = _capture(tmp_path, mode=mode, dirty=dirty)
    (h,) = migrate.hazards(sysfs, _xml("vm-bc"), src)
    assert h.unsafe is unsafe
    if unsafe:
        with pytest.raises(UnsafeError):
            migrate.guard(sysfs, "vm-bc", "migrate", _xml("vm-bc"), MigrationPolicy(), src=src)
        assert dropped == []  # refused before anything changed
    else:
        # passed, and the cache's copies dropped before the VM runs (ops/coherence.py)
        assert migrate.guard(sysfs, "vm-bc", "migrate", _xml("vm-bc"), MigrationPolicy(),
                             src=src) == ["/dev/bcache0: dropped"]
        assert dropped == ["/dev/bcache0"]


def test_a_cache_over_local_storage_is_no_migration_hazard(tmp_path: Path) -> None:
    # the same dirty writeback cache over a plain disk: a migration copies the storage (or
    # cannot happen); the VM reads it through this host's cache
    sysfs, src = _capture(tmp_path, shared=False)
    assert migrate.hazards(sysfs, _xml("vm-bc"), src) == []
    assert migrate.guard(sysfs, "vm-bc", "migrate", _xml("vm-bc"), MigrationPolicy(),
                         src=src) == []


def test_the_vm_view_marks_a_cache_over_shared_storage(tmp_path: Path) -> None:
    sysfs, _ = _capture(tmp_path)
    snap = snapshot.take(sysfs, vms=True)
    assert snap.vms is not None
    by = {v.name: v for v in snap.vms.vms}
    marks = [w for w in by["vm-bc"].disks[0].warnings if w.startswith("migration hazard")]
    assert len(marks) == 1 and "/dev/bcache0" in marks[0] and "multipath" in marks[0]
    assert "cachemgr mode /dev/bcache0 writethrough --drain" in marks[0]
    # the others: not over shared storage
    assert not any(w.startswith("migration hazard") for v in ("vm-dm", "vm.bare")
                   for d in by[v].disks for w in d.warnings)
    sysfs, _ = _capture(tmp_path / "local", shared=False)
    snap = snapshot.take(sysfs, vms=True)
    assert snap.vms is not None
    assert not any(w.startswith("migration hazard") for v in snap.vms.vms
                   for d in v.disks for w in d.warnings)


@pytest.mark.parametrize(("path", "why"), [
    ("devices/platform/host3/session1/target3:0:0/3:0:0:1", "an iSCSI disk"),
    ("devices/pci0000:00/0000:00:02.0/host4/rport-4:0-2/target4:0:0/4:0:0:0",
     "a Fibre Channel disk"),
    ("devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0", None),
])
def test_shared_scsi_disks_by_their_transport(tmp_path: Path, path: str,
                                              why: str | None) -> None:
    (tmp_path / path).mkdir(parents=True)
    (tmp_path / "block" / "sdb").mkdir(parents=True)
    (tmp_path / "block" / "sdb" / "device").symlink_to(tmp_path / path)
    assert vms.shared_kind(Sysfs(tmp_path), "sdb") == why
    assert vms.shared_kind(Sysfs(tmp_path), "rbd0") == "an RBD image (Ceph)"


def test_a_domain_xml_with_a_doctype_is_refused_before_it_is_read() -> None:
    bomb = ('<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa">'
            '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><domain><name>&b;</name></domain>')
    with pytest.raises(safexml.UnsafeXml):
        migrate.disk_sources(bomb)
    with pytest.raises(Exception, match="DOCTYPE"):
        vms.parse_domain(bomb)
    ext = '<!DOCTYPE d SYSTEM "file:///etc/shadow"><domain/>'
    with pytest.raises(safexml.UnsafeXml):
        safexml.check(ext)
    # the hook: an arriving VM with such a definition is refused (exit 1), a start passes
    assert hook.run(["x", "migrate", "begin", "-"], bomb) == 1
    assert hook.run(["x", "prepare", "begin", "-"], bomb) == 0


def test_disk_sources_are_data(tmp_path: Path) -> None:
    xml = ("<domain><name>a;rm -rf /</name><devices>"
           "<disk type='block' device='disk'><source dev='/dev/$(reboot)'/>"
           "<target dev='vda'/></disk>"
           "<disk type='file' device='cdrom'><source file='/x.iso'/><target dev='hdc'/></disk>"
           "<disk type='network' device='disk'><source protocol='rbd' name='p/i'/>"
           "<target dev='vdb'/></disk>"
           "<disk type='file'><source file='../../etc/passwd'/><target dev='vdc'/></disk>"
           "</devices></domain>")
    assert migrate.disk_sources(xml) == [("vda", "/dev/$(reboot)"),
                                         ("vdc", "../../etc/passwd")]
    # none of them is a device here: nothing to look at
    assert not migrate.needs_a_look(xml, sys_root=str(tmp_path))


def test_a_vm_on_no_cache_passes_on_the_fast_path(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """No bcache or device-mapper device under any disk: the snapshot is never read."""
    img = tmp_path / "vm.img"
    img.write_bytes(b"\0" * 4096)
    num = migrate.devno(str(img))
    assert num is not None
    # a tree where that device is a plain disk
    disk = tmp_path / "sys" / "devices" / "virtual" / "block" / "vdz"
    (disk / "slaves").mkdir(parents=True)
    (tmp_path / "sys" / "dev" / "block").mkdir(parents=True)
    (tmp_path / "sys" / "dev" / "block" / num).symlink_to(disk)

    def no(*_: object, **__: object) -> object:
        raise AssertionError("the snapshot was read for a VM on no cache")

    monkeypatch.setattr(migrate, "hazards", no)
    xml = (f"<domain><name>vm</name><devices><disk type='file' device='disk'>"
           f"<source file='{img}'/><target dev='vda'/></disk></devices></domain>")
    assert hook.run(["vm", "migrate", "begin", "-"], xml, sys_root=str(tmp_path / "sys")) == 0
    # the same disk with a dm device under it: a look (which here fails: refused, exit 1)
    dm = tmp_path / "sys" / "devices" / "virtual" / "block" / "dm-7"
    dm.mkdir(parents=True)
    (disk / "slaves" / "dm-7").symlink_to(dm)
    assert migrate.needs_a_look(xml, sys_root=str(tmp_path / "sys"))
    assert hook.run(["vm", "migrate", "begin", "-"], xml, sys_root=str(tmp_path / "sys"),
                    policy_path=str(tmp_path / "none.toml")) == 1
    # every other operation passes at once, whatever is under the VM
    for op in ("start", "started", "stopped", "release", "reconnect", "attach", "restore"):
        assert hook.run(["vm", op, "begin", "-"], xml, sys_root=str(tmp_path / "sys")) == 0


def test_the_fast_readers_root_is_sysfs_own() -> None:
    from cachemgr.core import sysfs, sysfs_lite

    assert sysfs_lite.ROOT == sysfs.DEFAULT_ROOT


def test_the_policy_table() -> None:
    pol = policy_mod.parse('version = 1\n[migration]\non_hazard = "writethrough"\n'
                           'guard_start = true\ndrain_timeout = 30\n')
    assert pol.migration == MigrationPolicy("writethrough", True, 30)
    assert policy_mod.parse(policy_mod.dumps(pol)) == pol
    assert policy_mod.parse("version = 1\n").migration == MigrationPolicy()
    with pytest.raises(policy_mod.PolicyError) as e:
        policy_mod.parse('[migration]\non_hazard = "drain"\ndrain_timeout = 0\nx = 1\n')
    assert [p.line for p in e.value.problems] == [2, 3, 4]


def _wrapper(tmp_path: Path, python: str) -> Path:
    w = tmp_path / "cachemgr"
    w.write_text((ROOT / "libvirt" / "qemu-hook").read_text().replace("@PYTHON@", python)
                 .replace("@ARGS@", ""))
    w.chmod(0o755)
    return w


def _as_libvirt(hook_path: Path, *args: str, xml: str,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """As libvirt's virHookCall runs it: NAME OP SUBOP EXTRA, the XML on stdin, its common
    environment only (the lab's libvirtd 9.0 passes LC_ALL=C and HOME=/, no PATH)."""
    base = {"LC_ALL": "C", "HOME": "/"}
    return subprocess.run([str(hook_path), *args], input=xml.encode(), capture_output=True,
                          env={**base, **(env or {})}, timeout=120, check=False)


def test_the_wrapper_as_libvirt_runs_it(tmp_path: Path) -> None:
    xml = _xml("vm.bare")
    # cachemgr's interpreter gone (a hook left behind): every operation passes
    gone = _wrapper(tmp_path, "/nonexistent/python3")
    for op in ("migrate", "prepare", "start", "reconnect"):
        r = _as_libvirt(gone, "vm.bare", op, "begin", "-", xml=xml)
        assert (r.returncode, r.stdout) == (0, b""), (op, r)
    # this interpreter (the checkout on its path: libvirt passes no PYTHONPATH, so a wrapper
    # of the interpreter stands for an installed one)
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    w = _wrapper(tmp_path / ".", str(py))
    r = _as_libvirt(w, "vm.bare", "migrate", "begin", "-", xml=xml)
    assert (r.returncode, r.stdout) == (0, b""), r  # its image is not on this host
    bomb = '<!DOCTYPE d [<!ENTITY a "b">]><domain>&a;</domain>'
    r = _as_libvirt(w, "x", "migrate", "begin", "-", xml=bomb)
    assert r.returncode == 1 and r.stdout == b"" and b"DOCTYPE" in r.stderr, r
    r = _as_libvirt(w, "x", "prepare", "begin", "-", xml=bomb)
    assert (r.returncode, r.stdout) == (0, b""), r


def test_the_installer_puts_the_hook_where_hooks_dir_says(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    assert bash
    hooks = tmp_path / "hooks"
    r = subprocess.run([bash, str(ROOT / "scripts" / "install-udev.sh"), "--python",
                        sys.executable, "--rules-dir", str(tmp_path / "rules"),
                        "--hooks-dir", str(hooks), "--no-systemd", "--no-reload"],
                       capture_output=True, text=True, timeout=60, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    installed = hooks / "qemu.d" / "cachemgr"
    assert f"installed {installed}" in r.stderr
    text = installed.read_text()
    assert f"exec {sys.executable} -m cachemgr.cli.hook" in text and "@PYTHON@" not in text
    assert os.access(installed, os.X_OK)
    # rules elsewhere and no --hooks-dir: the live /etc/libvirt is left alone
    r = subprocess.run([bash, str(ROOT / "scripts" / "install-udev.sh"), "--python",
                        sys.executable, "--rules-dir", str(tmp_path / "rules2"),
                        "--no-systemd", "--no-reload"],
                       capture_output=True, text=True, timeout=60, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and "qemu.d" not in r.stderr, r.stderr
    r = subprocess.run([bash, str(ROOT / "scripts" / "install-udev.sh"), "--uninstall",
                        "--rules-dir", str(tmp_path / "rules"), "--hooks-dir", str(hooks),
                        "--no-systemd", "--no-reload"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and not installed.exists(), r.stderr


def test_the_policy_path_reaches_the_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """install-udev --policy PATH: the installed hook passes ``--policy 'PATH'`` before
    libvirt's arguments (quoted: a path with a space is one word), and the hook reads it."""
    bash = shutil.which("bash")
    assert bash
    hooks = tmp_path / "hooks"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([bash, str(ROOT / "scripts" / "install-udev.sh"), "--python",
                        sys.executable, "--rules-dir", str(tmp_path / "rules"), "--hooks-dir",
                        str(hooks), "--policy", "/srv/cache policy.toml", "--no-systemd",
                        "--no-reload"], capture_output=True, text=True, timeout=60,
                       check=False, env=env)
    assert r.returncode == 0, r.stderr
    text = (hooks / "qemu.d" / "cachemgr").read_text()
    assert "-m cachemgr.cli.hook --policy '/srv/cache policy.toml' \"$@\"" in text
    seen: list[tuple[list[str], str | None]] = []
    monkeypatch.setattr(hook, "run", lambda argv, xml, *, sys_root, policy_path: seen.append(
        (list(argv), policy_path)) or 0)
    monkeypatch.setattr(hook, "_quiet_stdout", lambda: None)
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # noqa: SIM115
    assert hook.main(["--policy", "/srv/cache policy.toml", "vm", "migrate", "begin", "-"]) == 0
    assert hook.main(["vm", "migrate", "begin", "-"]) == 0
    assert seen == [(["vm", "migrate", "begin", "-"], "/srv/cache policy.toml"),
                    (["vm", "migrate", "begin", "-"], None)]
    # a path the hook's shell line cannot hold: refused before anything is written
    r = subprocess.run([bash, str(ROOT / "scripts" / "install-udev.sh"), "--python",
                        sys.executable, "--rules-dir", str(tmp_path / "rules3"), "--hooks-dir",
                        str(tmp_path / "hooks3"), "--policy", "/srv/it's.toml",
                        "--no-systemd", "--no-reload"], capture_output=True, text=True,
                       timeout=60, check=False, env=env)
    assert r.returncode == 2 and "cannot name a policy path" in r.stderr, r.stderr
    assert not (tmp_path / "rules3").exists() and not (tmp_path / "hooks3").exists()


def test_a_start_looks_only_at_marked_caches_without_guard_start(
        tmp_path: Path, dropped: list[str]) -> None:
    from cachemgr.procedures import coherence

    sysfs, src = _capture(tmp_path)  # writeback and dirty
    (h,) = migrate.hazards(sysfs, _xml("vm-bc"), src)
    assert h.key is not None and h.unsafe
    coherence.left("another-device", "/dev/bcache9", "vm9", "vda")
    # a start is not guarded by default: another cache's mark changes nothing here
    assert migrate.guard(sysfs, "vm-bc", "prepare", _xml("vm-bc"), MigrationPolicy(),
                         src=src) == []
    # this cache marked (the VM left, its disk written elsewhere): looked at, and refused
    coherence.left(h.key, h.node, "vm-bc", "vda")
    with pytest.raises(UnsafeError) as e:
        migrate.guard(sysfs, "vm-bc", "prepare", _xml("vm-bc"), MigrationPolicy(), src=src)
    assert "refused the start" in e.value.message
    # made clean and writethrough: its copies dropped before the start
    sysfs, src = _capture(tmp_path / "2", mode="writethrough", dirty="0.0k")
    assert migrate.guard(sysfs, "vm-bc", "prepare", _xml("vm-bc"), MigrationPolicy(),
                         src=src) == ["/dev/bcache0: dropped"]
    assert dropped == ["/dev/bcache0"]


def test_release_marks_the_caches_under_the_vm(tmp_path: Path, dropped: list[str]) -> None:
    from cachemgr.procedures import coherence

    sysfs, src = _capture(tmp_path, mode="writethrough", dirty="0.0k")
    said = migrate.release(sysfs, "vm-bc", _xml("vm-bc"), src)
    assert said == ["/dev/bcache0: marked: VM 'vm-bc' left; its disk vda may be written "
                    "elsewhere"]
    (m,) = coherence.marks(coherence.LEFT)
    assert (m.device, m.domain, m.data["disk"]) == ("/dev/bcache0", "vm-bc", "vda")
    # the next arrival drops the copies (here recorded) ...
    assert migrate.guard(sysfs, "vm-bc", "migrate", _xml("vm-bc"), MigrationPolicy(),
                         src=src) == ["/dev/bcache0: dropped"]
    # ... and a cache over local storage is never marked
    coherence.done(m.key)
    sysfs2, src2 = _capture(tmp_path / "2", shared=False)
    assert migrate.release(sysfs2, "vm-bc", _xml("vm-bc"), src2) == []
    assert coherence.marks() == []
    # the hook itself never fails a release (nothing here is a cache on this host)
    assert hook.run(["vm-bc", "release", "end", "-"], _xml("vm-bc"),
                    sys_root=str(sysfs.root)) == 0
