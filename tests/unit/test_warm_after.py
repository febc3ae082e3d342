"""The warm an arrival leaves running (issue #42 item 2; cachemgr/ops/migrate.py
``start_warm`` and ``warm_after``, the policy's ``[migration] warm_after``): the hook starts
it and returns, the records say what it does, it reads nothing before libvirt reports the VM
running here, it takes the newest trace that maps onto the device (a trace of the device
itself or of a bcache backing disk before bcache), and what it meets never fails the
arrival. On the VMs capture of tests/unit/test_migrate_hook.py; the hit ratios it gives
back are tests/kernel/test_warm_after_kernel.py's."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cachemgr.cli import hook
from cachemgr.core.errors import UnsafeError
from cachemgr.ops import coherence as coherence_ops
from cachemgr.ops import migrate
from cachemgr.ops.control import Result
from cachemgr.procedures import coherence, kinds, warm
from cachemgr.procedures import policy as policy_mod
from cachemgr.procedures.policy import MigrationPolicy
from tests.unit.test_migrate_hook import _capture, _xml
from tests.unit.test_warm import make_trace

K = 4096


@pytest.fixture
def dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The invalidations the guard asks for (recorded, not run: the capture is no kernel),
    with the state directory in ``tmp_path`` (as tests/unit/test_migrate_hook.py's)."""
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    calls: list[str] = []

    def fake(sysfs: object, target: str, **_: object) -> Result:
        calls.append(target)
        return Result(lines=[f"{target}: dropped"])

    monkeypatch.setattr(coherence_ops, "invalidate", fake)
    return calls


def test_the_policy_keys() -> None:
    pol = policy_mod.parse('version = 1\n[migration]\nwarm_after = true\n'
                           'warm_traces = "/srv/traces"\n')
    assert pol.migration.warm_after is True and pol.migration.warm_traces == "/srv/traces"
    assert policy_mod.parse(policy_mod.dumps(pol)) == pol
    default = policy_mod.parse("version = 1\n").migration
    assert default.warm_after is False and default.warm_traces == "/var/lib/cachemgr/traces"
    with pytest.raises(policy_mod.PolicyError) as e:
        policy_mod.parse('[migration]\nwarm_after = "yes"\nwarm_traces = "traces"\n')
    assert [p.line for p in e.value.problems] == [2, 3]
    assert "absolute directory" in e.value.problems[1].message


def test_the_hook_starts_the_warm_and_returns(tmp_path: Path, dropped: list[str]) -> None:
    sysfs, src = _capture(tmp_path, mode="writethrough", dirty="0.0k")
    spawned: list[list[str]] = []

    def spawn(argv: list[str]) -> int:
        spawned.append(argv)
        return 4242

    pol = MigrationPolicy(warm_after=True, warm_traces="/srv/traces")
    said = migrate.guard(sysfs, "vm-bc", "migrate", _xml("vm-bc"), pol, src=src, spawn=spawn)
    assert dropped == ["/dev/bcache0"]  # the copies are dropped first
    assert said[0] == "/dev/bcache0: dropped"
    assert "warm started in the background (pid 4242)" in said[1], said
    (argv,) = spawned
    assert argv[1:] == ["-m", "cachemgr.cli.hook", "--warm-after", "--traces", "/srv/traces",
                        "--", "vm-bc", "/dev/bcache0"]
    (w,) = coherence.warms()  # pid 4242 is no process here: the record reads cut short
    assert w.device == "/dev/bcache0" and w.domain == "vm-bc" and w.data["pid"] == 4242
    assert w.data["state"] == "waiting"
    # status and vms show it
    assert any("the warm started" in line and "vm-bc" in line
               for line in coherence_ops.mark_lines())
    assert coherence_ops.warm_json()[0]["device"] == "/dev/bcache0"
    # without warm_after nothing is started
    spawned.clear()
    assert migrate.guard(sysfs, "vm-bc", "migrate", _xml("vm-bc"), MigrationPolicy(),
                         src=src, spawn=spawn) == ["/dev/bcache0: dropped"]
    assert spawned == []


def test_a_warm_that_cannot_start_never_fails_the_arrival(tmp_path: Path,
                                                          dropped: list[str]) -> None:
    sysfs, src = _capture(tmp_path, mode="writethrough", dirty="0.0k")

    def spawn(argv: list[str]) -> int:
        raise OSError(12, "Cannot allocate memory")

    said = migrate.guard(sysfs, "vm-bc", "migrate", _xml("vm-bc"),
                         MigrationPolicy(warm_after=True), src=src, spawn=spawn)
    assert "the warm could not start" in said[1] and "the VM starts cold" in said[1]
    (w,) = coherence.warms()
    assert w.state == "failed" and "Cannot allocate memory" in w.words()


def test_the_real_spawn_is_detached_and_the_hook_does_not_wait(tmp_path: Path) -> None:
    """The process outlives the call, in a session of its own, on /dev/null (libvirt reads
    the hook's stdout and stderr until they close)."""
    flag = tmp_path / "done"
    t0 = time.monotonic()
    pid = migrate._spawn(["/bin/sh", "-c",
                          f"sleep 1; ls -l /proc/$$/fd > {flag}.part; mv {flag}.part {flag}"])
    assert time.monotonic() - t0 < 0.5
    assert os.getsid(pid) == pid  # its own session
    deadline = time.monotonic() + 30  # a bound, not a measurement
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    fds = flag.read_text()
    assert fds.count("/dev/null") >= 3, fds


class FakeLibvirt:
    """A VirshSource whose domain is not there, then paused (an incoming migration), then
    running: the answers ``virsh list``, ``dumpxml`` and ``domstate`` give."""

    uri = "test:///"
    UUID = "0b0a2d5e-8a4b-4a57-9a51-6c1d2f3e4a5b"

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.asked = 0

    def available(self) -> str | None:
        return None

    def output(self, *args: str) -> str:
        if args[0] == "list":
            if self.states[0] == "gone":  # not defined here yet: asked again later
                self.states.pop(0)
                return ""
            return self.UUID + "\n"
        if args[0] == "dumpxml":
            return "<domain><name>vm-bc</name></domain>"
        if args[0] == "domstate":
            self.asked += 1
            st = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            return st + "\n"
        raise AssertionError(args)

    def devno(self, path: str) -> tuple[str, bool] | None:
        return None

    def domains(self) -> tuple[list[tuple[str, str, str]], list[str]]:
        raise AssertionError("not asked")


def test_wait_running_waits_for_libvirt_to_say_running() -> None:
    lv = FakeLibvirt(["paused", "paused", "running"])
    slept: list[float] = []
    assert migrate.wait_running(lv, "vm-bc", sleep=slept.append) == "running"
    assert lv.asked == 3 and slept == [migrate.WARM_POLL_S] * 2
    # a migration that never completes here: its last state once the wait is over
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    assert migrate.wait_running(FakeLibvirt(["paused"]), "vm-bc", timeout=5, poll=1,
                                sleep=sleep, clock=lambda: now[0]) == "paused"

    class Down(FakeLibvirt):
        def available(self) -> str | None:
            return "libvirt's daemon is not running"

    assert "cannot be asked" in migrate.wait_running(Down(["running"]), "vm-bc")


@pytest.fixture
def warmed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The warms run (recorded, not run: the capture is no kernel)."""
    from cachemgr.ops import warm as warm_ops

    calls: list[tuple[str, str]] = []

    def fake(sysfs: object, target: str, trace: str, **_: object) -> Result:
        calls.append((target, trace))
        return Result(lines=[f"warm {target}: 16 MiB of its hottest blocks read"],
                      data={"admitted": {"fraction": 1.0}, "seconds": 2.5})

    monkeypatch.setattr(warm_ops, "warm", fake)
    monkeypatch.setattr(warm, "device_size", lambda sysfs, node: {
        "/dev/bcache0": 1 << 30}.get(node))
    return calls


def test_the_warm_reads_nothing_until_the_vm_runs_here(
        tmp_path: Path, dropped: list[str], warmed: list[tuple[str, str]]) -> None:
    sysfs, _ = _capture(tmp_path, mode="writethrough", dirty="0.0k")
    traces = tmp_path / "traces"
    traces.mkdir()
    make_trace(traces / "bc.trace", [(9 * K, K, 0)], name="bcache0", size=1 << 30)
    # the migration failed: the domain never ran here
    rc = migrate.warm_after(sysfs, "vm-bc", ["/dev/bcache0"], str(traces),
                            src=FakeLibvirt(["paused"]), wait_s=0, poll_s=0)
    assert rc == 1 and warmed == []
    (w,) = coherence.warms()
    assert w.state == "skipped" and "did not run here (paused): nothing read" in w.words()
    # it ran: warmed from the trace
    rc = migrate.warm_after(sysfs, "vm-bc", ["/dev/bcache0"], str(traces),
                            src=FakeLibvirt(["gone", "paused", "running"]), poll_s=0)
    assert rc == 0 and warmed == [("/dev/bcache0", str(traces / "bc.trace"))]
    (w,) = coherence.warms()
    assert w.state == "done" and w.data["admitted_fraction"] == 1.0
    assert "16 MiB of its hottest blocks read" in w.words()
    assert json.loads(json.dumps(coherence.warm_json()))[0]["state"] == "done"


def test_the_newest_trace_that_maps_is_taken(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Of a directory of traces: one of another device and one that is no trace are passed
    over, saying why; of two that map (the device's own, the backing disk's before bcache)
    the one recorded last."""
    from tests.unit.test_warm_sources import DATA_OFFSET, bcache_kind
    from tests.unit.test_warm_sources import sizes as lab_sizes

    lab_sizes(monkeypatch)
    sysfs, k = bcache_kind()
    d = tmp_path / "traces"
    d.mkdir()
    assert warm.find_trace(sysfs, k, str(d)) == (None, [f"no *.trace file in {d}"])
    make_trace(d / "a-other.trace", [(0, K, 0)], name="sdz", size=1 << 20)
    (d / "b-junk.trace").write_bytes(b"not gzip")
    own = make_trace(d / "c-own.trace", [(0, K, 0)], name="bcache0",
                     size=(1 << 30) - DATA_OFFSET)
    assert own.header.started == 0.0
    path, why = warm.find_trace(sysfs, k, str(d))
    assert path == str(d / "c-own.trace")
    assert any(w.startswith("a-other.trace: the trace is of another device") for w in why)
    assert "b-junk.trace: not a cachemgr trace" in why
    # the bare disk traced later (before bcache, say): newer, and it maps (shifted)
    import cachemgr.procedures.trace as tr

    h = tr.Header(block=K, rate=1.0, started=100.0,
                  devices=[tr.Device(0, "/dev/ubda", "ubda", "98:0", 1 << 30)])
    w = tr.Writer(d / "d-disk.trace", h)
    w.add(0.0, 9 * K, K, 0, 0)
    w.close({"seconds": 1.0})
    assert warm.find_trace(sysfs, k, str(d))[0] == str(d / "d-disk.trace")
    assert warm.find_trace(sysfs, k, str(tmp_path / "none"))[0] is None


def test_no_trace_and_a_refusal_are_recorded_and_the_next_device_goes_on(
        tmp_path: Path, dropped: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from cachemgr.ops import warm as warm_ops

    sysfs, _ = _capture(tmp_path, mode="writethrough", dirty="0.0k")
    empty = tmp_path / "traces"
    empty.mkdir()
    rc = migrate.warm_after(sysfs, "vm-bc", ["/dev/bcache0"], str(empty),
                            src=FakeLibvirt(["running"]))
    assert rc == 1
    (w,) = coherence.warms()
    assert w.state == "skipped" and "no trace in" in w.words()
    assert "cachemgr trace /dev/bcache0 --rate 1 -o" in w.words()

    def busy(*_: object, **__: object) -> Result:
        raise UnsafeError("/dev/bcache0 is busy: drain run 1 holds it", hint="wait for it")

    monkeypatch.setattr(warm_ops, "warm", busy)
    monkeypatch.setattr(warm, "find_trace", lambda *_: ("/x.trace", []))
    rc = migrate.warm_after(sysfs, "vm-bc", ["/dev/bcache0", "/dev/nothing"], str(empty),
                            src=FakeLibvirt(["running"]))
    assert rc == 1
    got = {w.device: w for w in coherence.warms()}
    assert got["/dev/bcache0"].state == "failed"
    assert "drain run 1 holds it (next: wait for it)" in got["/dev/bcache0"].words()
    assert got["/dev/nothing"].state == "skipped"


def test_the_hook_entry_reads_its_arguments(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, list[str], str]] = []
    monkeypatch.setattr(migrate, "warm_after", lambda sysfs, d, n, t: seen.append((d, n, t))
                        or 0)
    assert hook.main(["--warm-after", "--traces", "/t", "--", "vm1", "/dev/bcache0"]) == 0
    assert seen == [("vm1", ["/dev/bcache0"], "/t")]
    assert hook.main(["--warm-after", "vm1"]) == 2


def test_a_record_whose_process_is_gone_reads_interrupted(tmp_path: Path,
                                                          dropped: list[str]) -> None:
    coherence.warm_record("k", "/dev/bcache0", "running", domain="vm1", pid=2 ** 22 + 7)
    (w,) = coherence.warms()
    assert w.state == "interrupted" and "cut short" in w.words()
    coherence.warm_record("k", "/dev/bcache0", "running")  # this process: alive
    assert coherence.warms()[0].state == "running"
    assert kinds  # the registry's kinds are what warm_after resolves nodes with


def test_release_stops_the_warm_of_a_vm_that_left(tmp_path: Path, dropped: list[str]) -> None:
    """Only a process whose command line is the warm's is signalled; it records that it
    stopped and exits 1."""
    import subprocess
    import sys

    sysfs, src = _capture(tmp_path, mode="writethrough", dirty="0.0k")
    (h,) = migrate.hazards(sysfs, _xml("vm-bc"), src)
    assert h.key is not None
    # a process with another command line under the recorded pid: left alone
    other = subprocess.Popen(["sleep", "30"])
    coherence.warm_record(h.key, h.node, "running", domain="vm-bc", pid=other.pid)
    assert migrate.stop_warm(h.key) is False and other.poll() is None
    other.kill()
    other.wait()
    # the warm itself, waiting for a VM that never runs (libvirt unreachable for ever)
    env = {**os.environ, "CACHEMGR_HOOK_SYSFS": str(sysfs.root),
           "CACHEMGR_LIBVIRT_URI": "test:///default", "PYTHONPATH": str(Path.cwd())}
    p = subprocess.Popen([sys.executable, "-m", "cachemgr.cli.hook", "--warm-after",
                          "--traces", str(tmp_path), "--", "no-such-vm", h.node], env=env)
    deadline = time.monotonic() + 120  # a bound: the interpreter's start under load
    while time.monotonic() < deadline and not (
            coherence.warms() and coherence.warms()[0].data.get("pid") == p.pid):
        time.sleep(0.1)
    said = migrate.release(sysfs, "vm-bc", _xml("vm-bc"), src)
    assert said[-1] == "/dev/bcache0: the warm its arrival started was stopped", said
    assert p.wait(timeout=60) == 1
    (w,) = coherence.warms()
    assert w.state == "failed" and "stopped (SIGTERM: the VM left this host" in w.words()
