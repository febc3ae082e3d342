"""The VMs above the caches, on a capture of the lab (tests/fixtures/vms-uml: libvirtd's three
domains on bcache0, dm-cache vc and a file on ext4 on a bare disk; one qemu scope under
machine.slice that did 4 s of writes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachemgr.backends import snapshot, virsh, vms
from cachemgr.core.errors import UsageError
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import vms as vm_ops
from cachemgr.ops.render import status_table

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vms-uml"
SYS = Sysfs(CAPTURE / "sys")


def _calls() -> dict[str, str]:
    return json.loads((CAPTURE / "libvirt" / "calls.json").read_text())


def _scan() -> dict[str, object]:
    snap = snapshot.take(SYS, vms=True)
    assert snap.vms is not None
    return {v.name: v for v in snap.vms.vms}


def test_each_domain_disk_is_followed_down_to_its_cache() -> None:
    by = _scan()
    assert sorted(by) == ["vm-bc", "vm-dm", "vm.bare"]
    bc, dm, bare = (by[n].disks[0] for n in ("vm-bc", "vm-dm", "vm.bare"))  # type: ignore[attr-defined]
    assert (bc.source, bc.stack, bc.caches, bc.cache) == (
        "/dev/bcache0", ("bcache0",), ("/dev/bcache0",), "none")
    vc = SYS.resolve("dev/block/253:2")
    assert vc is not None and dm.stack == (Path(vc).name,) and dm.caches == ("/dev/mapper/vc",)
    assert bare.source_type == "file" and bare.source.endswith("/vm-bare.img")
    assert bare.stack == ("ubdf",) and bare.caches == () and bare.unresolved is None
    assert all(v.state == "shut off" and v.domain_id is None for v in by.values())  # type: ignore[attr-defined]


def test_warnings_follow_the_vm_and_host_cache_modes() -> None:
    by = _scan()
    assert by["vm-bc"].warnings == ()  # type: ignore[attr-defined]
    dm = by["vm-dm"].warnings  # type: ignore[attr-defined]
    assert any("live migration" in w for w in dm) and any("two write-back layers" in w
                                                         for w in dm)
    bare = by["vm.bare"].warnings  # type: ignore[attr-defined]
    assert any("ignores the guest's flushes" in w for w in bare)
    assert not any("two write-back layers" in w for w in bare)  # no cache under it
    # the rule itself: read-only disks have none; mode none under a disk is said
    assert vms.vm_cache_warnings("unsafe", True, [CacheMode.WRITEBACK]) == []
    assert vms.vm_cache_warnings("directsync", False, []) == []
    assert any("runs at the backing disk's speed" in w
               for w in vms.vm_cache_warnings("none", False, [CacheMode.NONE]))


def test_the_scope_of_a_domain_gives_its_io_counters() -> None:
    v = _scan()["vm-bc"]
    assert v.cgroup == "machine.slice/machine-qemu\\x2d7\\x2dvm\\x2dbc.scope"  # type: ignore[attr-defined]
    # its writes to its own disk (bcache0), once: not again on the disks under bcache0
    assert v.io is not None and v.io.wios == 189 and v.io.wbytes == 189 * 4096  # type: ignore[attr-defined]
    assert v.pressure is None  # the UML kernel has no PSI  # type: ignore[attr-defined]
    assert _scan()["vm-dm"].cgroup is None  # type: ignore[attr-defined]


def test_status_json_and_text_name_the_vms_each_cache_serves() -> None:
    snap = snapshot.take(SYS, vms=True)
    doc = snapshot.to_json(snap)
    served = {d["device"]: [(v["name"], v["disk"], v["cache"]) for v in d["vms"]]
              for d in doc["devices"]}
    assert served == {"/dev/bcache0": [("vm-bc", "vda", "none")],
                      "/dev/mapper/vc": [("vm-dm", "vda", "writeback")]}
    assert [v["name"] for v in doc["vms"]] == ["vm-bc", "vm-dm", "vm.bare"]
    assert "VMs on /dev/mapper/vc: vm-dm (vda, cache=writeback)" in status_table(snap)
    plain = snapshot.to_json(snapshot.take(SYS))
    assert "vms" not in plain and all("vms" not in d for d in plain["devices"])


def test_libvirt_unreachable_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    class Down:
        uri = "qemu:///system"

        def available(self) -> str | None:
            return "libvirt's daemon is not running (no socket under /run/libvirt)"

        def output(self, *args: str) -> str:
            raise AssertionError("not asked when unavailable")

        def devno(self, path: str) -> tuple[str, bool] | None:
            raise AssertionError("not asked")

    s = vms.scan(SYS, snapshot.take(SYS), Down())
    assert s.vms == () and s.warnings == ("VMs: libvirt's daemon is not running (no socket "
                                          "under /run/libvirt)",)


@pytest.mark.parametrize("name,part", [
    ("vm-bc", "vm-bc"), ("vm.bare", "vm.bare"), ("--help", "help"), ("a..b--c", "a.b-c"),
    ("web 01 (prod)", "web01prod"), ("héllo", "hllo"), ("-.x.-", "x"),
])
def test_machine_names_as_libvirt_makes_them(name: str, part: str) -> None:
    assert vms.machine_name_part(name) == part
    scope = "machine-" + f"qemu-3-{part}".replace("-", "\\x2d") + ".scope"
    assert vms.scope_machine(scope) == f"qemu-3-{part}"


def test_pressure_and_io_stat_parsers() -> None:
    text = ("some avg10=12.50 avg60=3.01 avg300=0.60 total=4512345\n"
            "full avg10=10.00 avg60=2.00 avg300=0.40 total=4000000\n")
    p = vms.parse_pressure(text)
    assert p is not None and (p.some_avg10, p.some_avg60, p.some_total_us) == (12.5, 3.01, 4512345)
    assert (p.full_avg10, p.full_total_us) == (10.0, 4000000)
    assert vms.parse_pressure("") is None
    stat = (CAPTURE / "sys/fs/cgroup/machine.slice/machine-qemu\\x2d7\\x2dvm\\x2dbc.scope/io.stat"
            ).read_text()
    io = vms.parse_io_stat(stat)
    assert io.wios > 0 and io.rios >= 0
    assert vms.parse_iowait((CAPTURE / "proc/stat").read_text()) is not None


# ------------------------------------------------------------------------------ vm-cache

XML = next(v for k, v in _calls().items() if k.startswith("dumpxml ") and "vm-dm" in v)


def test_set_cache_changes_only_that_disk_and_keeps_the_rest() -> None:
    new, before = vm_ops._set_cache(XML, "vda", "none")
    assert before == "writeback"
    assert "cache=\"none\"" in new and "writeback" not in new
    assert vms.parse_domain(new)[:2] == vms.parse_domain(XML)[:2]  # same name and UUID
    again, before = vm_ops._set_cache(new, "/dev/mapper/vc", "default")  # by source path
    assert before == "none" and "cache=" not in again.split("<disk", 1)[1].split("</disk>")[0]
    with pytest.raises(UsageError) as e:
        vm_ops._set_cache(XML, "vdz", "none")
    assert "has no disk 'vdz'" in e.value.message and e.value.hint == "its disks: vda"


def test_set_cache_keeps_namespace_prefixes() -> None:
    xml = XML.replace("</domain>", "<metadata><app:x xmlns:app='urn:example:app'>1</app:x>"
                      "</metadata></domain>")
    new, _ = vm_ops._set_cache(xml, "vda", "none")
    # the same prefix, bound to the same namespace (ElementTree declares it on the root)
    assert "<app:x>1</app:x>" in new and 'xmlns:app="urn:example:app"' in new


def test_vms_cli_on_the_capture() -> None:
    from tests.unit.test_state_files import cli

    rc, out, err = cli(CAPTURE / "sys", ["vms", "--json"])
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["schema"] == 1 and len(doc["vms"]) == 3
    rc, out, _ = cli(CAPTURE / "sys", ["vms"])
    assert rc == 0 and "vm.bare" in out and "/dev/ubdf (no cache)" in out
    for bad in ("-x", "qemu:///sys\ntem"):
        with pytest.raises(UsageError):
            virsh.check_uri(bad)


def test_the_replacement_plan_names_the_vms_it_slows() -> None:
    from cachemgr.ops import replace as replace_ops
    from cachemgr.procedures import replace

    b = {"uuid": "u", "name": "dm-0", "node": "/dev/mapper/hdd", "device": "/dev/bcache0",
         "mode": "writethrough"}
    j = replace.Journal(id="x", cset="bca27031", options={}, old={}, backings=[b])
    assert replace_ops.vm_lines(SYS, j) == [
        "VMs that run at the backing disk's speed until the run ends: vm-bc (vda on "
        "/dev/bcache0)"]
    dm = replace.Journal(id="y", cset="vc", options={}, old={}, backings=[], kind="dmcache")
    assert "vm-dm (vda on /dev/mapper/vc)" in replace_ops.vm_lines(SYS, dm)[0]
    other = replace.Journal(id="z", cset="other", options={}, old={}, backings=[],
                            kind="dmcache")
    assert replace_ops.vm_lines(SYS, other) == []


def test_metrics_carry_each_vm_disk_and_its_cgroup_io() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from cachemgr.ops.metrics import SnapshotCollector

    reg = CollectorRegistry()
    reg.register(SnapshotCollector(SYS))
    text = generate_latest(reg).decode()
    dm = next(d for d in snapshot.take(SYS).dmcaches if d.node == "/dev/mapper/vc")
    assert (f'cachemgr_vm_disk_info{{cache_mode="writeback",device="{dm.kernel_name}",'
            'disk="vda",path="/dev/mapper/vc",vm="vm-dm"} 1.0') in text
    assert 'cachemgr_vm_disk_warnings{disk="vdb",vm="vm.bare"} 2.0' in text
    v = _scan()["vm-bc"]
    assert f'cachemgr_vm_io_ops_total{{op="write",vm="vm-bc"}} {float(v.io.wios)}' in text  # type: ignore[attr-defined]
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(SYS, vms=False))
    assert "cachemgr_vm_" not in generate_latest(reg).decode()


def test_watch_lines_give_rates_between_two_looks() -> None:
    import dataclasses

    snap = snapshot.take(SYS, vms=True)
    assert snap.vms is not None
    first = snap.vms
    bc = next(v for v in first.vms if v.name == "vm-bc")
    assert bc.io is not None
    later = dataclasses.replace(bc, io=dataclasses.replace(
        bc.io, wios=bc.io.wios + 500, wbytes=bc.io.wbytes + 500 * 4096))
    second = dataclasses.replace(first, vms=(later,))
    lines = vm_ops.watch_lines(first, second, 2.0)
    assert lines[0] == ("vm-bc: IO pressure % - read 0 IO/s 0 B/s, write 250 IO/s "
                        "1000.0 KiB/s")
    assert lines[-1] == "host: IO pressure % -"
    assert vm_ops.watch_lines(None, first, 0)[0] == "vm-bc: IO pressure % -"  # no rate yet


@pytest.mark.parametrize("name", ["[bold red]vm[/]", "vm\x1b[2Jx", "vm\nnext"])
def test_a_hostile_domain_name_is_shown_as_data(name: str) -> None:
    import dataclasses
    import io

    from rich.console import Console

    from cachemgr.core.text import printable
    from tui.screens import detail

    snap = snapshot.take(SYS, vms=True)
    assert snap.vms is not None
    vms_ = tuple(dataclasses.replace(v, name=name) if v.name == "vm-dm" else v
                 for v in snap.vms.vms)
    snap = dataclasses.replace(snap, vms=dataclasses.replace(snap.vms, vms=vms_))
    con = Console(width=100, record=True, file=io.StringIO())
    con.print(detail.render(snap, "dm:vc"))
    text = con.export_text()
    assert f"{printable(name)} vda" in text and "\x1b" not in text
    # the CLI's table is data; emit() escapes it on output, one line per table line
    assert any(printable(line).startswith(printable(name)) for line in vm_ops.table(snap.vms))


def test_disk_stacks_are_kept_while_no_uevent_is_sent(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A poller's scan cache keeps each disk's host device and stack while
    kernel/uevent_seqnum reads the same; the answer is the uncached one; another seqnum
    reads the tree again (issue #34: a scrape with 50 VMs)."""
    import shutil

    from cachemgr.backends.scancache import ScanCache

    root = tmp_path / "vms-uml"
    shutil.copytree(CAPTURE, root, symlinks=True)
    (root / "sys" / "kernel").mkdir(exist_ok=True)
    seq = root / "sys" / "kernel" / "uevent_seqnum"
    seq.write_text("100\n")
    sysfs = Sysfs(root / "sys")
    snap = snapshot.take(sysfs)
    resolved: list[str] = []
    real = Sysfs.resolve

    def counted(self: Sysfs, rel: str) -> str | None:
        resolved.append(rel)
        return real(self, rel)

    monkeypatch.setattr(Sysfs, "resolve", counted)
    cache = ScanCache()
    scans = []
    for s in ("100", "100", "101"):
        seq.write_text(s + "\n")
        cache.begin(sysfs)
        resolved.clear()
        scans.append((vms.scan(sysfs, snap, cache=cache), len(resolved)))
    uncached = vms.scan(sysfs, snap, virsh.CapturedVirsh(root), ScanCache())
    assert [s.vms for s, _ in scans] == [uncached.vms] * 3
    (_, first), (_, second), (_, third) = scans
    assert first >= 3 and second == 0 and third == first  # a device per disk, then none


def _vm(name: str, *rows: tuple[str, int | None, int | None]) -> object:
    from cachemgr.core.model import Vm, VmCacheIo

    return Vm(name=name, uuid=name, state="running", domain_id=1, disks=(), cgroup="x",
              pressure=None, io=None,
              cache_io=tuple(VmCacheIo(c, r, s) for c, r, s in rows))


def test_read_hit_ratio_is_one_minus_what_the_slow_disk_served() -> None:
    from cachemgr.core.model import VmCacheIo

    # the lab's LVM cache: 16 MiB read, 1,576,960 bytes from _corig (docs/kernel-notes.md)
    assert round(VmCacheIo("c", 16 << 20, 1576960).read_hit_ratio or 0, 3) == 0.906
    assert VmCacheIo("c", 0, 0).read_hit_ratio is None  # nothing read yet
    assert VmCacheIo("c", None, None, "no scope").read_hit_ratio is None


def test_the_noisy_neighbour_is_the_one_the_slow_disk_serves_while_others_miss() -> None:
    mb = 1 << 20
    hot = _vm("hot", ("/dev/bcache0", 100 * mb, 5 * mb))
    uni = _vm("uni", ("/dev/bcache0", 10 * mb, 6 * mb))
    bak = _vm("bak", ("/dev/bcache0", 400 * mb, 390 * mb))
    (n,) = vms.noisy((hot, uni, bak))  # type: ignore[arg-type]
    assert (n.vm, n.cache, n.slow_read_bytes) == ("bak", "/dev/bcache0", 390 * mb)
    assert [v for v, _ in n.victims] == ["hot", "uni"]
    assert n.text.startswith("noisy neighbour on /dev/bcache0: bak made 97% of the slow")
    # alone on its cache: nobody's neighbour; under half the slow reads: not named
    assert vms.noisy((bak,)) == ()  # type: ignore[arg-type]
    assert vms.noisy((hot, uni, _vm("b2", ("/dev/bcache0", 8 * mb, 8 * mb)))) == ()  # type: ignore[arg-type]
    # over a window: only a VM whose hit ratio fell since the earlier look is a victim
    # (hot 0.99 -> 0.95 fell, uni 0.1 -> 0.4 rose)
    before = {("hot", "/dev/bcache0"): 0.99, ("uni", "/dev/bcache0"): 0.1}
    (w,) = vms.noisy((hot, uni, bak), before)  # type: ignore[arg-type]
    assert [v for v, _ in w.victims] == ["hot"]
    assert vms.noisy((hot, uni, bak), {("hot", "/dev/bcache0"): 0.9}) == ()  # type: ignore[arg-type]


def test_the_capture_scope_without_reads_has_no_hit_ratio_and_says_so_when_unknown() -> None:
    by = _scan()
    (c,) = by["vm-bc"].cache_io  # type: ignore[attr-defined]
    # vm-bc's scope only wrote: its cache is known, its read hit ratio not yet
    assert (c.cache, c.read_bytes, c.why, c.read_hit_ratio) == ("/dev/bcache0", 0, None, None)
    (d,) = by["vm-dm"].cache_io  # type: ignore[attr-defined]
    assert d.read_bytes is None and "no cgroup scope" in d.why
    assert by["vm.bare"].cache_io == ()  # type: ignore[attr-defined]
