"""IO schedulers (cachemgr/backends/scheduler.py, cachemgr/ops/scheduler.py, `cachemgr
scheduler`) on captured lab trees: schedulers-uml (7.2: /dev/ubda on bfq with slice_idle 0,
its partition ubda1 the backing device of bcache0 cached by /dev/ubdb on kyber, /dev/ubdc on
mq-deadline under dm-linear "lin" = dm-0) and nvme-pair-qemu (6.1: bcache0's queue/scheduler
reads a bare "none" and would take any write)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cachemgr.backends import scheduler as sched
from cachemgr.core.errors import AlreadyError, CacheMgrError, UsageError
from cachemgr.core.exitcodes import ExitCode
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import autoattach as autoattach_ops
from cachemgr.ops import scheduler as sched_ops
from cachemgr.procedures import autoattach, bench, policy
from cachemgr.procedures.bench import JobSpec
from tests.kernel.clirun import in_process
from tests.unit.tui_helpers import FIXTURES, kernel_writes

Writes = list[tuple[str, str]]


def _copy(tmp_path: Path, name: str) -> Path:
    import shutil

    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst, symlinks=True)
    return dst / "sys"


@pytest.fixture
def uml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Sysfs, Writes]:
    root = _copy(tmp_path, "schedulers-uml")
    writes = kernel_writes(monkeypatch)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    return Sysfs(root), writes


@pytest.mark.parametrize("text,current,available", [
    ("none [mq-deadline] kyber ", "mq-deadline", ("none", "mq-deadline", "kyber")),  # 7.2
    ("[none] mq-deadline ", "none", ("none", "mq-deadline")),  # 6.1 virtio/NVMe
    ("mq-deadline kyber [bfq] none", "bfq", ("mq-deadline", "kyber", "bfq", "none")),
    ("none", None, ()),  # 6.1: a bio-based device (bcache0, dm-N)
    (None, None, ()),  # 7.2: a bio-based device has no such file
])
def test_parse(text: str | None, current: str | None, available: tuple[str, ...]) -> None:
    assert sched.parse(text) == (current, available)


def test_read_captured_disks() -> None:
    sysfs = Sysfs(FIXTURES / "schedulers-uml" / "sys")
    a = sched.read(sysfs, "ubda")
    assert a.current == "bfq" and a.request_based
    assert a.available == ("none", "mq-deadline", "kyber", "bfq")
    tun = dict(a.tunables)
    assert tun["slice_idle"] == 0 and tun["low_latency"] == 1 and tun["back_seek_max"] == 16384
    assert dict(sched.read(sysfs, "ubdb").tunables) == {"read_lat_nsec": 2000000,
                                                         "write_lat_nsec": 10000000}
    assert "read_expire" in dict(sched.read(sysfs, "ubdc").tunables)
    b = sched.read(sysfs, "bcache0")
    assert b.current is None and not b.request_based and b.tunables == ()
    assert sched.disks_under(sysfs, "bcache0") == ("ubda", "ubdb")  # ubda1 -> its disk
    assert sched.disks_under(sysfs, "dm-0") == ("ubdc",)
    assert sched.users(sysfs) == {"ubda": ["bcache0"], "ubdb": ["bcache0"],
                                  "ubdc": ["dm-0 (lin)"]}


def test_61_bio_based_device_reads_none() -> None:
    sysfs = Sysfs(FIXTURES / "nvme-pair-qemu" / "sys")
    assert sysfs.read("block/bcache0/queue/scheduler") == "none"
    assert not sched.read(sysfs, "bcache0").request_based
    assert sched.disks_under(sysfs, "bcache0") == ("nvme0n1", "vda")


def test_dm_stack_ends_on_the_disks() -> None:
    sysfs = Sysfs(FIXTURES / "dmcache-writeback-uml" / "sys")
    # vmcache (dm-1) over slow (dm-0, a dm-delay over ubda), cache ubdb, metadata ubdc
    assert sorted(sched.disks_under(sysfs, "dm-1")) == ["ubda", "ubdb", "ubdc"]


def test_show_lists_every_device() -> None:
    sysfs = Sysfs(FIXTURES / "schedulers-uml" / "sys")
    res = sched_ops.show(sysfs)
    assert res.data is not None
    rows = {e["name"]: e for e in res.data["devices"]}
    assert set(rows) == {"bcache0", "dm-0", "ubda", "ubdb", "ubdc"}  # no unused loop devices
    assert rows["ubda"]["scheduler"] == "bfq" and rows["ubda"]["used_by"] == ["bcache0"]
    assert rows["bcache0"]["scheduler"] is None and rows["bcache0"]["disks"] == ["ubda", "ubdb"]
    text = "\n".join(res.lines)
    assert "bio-based: set it on ubda, ubdb" in text
    assert any(line.split()[:2] == ["ubdb", "kyber"] for line in res.lines)


def test_show_one_partition_is_its_disk() -> None:
    sysfs = Sysfs(FIXTURES / "schedulers-uml" / "sys")
    res = sched_ops.show(sysfs, "/dev/ubda1")
    assert res.notes == ["cachemgr: ubda1 is a partition of ubda: the IO scheduler is the "
                         "disk's"]
    assert res.lines[0] == "/dev/ubda: IO scheduler bfq"
    assert any(line.split() == ["slice_idle", "0"] for line in res.lines)


def test_set_changes_and_reads_back(uml: tuple[Sysfs, Writes]) -> None:
    sysfs, writes = uml
    res = sched_ops.set_scheduler(sysfs, "/dev/ubdc", "bfq")
    assert writes == [("block/ubdc/queue/scheduler", "bfq")]
    assert sysfs.read("block/ubdc/queue/scheduler").split() == [
        "none", "mq-deadline", "kyber", "[bfq]"]
    assert res.text() == ["/dev/ubdc: scheduler mq-deadline -> bfq"]


def test_already_so(uml: tuple[Sysfs, Writes]) -> None:
    sysfs, writes = uml
    with pytest.raises(AlreadyError, match="already mq-deadline") as exc:
        sched_ops.set_scheduler(sysfs, "ubdc", "deadline")  # mq-deadline's alias
    assert exc.value.exit_code == ExitCode.ALREADY and writes == []


@pytest.mark.parametrize("device,name,words", [
    ("bcache0", "kyber", "bio-based"),
    ("/dev/dm-0", "bfq", "bio-based"),
    ("ubdc", "foo", "has no IO scheduler 'foo'"),
    ("ubdc", "cfq", "removed from the kernel"),
    ("ubdc", "BFQ!", "not an IO scheduler name"),
    ("..", "bfq", "not a block device name"),
    ("../ubdc", "bfq", "no such device"),
    ("ubdz", "bfq", "no block device 'ubdz'"),
    ("/dev/nosuch/ubdc", "bfq", "no such device"),
])
def test_refusals_write_nothing(uml: tuple[Sysfs, Writes], device: str, name: str,
                                words: str) -> None:
    sysfs, writes = uml
    with pytest.raises(UsageError, match=words) as exc:
        sched_ops.set_scheduler(sysfs, device, name)
    assert writes == []
    if words == "bio-based":
        assert exc.value.hint is not None and ("ubda, ubdb" in exc.value.hint
                                               or "ubdc" in exc.value.hint)


def test_unknown_scheduler_lists_the_available(uml: tuple[Sysfs, Writes]) -> None:
    sysfs, _ = uml
    with pytest.raises(UsageError) as exc:
        sched_ops.set_scheduler(sysfs, "ubdc", "foo")
    assert exc.value.hint == "available on /dev/ubdc: none mq-deadline kyber bfq"


def test_bio_based_61_refused_before_the_write(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """6.1 takes any write to a bio-based queue/scheduler and changes nothing: refused first."""
    sysfs = Sysfs(_copy(tmp_path, "nvme-pair-qemu"))
    writes = kernel_writes(monkeypatch)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    with pytest.raises(UsageError, match="bio-based") as exc:
        sched_ops.set_scheduler(sysfs, "bcache0", "mq-deadline")
    assert writes == [] and "nvme0n1, vda" in (exc.value.hint or "")


def test_a_write_the_kernel_ignores_is_an_error(uml: tuple[Sysfs, Writes],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, _ = uml
    monkeypatch.setattr(Sysfs, "write", lambda self, rel, value: None)
    with pytest.raises(CacheMgrError, match="wrote scheduler bfq but the kernel reports "
                                            "mq-deadline"):
        sched.set_scheduler(sysfs, "ubdc", "bfq")


def test_not_root_writes_nothing(uml: tuple[Sysfs, Writes],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, writes = uml
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(UsageError, match="needs root"):
        sched_ops.set_scheduler(sysfs, "ubdc", "bfq")
    assert writes == []


def test_cli(uml: tuple[Sysfs, Writes]) -> None:
    sysfs, writes = uml
    root = str(sysfs.root)
    r = in_process("--sysfs-root", root, "scheduler", "--json")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert doc["schema"] == 1 and {d["name"] for d in doc["devices"]} >= {"ubda", "bcache0"}
    r = in_process("--sysfs-root", root, "scheduler", "ubdb", "kyber")
    assert r.returncode == ExitCode.ALREADY and "already kyber" in r.stderr
    r = in_process("--sysfs-root", root, "scheduler", "bcache0", "bfq")
    assert r.returncode == ExitCode.USAGE and "hint: its IO is scheduled on ubda, ubdb" \
        in r.stderr
    assert writes == []
    r = in_process("--sysfs-root", root, "scheduler", "ubdb", "none", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["changes"] == [
        {"target": "/dev/ubdb", "what": "scheduler", "before": "kyber", "after": "none"}]
    assert sysfs.read("block/ubdb/queue/scheduler").split() == [
        "[none]", "mq-deadline", "kyber", "bfq"]


# ------------------------------------------------------------------ the policy, auto-attach

SCHED_POLICY = """
[scheduler.hdd]
device = "serial:HDD1"
scheduler = "mq-deadline"

[scheduler.ssd]
device = "serial:SSD1"
scheduler = "kyber"
"""


def _view(sysfs: Sysfs) -> autoattach.View:
    """The capture's view with the serials udev would give its disks (ubd has none)."""
    v = autoattach.take_view(sysfs, udev=None, probe=None)
    devs = dict(v.devices)
    for name, serial in (("ubda", "HDD1"), ("ubdb", "SSD1"), ("ubdc", "META1")):
        f = devs[name]
        devs[name] = replace(f, identity=replace(f.identity, serial=serial))
    p = devs["ubda1"]
    devs["ubda1"] = replace(p, identity=replace(p.identity, by_id=(PART_LINK,)))
    return replace(v, devices=devs)


PART_LINK = "/dev/disk/by-id/virtio-HDD1-part1"


def test_view_has_each_disks_scheduler() -> None:
    v = _view(Sysfs(FIXTURES / "schedulers-uml" / "sys"))
    assert {n: f.scheduler for n, f in v.devices.items() if f.scheduler} == {
        "ubda": "bfq", "ubdb": "kyber", "ubdc": "mq-deadline"}
    assert v.devices["ubda1"].scheduler is None and v.devices["dm-0"].scheduler is None


@pytest.mark.parametrize("event", [None, "/dev/ubda", "/dev/ubda1"])
def test_policy_sets_the_disks_scheduler(event: str | None) -> None:
    v = _view(Sysfs(FIXTURES / "schedulers-uml" / "sys"))
    e = None if event is None else autoattach.Event("add", event, 7, None, (), 0.0)
    # ubdb is on kyber already: nothing for it
    assert autoattach.decide(e, v, policy.parse(SCHED_POLICY)) == [
        autoattach.SetScheduler("ubda", "serial:HDD1", "hdd", "mq-deadline", "bfq")]


def test_policy_naming_a_partition_sets_its_disk() -> None:
    v = _view(Sysfs(FIXTURES / "schedulers-uml" / "sys"))
    text = f'[scheduler.p]\ndevice = "{PART_LINK}"\nscheduler = "none"\n'
    for e in (None, autoattach.Event("add", "/dev/ubda", 8, None, (), 0.0)):
        assert autoattach.decide(e, v, policy.parse(text)) == [
            autoattach.SetScheduler("ubda", "serial:HDD1", "p", "none", "bfq")]


def test_policy_other_disk_event_does_nothing() -> None:
    v = _view(Sysfs(FIXTURES / "schedulers-uml" / "sys"))
    e = autoattach.Event("add", "/dev/ubdc", 9, None, (), 0.0)
    assert autoattach.decide(e, v, policy.parse(SCHED_POLICY)) == []


def test_policy_naming_a_bio_based_device_is_a_note() -> None:
    v = _view(Sysfs(FIXTURES / "schedulers-uml" / "sys"))
    dm = v.devices["dm-0"]
    link = "/dev/disk/by-id/dm-name-lin"
    v = replace(v, devices={**v.devices, "dm-0": replace(dm, identity=replace(
        dm.identity, by_id=(link,)))})
    (a,) = autoattach.decide(None, v, policy.parse(
        f'[scheduler.d]\ndevice = "{link}"\nscheduler = "bfq"\n'))
    assert isinstance(a, autoattach.Note) and "no IO scheduler of its own" in a.message


def test_boot_pass_writes_and_reads_back(uml: tuple[Sysfs, Writes], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, writes = uml
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    res = autoattach.reconcile(sysfs, policy.parse(SCHED_POLICY), [None],
                               act=autoattach_ops.act, view_fn=_view)
    assert [(o.action.kind, o.result) for o in res.outcomes] == [("scheduler", "done")]
    assert writes == [("block/ubda/queue/scheduler", "mq-deadline")]
    assert sched.read(sysfs, "ubda").current == "mq-deadline" and res.rounds == 2


# ------------------------------------------------------------------ bench compare DEV@SCHED


@pytest.mark.parametrize("text,rest,name", [
    ("/dev/sdb@bfq", "/dev/sdb", "bfq"),
    ("hdd=/dev/mapper/hdd@deadline", "hdd=/dev/mapper/hdd", "mq-deadline"),
    ("/dev/bcache0:writeback@kyber", "/dev/bcache0:writeback", "kyber"),
    ("/dev/sdb", "/dev/sdb", None),
    ("/dev/disk/by-id/a@b/c", "/dev/disk/by-id/a@b/c", None),  # an @ inside a path
])
def test_split_scheduler(text: str, rest: str, name: str | None) -> None:
    assert bench.split_scheduler(text) == (rest, name)


@pytest.mark.parametrize("text,words", [
    ("/dev/sdb@", "nothing after @"), ("@bfq", "no device"), ("/dev/sdb@cfq", "removed"),
])
def test_split_scheduler_refuses(text: str, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        bench.split_scheduler(text)


def test_scheduler_disks_of_each_kind() -> None:
    sysfs = Sysfs(FIXTURES / "schedulers-uml" / "sys")
    assert bench.scheduler_disks(sysfs, "ubdc") == (("ubdc",), None)
    assert bench.scheduler_disks(sysfs, "ubda1") == (
        ("ubda",), "ubda1 is a partition: the IO scheduler is set on ubda")
    disks, note = bench.scheduler_disks(sysfs, "bcache0")
    assert disks == ("ubda", "ubdb") and note is not None and "bio-based" in note


def _fake_runs(monkeypatch: pytest.MonkeyPatch, sysfs: Sysfs, targets: list[bench.Target],
               fail_at: int | None = None) -> list[tuple[str, str | None]]:
    """compare() on hand-made targets: each fio run records (label, the scheduler of the
    target's disk at that moment) and returns a captured fio result."""
    from cachemgr.procedures.bench import comparison

    by_spec = {t.spec: t for t in targets}
    seen: list[tuple[str, str | None]] = []
    fio = bench.parse_fio((FIXTURES / "fio" / "randwrite-qd1-dmdelay.json").read_text())

    def run(sysfs_: Sysfs, spec: object, t: bench.Target, seed: int, progress: object,
            interval: float = 1.0) -> tuple[object, str, None]:
        seen.append((t.label, sched.read(sysfs, t.scheduler_disks[0]).current))
        if fail_at is not None and len(seen) == fail_at:
            raise KeyboardInterrupt
        return fio, "jobfile", None

    monkeypatch.setattr(comparison, "resolve_target", lambda s, text: by_spec[text])
    monkeypatch.setattr(comparison, "_run_sampled", run)
    monkeypatch.setattr(comparison, "fio_version", lambda: "fio-3.33")
    return seen


def _targets(disks: tuple[str, ...], *names: str) -> list[bench.Target]:
    return [bench.Target(label=f"/dev/{disks[0]}@{n}", spec=f"/dev/{disks[0]}@{n}",
                         device=f"/dev/{disks[0]}", name=disks[0], scheduler=n,
                         scheduler_disks=disks) for n in names]


def test_compare_interleaves_schedulers_and_restores(uml: tuple[Sysfs, Writes],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, writes = uml
    targets = _targets(("ubda",), "mq-deadline", "bfq")  # ubda is on bfq in the capture
    seen = _fake_runs(monkeypatch, sysfs, targets)
    c = bench.compare(sysfs, JobSpec(rw="randread", runtime=1), [t.spec for t in targets],
                      bench.CompareOptions(repeat=2, settle=False))
    assert seen == [("/dev/ubda@mq-deadline", "mq-deadline"), ("/dev/ubda@bfq", "bfq"),
                    ("/dev/ubda@mq-deadline", "mq-deadline"), ("/dev/ubda@bfq", "bfq")]
    assert sched.read(sysfs, "ubda").current == "bfq"  # as it was
    assert writes[-1] == ("block/ubda/queue/scheduler", "bfq")
    assert any("/dev/ubda IO scheduler: bfq" in h for h in c.hygiene)
    doc = bench.to_json(c)
    assert [r["label"] for r in doc["results"]] == ["/dev/ubda@mq-deadline", "/dev/ubda@bfq"]
    for r in doc["results"]:
        assert r["lat_p99_us"] is not None and r["lat_p99_9_us"] is not None
    assert [t["scheduler"] for t in doc["targets"]] == ["mq-deadline", "bfq"]
    assert "p99.9 us" in bench.table(doc).splitlines()[1]


def test_compare_restores_after_ctrl_c(uml: tuple[Sysfs, Writes],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, _ = uml
    targets = _targets(("ubda", "ubdb"), "none", "mq-deadline")  # bcache0's two disks
    _fake_runs(monkeypatch, sysfs, targets, fail_at=2)
    with pytest.raises(KeyboardInterrupt):
        bench.compare(sysfs, JobSpec(rw="randread", runtime=1), [t.spec for t in targets],
                      bench.CompareOptions(repeat=2, settle=False))
    assert (sched.read(sysfs, "ubda").current, sched.read(sysfs, "ubdb").current) == (
        "bfq", "kyber")


def test_compare_unknown_scheduler_fails_before_any_run(uml: tuple[Sysfs, Writes],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, _ = uml
    targets = _targets(("ubdc",), "kyber", "noexist")
    seen = _fake_runs(monkeypatch, sysfs, targets)
    with pytest.raises(UsageError, match="no IO scheduler 'noexist'"):
        bench.compare(sysfs, JobSpec(rw="randread", runtime=1), [t.spec for t in targets],
                      bench.CompareOptions(repeat=1, settle=False))
    assert seen == [] and sched.read(sysfs, "ubdc").current == "mq-deadline"
