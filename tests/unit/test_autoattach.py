"""The auto-attach decision function: (event, view, policy) -> actions, on captured trees.

The base view is the capture tests/fixtures/bcache-unattached-uml (a registered backing
device ubda attached to nothing, in writethrough, and a cache set on ubdb with no backing
device); variants change one fact of it the way the lab showed them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachemgr.core.model import CacheMode, CacheState
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import autoattach, policy
from cachemgr.procedures.autoattach import (
    Attach,
    DeviceFacts,
    Event,
    Format,
    Note,
    Register,
    SetMode,
    SetTunable,
    View,
    decide,
)

FX = Path(__file__).resolve().parent.parent / "fixtures" / "bcache-unattached-uml" / "sys"
CSET = "3a85497b-f234-4651-a39a-c547edabc679"
BUUID = "a978012d-8ec0-44df-bf32-93fd5a00ca7a"
SSD_WWN = "naa.33333330000007d0"


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))


def base_view() -> View:
    v = autoattach.take_view(Sysfs(FX), udev=None, probe=None)
    # the capture has no udev data: give the SSD the WWN scsi_debug gives it in the lab
    ssd = v.devices["ubdb"]
    return with_device(v, replace(ssd, identity=replace(ssd.identity, wwn=SSD_WWN)))


def with_device(v: View, f: DeviceFacts) -> View:
    return replace(v, devices={**v.devices, f.name: f})


def with_backing(v: View, **changes: object) -> View:
    (b,) = v.snapshot.backings
    return replace(v, snapshot=replace(v.snapshot, backings=(replace(b, **changes),)))


def pol(text: str) -> policy.Policy:
    return policy.parse(text)


POLICY = f"""
[cache.ssd0]
device = "{SSD_WWN}"

[backing.vm-a]
device = "uuid:{BUUID}"
cache = "ssd0"
mode = "writeback"
writeback_percent = 20
sequential_cutoff = "4M"
"""


def ev(action: str, devname: str, **props: str) -> Event:
    return Event(action, devname, 100, None, tuple(sorted(props.items())), 0.0)


def kinds(actions: list[autoattach.Action]) -> list[str]:
    return [a.kind for a in actions]


def test_full_pass_attaches_sets_mode_and_tunables() -> None:
    acts = decide(None, base_view(), pol(POLICY))
    assert acts == [
        Attach("ubda", f"uuid:{BUUID}", "vm-a", CSET),
        SetMode("ubda", f"uuid:{BUUID}", "vm-a", "writeback", "writethrough"),
        SetTunable("ubda", f"uuid:{BUUID}", "vm-a", "writeback_percent", 20, "10"),
    ]  # sequential_cutoff 4M is already so ("4.0M" in the capture)


@pytest.mark.parametrize("devname", ["/dev/ubda", "/dev/ubdb", "/dev/bcache0"])
def test_events_of_the_backing_its_cache_or_its_bcache_device_act(devname: str) -> None:
    acts = decide(ev("add", devname), base_view(), pol(POLICY))
    assert kinds(acts) == ["attach", "mode", "tunable"]


def test_the_cache_by_cset_uuid_works_the_same() -> None:
    text = POLICY.replace(f'device = "{SSD_WWN}"', f'cset = "{CSET}"')
    assert kinds(decide(ev("change", "/dev/ubdb"), base_view(), pol(text))) == [
        "attach", "mode", "tunable"]


def test_unrelated_device_gives_nothing() -> None:
    assert decide(ev("add", "/dev/ubdc"), base_view(), pol(POLICY)) == []
    assert decide(ev("add", "/dev/sdz"), base_view(), pol(POLICY)) == []


def test_nothing_named_nothing_done() -> None:
    assert decide(None, base_view(), pol("")) == []


def test_done_state_is_idempotent() -> None:
    v = with_backing(base_view(), cset_uuid=CSET, mode=CacheMode.WRITEBACK,
                     writeback_percent=20, state=CacheState.CLEAN)
    assert decide(None, v, pol(POLICY)) == []
    assert decide(ev("change", "/dev/ubda"), v, pol(POLICY)) == []


def test_attached_elsewhere_is_never_detached() -> None:
    v = with_backing(base_view(), cset_uuid="11111111-2222-3333-4444-555555555555",
                     mode=CacheMode.WRITEBACK, writeback_percent=20)
    (a,) = decide(None, v, pol(POLICY))
    assert isinstance(a, Note) and "never detaches" in a.message


def test_dirty_backing_of_a_missing_cache_is_not_attached() -> None:
    v = with_backing(base_view(), state=CacheState.DIRTY)
    acts = decide(None, v, pol(POLICY))
    assert "attach" not in kinds(acts)
    assert any(isinstance(a, Note) and "would discard" in a.message for a in acts)


def test_backing_first_gets_mode_and_tunables_but_no_attach() -> None:
    v = base_view()
    v = replace(v, snapshot=replace(v.snapshot, cache_sets=()),
                devices={k: f for k, f in v.devices.items() if k != "ubdb"})
    assert kinds(decide(ev("add", "/dev/ubda"), v, pol(POLICY))) == ["mode", "tunable"]


def test_unregistered_devices_are_registered_cache_first() -> None:
    v = base_view()
    ubda, ubdb = v.devices["ubda"], v.devices["ubdb"]
    v = replace(v, snapshot=replace(v.snapshot, cache_sets=(), backings=()), devices={
        **v.devices,
        "ubda": replace(ubda, role=None, sb_kind="backing", cset=None),
        "ubdb": replace(ubdb, role=None, sb_kind="cache"),
    })
    acts = decide(None, v, pol(POLICY))
    assert acts == [Register("ubdb", SSD_WWN, "ssd0", "cache"),
                    Register("ubda", f"uuid:{BUUID}", "vm-a", "backing")]


def test_a_cache_carrying_another_cset_than_the_policy_says_is_left() -> None:
    v = base_view()
    v = with_device(replace(v, snapshot=replace(v.snapshot, cache_sets=())),
                    replace(v.devices["ubdb"], role=None, sb_kind="cache"))
    text = POLICY.replace(f'device = "{SSD_WWN}"',
                          f'device = "{SSD_WWN}"\ncset = "11111111-2222-3333-4444-555555555555"')
    acts = decide(ev("add", "/dev/ubdb"), v, pol(text))
    assert "register" not in kinds(acts) and any("not registering" in a.describe() for a in acts)


def _blank_ssd_view() -> View:
    v = base_view()
    ssd = v.devices["ubdb"]
    return with_device(replace(v, snapshot=replace(v.snapshot, cache_sets=())),
                       replace(ssd, role=None, cset=None, blank=True))


def test_blank_ssd_is_not_formatted_by_default() -> None:
    acts = decide(ev("add", "/dev/ubdb"), _blank_ssd_view(), pol(POLICY))
    assert "format" not in kinds(acts)
    assert any("format_blank_ssd is false" in a.describe() for a in acts)


def test_blank_ssd_in_a_named_slot_is_formatted_when_allowed() -> None:
    text = POLICY.replace(f'device = "{SSD_WWN}"',
                          f'device = "{SSD_WWN}"\nformat_blank_ssd = true\nbucket_size = "64k"')
    acts = decide(ev("add", "/dev/ubdb"), _blank_ssd_view(), pol(text))
    assert acts[0] == Format("ubdb", SSD_WWN, "ssd0", "64k")
    assert "attach" not in kinds(acts)  # the next round, once the new cache set exists


def test_a_disk_with_something_on_it_is_never_formatted() -> None:
    v = _blank_ssd_view()
    ssd = v.devices["ubdb"]
    v = with_device(v, replace(ssd, blank=False,
                               identity=replace(ssd.identity, fs_type="ext4")))
    text = POLICY.replace(f'device = "{SSD_WWN}"', f'device = "{SSD_WWN}"\n'
                                                   "format_blank_ssd = true")
    acts = decide(ev("add", "/dev/ubdb"), v, pol(text))
    assert "format" not in kinds(acts) and any("ext4" in a.describe() for a in acts)


def test_a_backing_without_superblock_is_never_formatted() -> None:
    v = base_view()
    v = replace(v, snapshot=replace(v.snapshot, backings=()))
    v = with_device(v, replace(v.devices["ubda"], role=None, sb_kind=None, blank=True))
    (a,) = decide(None, v, pol(POLICY))
    assert isinstance(a, Note) and "never formats backing devices" in a.message


def test_remove_gives_only_a_note() -> None:
    e = ev("remove", "/dev/sdq", ID_WWN="0x33333330000007d0", DEVTYPE="disk")
    (a,) = decide(e, base_view(), pol(POLICY))
    assert isinstance(a, Note) and "never detaches" in a.message and a.policy == "ssd0"
    assert decide(ev("remove", "/dev/sdq", ID_WWN="0x5000c500a1b2c3d4"), base_view(),
                  pol(POLICY)) == []


def test_ambiguous_ids_do_nothing() -> None:
    v = base_view()
    twin = replace(v.devices["ubdb"], identity=replace(v.devices["ubdb"].identity, name="sdq",
                                                       node="/dev/sdq"))
    v = with_device(v, twin)
    acts = decide(ev("add", "/dev/sdq"), v, pol(POLICY))
    # no cache to attach to; the backing device still gets its mode and tunables
    assert kinds(acts) == ["mode", "tunable", "note"]
    assert "ambiguous" in acts[-1].describe()


def test_wwn_does_not_match_partitions() -> None:
    v = base_view()
    part = replace(v.devices["ubdc"], identity=replace(v.devices["ubdc"].identity,
                                                       wwn=SSD_WWN, partition_of="ubdc"))
    assert not autoattach.matches(policy.DeviceId("wwn", SSD_WWN), part)


def test_devices_under_replace_ssd_are_left_alone(tmp_path: Path) -> None:
    d = tmp_path / "state" / "replace"
    d.mkdir(parents=True)
    (d / "r1.json").write_text(json.dumps({"id": "r1", "status": "running", "cset": CSET,
                                           "old": {}, "new": {}, "backings": [{"uuid": BUUID}]}))
    v = autoattach.take_view(Sysfs(FX), udev=None, probe=None)
    acts = decide(None, v, pol(POLICY.replace(f'device = "{SSD_WWN}"', f'cset = "{CSET}"')))
    assert acts and all(isinstance(a, Note) for a in acts), acts
    assert "replace-ssd run r1" in acts[0].describe()
    (d / "r1.json").write_text(json.dumps({"id": "r1", "status": "done", "cset": CSET}))
    v = autoattach.take_view(Sysfs(FX), udev=None, probe=None)
    assert "attach" in kinds(decide(None, v, pol(POLICY.replace(
        f'device = "{SSD_WWN}"', f'cset = "{CSET}"'))))


def test_event_round_trips_through_the_queue_format() -> None:
    env = {"ACTION": "add", "DEVNAME": "/dev/sdb", "SEQNUM": "1594", "SUBSYSTEM": "block",
           "DEVPATH": "/devices/x/block/sdb", "ID_WWN": "0x33", "HOME": "/root"}
    e = Event.from_env(env, received=5.0)
    assert e.name == "sdb" and e.seqnum == 1594 and e.prop("ID_WWN") == "0x33"
    assert e.prop("HOME") is None
    assert Event.from_json(json.loads(json.dumps(e.to_json()))) == e


def test_decide_all_merges_a_storm() -> None:
    events = [ev("change", f"/dev/{n}") for n in ("ubda", "ubdb", "ubdc", "bcache0")] * 5
    acts = autoattach.decide_all(events, base_view(), pol(POLICY))
    assert kinds(acts) == ["attach", "mode", "tunable"]


@given(st.lists(st.sampled_from(["/dev/ubda", "/dev/ubdb", "/dev/ubdc", "/dev/bcache0",
                                 "/dev/sdz"]), max_size=6),
       st.sampled_from(["add", "change", "remove"]),
       st.booleans(), st.booleans())
@settings(max_examples=60, deadline=None)
def test_decisions_touch_only_named_devices(names: list[str], action: str, fmt: bool,
                                            backing_named: bool) -> None:
    text = POLICY.replace(f'device = "{SSD_WWN}"', f'device = "{SSD_WWN}"\n'
                                                   f"format_blank_ssd = {str(fmt).lower()}")
    if not backing_named:
        text = text.split("[backing.vm-a]")[0]
    view = _blank_ssd_view() if fmt else base_view()
    acts = autoattach.decide_all([ev(action, n) for n in names] or [None], view, pol(text))
    named = {"ubdb"} | ({"ubda"} if backing_named else set())
    for a in acts:
        if not isinstance(a, Note):
            assert a.device in named, a
            assert not isinstance(a, Format) or fmt
    if action == "remove" and names:
        assert all(isinstance(a, Note) for a in acts)


def test_reconcile_executes_and_journals(monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor on a fake: rounds until nothing is left, each outcome journaled."""
    calls: list[str] = []
    v0 = base_view()
    done_view = with_backing(v0, cset_uuid=CSET, mode=CacheMode.WRITEBACK,
                             writeback_percent=20)
    views = iter([v0, done_view, done_view])

    def fake_do(sysfs: Sysfs, view: View, a: autoattach.Action) -> None:
        calls.append(a.kind)

    res = autoattach.reconcile(Sysfs(FX), pol(POLICY), [None], act=fake_do,
                               view_fn=lambda s: next(views))
    assert calls == ["attach", "mode", "tunable"] and res.rounds == 2
    lines = [json.loads(x) for x in Path(autoattach.actions_log()).read_text().splitlines()]
    assert [(r["kind"], r["result"]) for r in lines] == [
        ("attach", "done"), ("mode", "done"), ("tunable", "done")]
    assert lines[0]["stable_id"] == f"uuid:{BUUID}"


def test_worker_under_systemd_logs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker started by systemd-run has the journal on stderr (JOURNAL_STREAM names it):
    with syslog in use too, the stderr handler would log every decision twice."""
    import logging
    import logging.handlers
    import os

    from cachemgr.ops import udev as udev_cli

    log = logging.getLogger(udev_cli.LOGGER)
    st = os.fstat(2)
    monkeypatch.setattr(log, "handlers", [logging.handlers.SysLogHandler(
        address=("127.0.0.1", 9))])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(log, "propagate", True)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    assert udev_cli._stderr_is_journal()
    udev_cli.setup_logging()
    assert not [h for h in log.handlers if type(h) is logging.StreamHandler]
    assert not log.propagate  # nor through the CLI's handler on the root logger
    log.propagate = True
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")  # inherited, but stderr is elsewhere
    udev_cli.setup_logging()
    assert [h for h in log.handlers if type(h) is logging.StreamHandler]


def test_a_failing_handler_says_why_to_syslog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """udevd logs a RUN program's stderr and exit code at debug level only: a handler that
    cannot queue its event (here: the state directory is a file) says so on syslog too."""
    import logging
    import socket

    from cachemgr.cli import udev as udev_cli
    from cachemgr.ops import udev as udev_ops

    sock_path = tmp_path / "log"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(sock_path))
    server.settimeout(5)
    log = logging.getLogger(udev_ops.LOGGER)
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.setattr(udev_ops, "SYSLOG_SOCKET", str(sock_path))
    policy = tmp_path / "cachemgr.toml"
    policy.write_text("version = 1\n")
    (tmp_path / "state").write_text("not a directory")
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CACHEMGR_POLICY", str(policy))
    monkeypatch.setenv("ACTION", "add")
    monkeypatch.setenv("SUBSYSTEM", "block")
    monkeypatch.setenv("DEVNAME", "/dev/sdq")
    try:
        assert udev_cli.main(["udev-event"]) == 1
        got = server.recv(4096).decode()
    finally:
        server.close()
        for h in log.handlers:
            h.close()
    assert "cachemgr-autoattach" in got and "the udev handler failed: " in got, got
    assert f"{tmp_path / 'state'}: not a directory; cachemgr keeps its state there" in got, got
    assert "cachemgr udev: " in capsys.readouterr().err
