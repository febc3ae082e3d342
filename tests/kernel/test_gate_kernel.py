"""The one gate (cachemgr/ops/gate.py) on the lab kernel, tried as a second admin would:
every change to a device a drain or a replace-ssd run owns is refused (exit 3) and changes
nothing; an interrupted drain owns its device until it is resumed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core import runner, state
from cachemgr.core.model import CacheMode
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
    """A second admin loops tune, mode, detach, attach and drain over the set's devices
    during ``replace-ssd --yes`` under fio verify load: while the run's process holds them,
    and after it died (killed after its attach step) until it is resumed. Each is refused
    (exit 3, naming the run); the resumed run finishes with every byte verified, the modes
    and tunables it promised."""
    sysfs, devices, ssds = setup(lab_disks)
    old, modes = status_modes(sysfs)
    keys = [b.key for b in snapshot.take(sysfs).backings]
    load = start_load(devices)
    tries: list[tuple[tuple[str, ...], int, str]] = []

    def round_of_tries() -> None:
        for dev in devices:
            for args in second_admin(dev, old):
                r = here(*args)
                tries.append((args, r.returncode, r.stderr))

    try:
        # its progress to a file: a pipe nobody reads while the loop runs could fill up
        log = open("/tmp/replace-run.log", "w+")  # noqa: SIM115
        run = subprocess.Popen(
            [sys.executable, "-m", "cachemgr", "replace-ssd", ssds[0].node, "--yes"],
            stdout=log, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd(), KILL_AFTER_ENV: "attach"})
        # from the moment the run holds its devices (it holds them, then its journal owns
        # them, without a gap) the second admin tries
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None and \
                state.current_holder(keys[0]) is None:
            time.sleep(0.1)
        while run.poll() is None:
            round_of_tries()
            time.sleep(0.2)
        assert run.returncode == -signal.SIGKILL, log.read()
        round_of_tries()  # the run is interrupted: its journal owns the devices
        interrupted = tries[-len(devices) * 5:]
        assert all("interrupted" in e for _, _, e in interrupted), interrupted
        run_id = replace.list_runs()[-1].id
        r = here("replace-ssd", "--resume", run_id)
        assert r.returncode == 0, r.stderr
    finally:
        stop_load(load)
    assert {a[0] for a, _, _ in tries} >= {"tune", "mode", "detach", "attach", "drain"}
    assert len(tries) >= 20, tries
    through = [(a, rc, e) for a, rc, e in tries if rc != 3]
    assert not through, through
    assert all("replace-ssd run" in e for _, _, e in tries), tries[:3]
    end_state(sysfs, old, modes)
    verify_pre(devices)
