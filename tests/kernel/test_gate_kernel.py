"""The one gate (cachemgr/ops/gate.py) on the lab kernel, tried as a second admin would:
every change to a device a drain or a replace-ssd run owns is refused (exit 3) and changes
nothing; an interrupted drain owns its device until it is resumed, or until ``restore`` puts
back what it left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core import runner, state
from cachemgr.core.errors import CacheMgrError
from cachemgr.core.model import CacheMode
from cachemgr.ops import tuning
from cachemgr.procedures import replace
from cachemgr.procedures.replace import KILL_AFTER_ENV
from tests.kernel import clirun
from tests.kernel.test_drain_kernel import (
    B,
    light_load,
    setup_dirty,
    stop_light,
    tunables,
    writeback_on,
)
from tests.kernel.test_replace_kernel import (
    end_state,
    setup,
    start_load,
    status_modes,
    stop_load,
    verify_pre,
)

here = clirun.in_process


def second_admin(dev: str, cset: str) -> list[tuple[str, ...]]:
    return [("tune", dev, "writeback_percent=40"), ("mode", dev, "writethrough"),
            ("detach", dev), ("attach", dev, cset), ("drain", dev)]


@pytest.mark.kernel(disks="1G,256M", timeout=500)
def test_a_running_drain_owns_its_device(lab_disks: list[str]) -> None:
    sysfs = setup_dirty(lab_disks, delay_ms=20, dirty="64M")
    cset = snapshot.take(sysfs).cache_sets[0].uuid
    reader = light_load()
    writeback_on(sysfs)
    drain = clirun.process("drain", "/dev/bcache0", "--stall-timeout", "300")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sysfs.read(f"{B}/writeback_percent") != "0":
            time.sleep(0.05)
        assert sysfs.read(f"{B}/writeback_percent") == "0", "the drain did not start"
        # hold the drain where it is: the backing "HDD" takes no IO until resumed
        runner.run(["dmsetup", "suspend", "hdd"], timeout=60)
        try:
            assert drain.poll() is None, drain.communicate()
            for args in second_admin("/dev/bcache0", cset):
                r = here(*args)
                assert r.returncode == 3, (args, r.returncode, r.stderr)
                assert "held by drain" in r.stderr and "/dev/bcache0" in r.stderr, r.stderr
            r = here("stop-set", cset, "--i-accept-data-loss")
            assert r.returncode == 3, r.stderr
            # nothing changed: the drain's own settings, the mode, the set
            assert tunables(sysfs)[:2] == ("0", "1")
            b = snapshot.take(sysfs).backings[0]
            assert b.mode == CacheMode.WRITEBACK and b.cset_uuid == cset
            # status shows who holds the device and since when
            doc = here("status", "--json")
            assert '"procedure": "drain"' in doc.stdout, doc.stdout
        finally:
            runner.run(["dmsetup", "resume", "hdd"], timeout=60)
        _out, err = drain.communicate(timeout=300)
    finally:
        if drain.poll() is None:
            drain.kill()
        stop_light(reader)
    assert drain.returncode == 0, err
    # the drain put back what it found: the refused tune never happened
    assert tunables(sysfs) == ("10", "30", "1")


@pytest.mark.kernel(disks="1G,256M", timeout=500)
def test_an_interrupted_drain_owns_its_device_until_resumed(lab_disks: list[str]) -> None:
    sysfs = setup_dirty(lab_disks, delay_ms=20, dirty="64M")
    reader = light_load()
    writeback_on(sysfs)
    try:
        p = clirun.process("drain", "/dev/bcache0")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and tunables(sysfs)[:2] != ("0", "1"):
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert tunables(sysfs)[:2] == ("0", "1")
        for args in (("mode", "/dev/bcache0", "none"),
                     ("tune", "/dev/bcache0", "writeback_percent=40"),
                     ("detach", "/dev/bcache0")):
            r = here(*args)
            assert r.returncode == 3, (args, r.stderr)
            assert "interrupted" in r.stderr and "cachemgr drain /dev/bcache0 --resume" \
                in r.stderr, r.stderr
        assert tunables(sysfs)[:2] == ("0", "1")
        assert snapshot.take(sysfs).backings[0].mode == CacheMode.WRITEBACK
        doc = here("status", "--json").stdout
        assert '"running": false' in doc and '"procedure": "drain"' in doc, doc
        r = here("drain", "/dev/bcache0", "--resume")
        assert r.returncode == 0, r.stderr
        assert tunables(sysfs) == ("10", "30", "1")
        r = here("mode", "/dev/bcache0", "none", "--yes")
        assert r.returncode == 0, r.stderr
    finally:
        stop_light(reader)
    assert not list((Path(state.state_dir()) / "drain").glob("*.json"))


@pytest.mark.kernel(disks="512M,512M", timeout=900)
def test_replacement_owns_its_devices_for_its_whole_run(lab_disks: list[str]) -> None:
    """A second admin tries the set's devices from the moment ``replace-ssd --yes`` starts
    under fio verify load until it ends: a tight loop of tunes (the command layer's own
    ``tune``, writeback_percent 39 and 40 in turn, every 50 ms) and, once the run holds its
    devices, rounds of the CLI's tune, mode, detach, attach and drain; while the run's
    process holds them (its steps, its drain threads, one device's drain done and the
    other's going on) and after it died (killed after its attach step) until it is resumed.
    Every try from the moment the run holds its devices is refused (exit 3, naming the
    run); a tune accepted before (the run had not begun) is what the run recorded and
    restores: never lost. The resumed run finishes with every byte verified.

    Before the fix the run planned (read what it restores) before it took its locks: a
    tune accepted in between was undone by the run's restore at its end (seen in the lab,
    and here in every run of this test on that code)."""
    sysfs, devices, ssds = setup(lab_disks)
    old, _modes = status_modes(sysfs)
    snap0 = snapshot.take(sysfs)
    keys = [b.key for b in snap0.backings]
    load = start_load(devices)
    # (started, ended, the run holding its devices at the start, args, exit code, stderr)
    tries: list[tuple[float, float, str | None, tuple[str, ...], int, str]] = []
    held_since: dict[str, float] = {}  # run id -> when it took its devices (its lock file)
    ended = threading.Event()

    def holder() -> str | None:
        h = state.current_holder(keys[0])
        if h is None or h.get("procedure") != "replace-ssd":
            return None
        held_since.setdefault(str(h.get("run")), float(h["since"]))
        return str(h.get("run"))

    def attempt(args: tuple[str, ...]) -> None:
        t0, run_id = time.time(), holder()
        r = here(*args)
        tries.append((t0, time.time(), run_id, args, r.returncode, r.stderr))

    def round_of_tries() -> None:
        for dev in devices:
            for args in second_admin(dev, old):
                attempt(args)

    def tight_tunes() -> None:
        # the command layer's tune with a snapshot taken before (a status scan per try
        # would make it ~1 s a try in the lab); its gate, locks and refusals are the CLI's
        value = dict.fromkeys(devices, 40)
        while not ended.is_set():
            for dev in devices:
                value[dev] = 79 - value[dev]
                args = ("tune", dev, f"writeback_percent={value[dev]}")
                t0, run_id = time.time(), holder()
                try:
                    tuning.tune(sysfs, snap0, dev, args[2:])
                    rc, err = 0, ""
                except CacheMgrError as exc:
                    rc, err = int(exc.exit_code), exc.message
                tries.append((t0, time.time(), run_id, args, rc, err))
                time.sleep(0.05)

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "cachemgr", "replace-ssd", ssds[0].node, "--yes"],
            stdout=log, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd(), KILL_AFTER_ENV: "attach"})

    tight = threading.Thread(target=tight_tunes)
    try:
        # its progress to a file: a pipe nobody reads while the loop runs could fill up
        log = open("/tmp/replace-run.log", "w+")  # noqa: SIM115
        run, starts = start(), 1
        tight.start()
        while run.poll() is None or (run.returncode == 3 and not replace.list_runs()):
            if run.poll() is not None:
                # refused before its first step: a tune held a device as the run looked at
                # or took its locks (it refuses, as it must); start it again
                assert starts < 10, log.read()
                run, starts = start(), starts + 1
            if holder() is not None:
                round_of_tries()
            else:
                time.sleep(0.05)
        ended.set()
        tight.join()
        assert run.returncode == -signal.SIGKILL, log.read()
        round_of_tries()  # the run is interrupted: its journal owns the devices
        interrupted = tries[-len(devices) * 5:]
        assert all("interrupted" in e for *_, e in interrupted), interrupted
        j = replace.list_runs()[-1]
        r = here("replace-ssd", "--resume", j.id)
        assert r.returncode == 0, r.stderr
    finally:
        ended.set()
        if tight.is_alive():
            tight.join()
        stop_load(load)
    since = held_since[j.id]
    owned = [t for t in tries if t[0] >= since]
    assert {t[3][0] for t in owned} >= {"tune", "mode", "detach", "attach", "drain"}
    assert len(owned) >= 50, len(owned)
    through = [t for t in owned if t[4] != 3]
    assert not through, through
    # a tune accepted before the run held its devices is what the run recorded and
    # restored: the last one each device took
    snap = snapshot.take(sysfs)
    recorded = {e["device"]: e for e in j.backings}
    for dev in devices:
        took = [t for t in tries if t[0] < since and t[3][:2] == ("tune", dev) and t[4] == 0]
        want = int(took[-1][3][2].split("=")[1]) if took else 10
        assert recorded[dev]["tunables"]["writeback_percent"] == want, (
            dev, recorded[dev]["tunables"], took[-1:], since, starts)
        b = next(x for x in snap.backings if x.device == dev)
        assert b.cset_uuid not in (None, old) and b.writeback_percent == want
        assert b.mode is not None and b.mode.value == recorded[dev]["mode"]
    # named: the run, or (once it was killed) this admin's own other try of the moment,
    # which holds the device while the gate reads who claims it
    words = [t for t in owned if "replace-ssd run" not in t[5]
             and f"pid {os.getpid()}" not in t[5]]
    assert not words, words
    verify_pre(devices)


@pytest.mark.kernel(disks="512M,512M", timeout=1200)
def test_a_replacement_owns_its_devices_while_it_asks(lab_disks: list[str]) -> None:
    """``replace-ssd`` without --yes on a terminal, under fio verify load: once it asks
    (the condition the second admin waits for: "Go ahead? [y/N]" on its terminal), a mode
    change and a tune of its devices and a second ``replace-ssd --yes`` of the same SSD are
    refused (exit 3, naming the run), nothing of theirs done; answered yes, the run ends
    (exit 0) with the admin's modes and tunables put back and every byte verified.

    Before the fix the run planned and asked before it took its locks, and planned again
    under them after the answer: whatever was started while the question waited went
    through (exit 0), a second replacement of the same SSD too, and the answer confirmed a
    plan that was no longer the one run."""
    sysfs, devices, ssds = setup(lab_disks)
    old, modes = status_modes(sysfs)
    load = start_load(devices)
    master, slave = os.openpty()
    log = open("/tmp/replace-asks.log", "w+")  # noqa: SIM115
    run = subprocess.Popen(
        [sys.executable, "-m", "cachemgr", "replace-ssd", ssds[0].node],
        stdin=slave, stdout=log, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()})
    os.close(slave)
    tries: list[tuple[tuple[str, ...], int, str]] = []
    try:
        deadline = time.monotonic() + 300
        while "Go ahead? [y/N]" not in Path("/tmp/replace-asks.log").read_text():
            assert run.poll() is None, Path("/tmp/replace-asks.log").read_text()
            assert time.monotonic() < deadline, "no question within 300 s"
            time.sleep(0.05)
        for args in [("mode", devices[0], "writethrough"),
                     ("tune", devices[1], "writeback_percent=40"),
                     ("replace-ssd", ssds[0].node, "--yes")]:
            r = clirun.process(*args)
            out, err = r.communicate(timeout=900)
            tries.append((args, r.returncode, out + err))
        assert run.poll() is None  # still asking
        os.write(master, b"y\n")
        assert run.wait(timeout=900) == 0, Path("/tmp/replace-asks.log").read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        os.close(master)
        stop_load(load)
    through = [t for t in tries if t[1] != 3]
    assert not through, through
    named = [t for t in tries if "replace-ssd run" not in t[2]]
    assert not named, named
    assert len(replace.list_runs()) == 1  # the second never began a run
    end_state(sysfs, old, modes)  # the modes and writeback_percent the admin had
    verify_pre(devices)


@pytest.mark.kernel(disks="1G,256M", timeout=500)
def test_restore_puts_back_what_a_killed_drain_left(lab_disks: list[str]) -> None:
    """A drain SIGKILLed mid-way leaves writeback_percent 0 and writeback_delay 1; status
    and check name ``drain DEV --resume``. ``restore`` said "nothing to put back" (exit 4):
    it puts the drain's originals back (what drain --resume does first), and then status,
    check and drain --resume have nothing left of the drain."""
    sysfs = setup_dirty(lab_disks, delay_ms=20, dirty="64M")
    reader = light_load()
    writeback_on(sysfs)
    try:
        p = clirun.process("drain", "/dev/bcache0")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and tunables(sysfs)[:2] != ("0", "1"):
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert tunables(sysfs)[:2] == ("0", "1")
        r = here("check")
        assert "cachemgr drain /dev/bcache0 --resume" in r.stdout, r.stdout
        r = here("restore")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "/dev/bcache0: restored tunables" in r.stdout, r.stdout
        assert tunables(sysfs) == ("10", "30", "1")
        assert '"procedure": "drain"' not in here("status", "--json").stdout
        assert "--resume" not in here("check").stdout
        r = here("drain", "/dev/bcache0", "--resume")
        assert r.returncode == 4, r.stderr
        r = here("restore")
        assert r.returncode == 4 and "nothing to put back" in r.stdout, r.stdout
    finally:
        stop_light(reader)
    assert not list((Path(state.state_dir()) / "drain").glob("*.json"))
