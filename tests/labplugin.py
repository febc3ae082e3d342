"""pytest integration of the lab: tests marked ``kernel`` run inside a real kernel.

On the host, each ``@pytest.mark.kernel`` test boots its own lab guest (fresh scratch disks
and module state every time) and runs itself there with the same pytest; its outcome, output
and failure text come back and are reported as the test's own. Inside the guest
(CACHEMGR_IN_LAB=1) kernel tests run normally and plain unit tests are not collected twice.

    @pytest.mark.kernel(disks="1G,256M", udev=False, timeout=300)

``systemd=True`` boots systemd as PID 1 and runs the test as a service once multi-user.target
is up; ``setup=[argv...]`` runs a command first (before systemd), e.g. what a host has on its
disks and in /etc when it boots. ``libvirt=True`` mounts cgroup v2 with machine.slice and starts
libvirtd (qemu:///system) before the test.

A ``timeout`` given for UML is tripled on qemu (TCG), unless ``qemu_timeout`` says otherwise;
``qemu_cpus`` (default 1 here) sets a qemu guest's CPUs (core.LabSpec says when two cost less).

``--lab-backend=uml|qemu`` picks the kernel; ``--no-lab`` skips kernel tests (they are then
reported as skipped with the reason, never as passed).

Longest first: the kernel tests run in the order of their wall time in a recorded run
(tests/kernel/durations.json, longest first; a test not in it after the recorded ones, in
file order), so that with xdist's workers (scripts/test.sh: ``-n 3 --dist worksteal``) the
longest test starts at once instead of last in its file's turn, and the short ones fill the
end. ``--lab-durations=FILE`` writes this run's wall times there (the recorded ones kept for
the tests that did not run), to refresh it after a full run.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
from _pytest.reports import TestReport

IN_LAB = os.environ.get("CACHEMGR_IN_LAB") == "1"
ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("cachemgr lab")
    g.addoption("--lab-backend", choices=("uml", "qemu"),
                default=os.environ.get("CACHEMGR_LAB_BACKEND", "uml"),
                help="kernel for tests marked kernel (default: uml)")
    g.addoption("--no-lab", action="store_true", help="skip tests marked kernel")
    g.addoption("--lab-durations", metavar="FILE",
                help="write each kernel test's wall time in this run to FILE (JSON; "
                     "tests/kernel/durations.json orders the kernel tests longest first)")


DURATIONS = ROOT / "tests" / "kernel" / "durations.json"


def recorded_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Each kernel test's wall time (s) by node id in a recorded run; none without the file."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {str(k): float(v) for k, v in doc["wall_s"].items()}


def longest_first(items: list[pytest.Item], recorded: dict[str, float]) -> list[pytest.Item]:
    """The kernel tests, in the places kernel tests hold among ``items``, ordered by their
    recorded wall time, longest first; those without one after them, in their own order
    (a stable sort). Other tests keep their places."""
    slots = [i for i, item in enumerate(items) if item.get_closest_marker("kernel")]
    kernel = sorted((items[i] for i in slots),
                    key=lambda item: -recorded.get(item.nodeid, 0.0))
    out = list(items)
    for i, item in zip(slots, kernel, strict=True):
        out[i] = item
    return out


def _lab_problem(backend: str) -> str | None:
    from cachemgr.lab import kernels

    info = kernels.load_manifest().get(backend)
    if info is None or not Path(info.kernel).exists():
        return f"the {backend} lab kernel is not installed (run scripts/setup.sh)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IN_LAB:
        return
    items[:] = longest_first(items, recorded_durations())
    backend = config.getoption("--lab-backend")
    reason = "--no-lab given" if config.getoption("--no-lab") else _lab_problem(backend)
    for item in items:
        m = item.get_closest_marker("kernel")
        if m is None:
            continue
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"kernel test not run: {reason}"))
        elif backend != "qemu" and "nvme:" in str(m.kwargs.get("disks", "")):
            item.add_marker(pytest.mark.skip(
                reason="kernel test not run: its NVMe disks need the qemu lab "
                       "(--lab-backend=qemu); UML has no PCI"))
        elif backend != "qemu" and m.kwargs.get("qemu_only"):
            item.add_marker(pytest.mark.skip(
                reason=f"kernel test not run: {m.kwargs['qemu_only']} (--lab-backend=qemu)"))
        elif backend != "qemu" and m.kwargs.get("monitor"):
            item.add_marker(pytest.mark.skip(
                reason="kernel test not run: it needs qemu's machine monitor "
                       "(--lab-backend=qemu)"))


def _report(item: pytest.Item, when: str, outcome: str, longrepr: object, duration: float,
            sections: list[tuple[str, str]]) -> TestReport:
    now = time.time()
    return TestReport(
        nodeid=item.nodeid,
        location=item.location,
        keywords={k: 1 for k in item.keywords},
        outcome=outcome,  # type: ignore[arg-type]
        longrepr=longrepr,  # type: ignore[arg-type]
        when=when,  # type: ignore[arg-type]
        sections=sections,
        duration=duration,
        start=now - duration,
        stop=now,
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    marker = item.get_closest_marker("kernel")
    if IN_LAB or marker is None or item.get_closest_marker("skip"):
        return None
    from cachemgr.lab import core

    config = item.config
    backend = config.getoption("--lab-backend")
    kw = marker.kwargs
    disks, nvme = core.parse_disk_specs(kw.get("disks", "")) if kw.get("disks") else ((), ())
    timeout = float(kw.get("timeout", 300 if backend == "uml" else 900))
    if backend == "qemu" and "timeout" in kw:  # TCG runs guest code 5-20x slower than UML
        timeout = float(kw.get("qemu_timeout", 3 * timeout))
    resdir = Path(tempfile.mkdtemp(prefix="kernel-test-", dir=core.runs_dir()))
    result_file = resdir / "result.json"
    spec = core.LabSpec(
        backend=backend,
        disks=disks,
        nvme=nvme,
        udev=bool(kw.get("udev", False)),
        libvirt=bool(kw.get("libvirt", False)),
        monitor=bool(kw.get("monitor", False)),
        timeout=timeout,
        mem_mb=int(kw.get("mem", 1536)),
        cwd=str(ROOT),
        rw_paths=(str(resdir),),
        # the guest's pytest loads no third-party plugin: the unit tests' (Textual's
        # snapshots, hypothesis, xdist) cost an import of Textual and hypothesis per test,
        # seconds under qemu's TCG, and no kernel test uses them
        # LANGUAGE=C: no message catalogue looked for. argparse asks gettext for each of
        # its own strings (141 times for cachemgr's parser, on every CLI call in or out of
        # process); under LANG=C.UTF-8 each ask is a stat of a .mo file that is not there,
        # a host round trip through the guest's hostfs root: 65 against 25 ms of host CPU
        # per parser (docs/benchmarks.md, "Test suite time"). Nothing is translated either
        # way: the same English messages.
        env={"CACHEMGR_LAB_RESULT": str(result_file), "PYTHONDONTWRITEBYTECODE": "1",
             "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "LANGUAGE": "C"},
        systemd=bool(kw.get("systemd", False)),
        setup=tuple(kw.get("setup", ())),
        # one by default: most tests do one thing at a time, which costs TCG less host CPU
        # on one (lab.core.LabSpec.qemu_cpus); a procedure under fio's load asks for two
        qemu_cpus=int(kw.get("qemu_cpus", 1)),
    )
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x",
            "--no-header", "-rN", "--tb=short", "--color=no", item.nodeid]
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    t0 = time.monotonic()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = core.run(argv, spec, capture=True)
    duration = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the guest's CPU on the host (its kernel and every process in it: all are children of
    # this worker, reaped when the lab ends): what the suite's time is made of on 2 CPUs
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    out = (res.stdout or b"").decode(errors="replace")
    err = (res.stderr or b"").decode(errors="replace")
    sections = [(f"Captured stdout (lab {backend} {res.kernel_release})", out)]
    if err.strip():
        sections.append((f"Captured stderr (lab {backend})", err))
    inner: list[dict[str, str]] = []
    if result_file.exists():
        inner = [json.loads(line) for line in result_file.read_text().splitlines() if line]
    shutil.rmtree(resdir, ignore_errors=True)
    outcome, longrepr = "passed", None
    failed = [r for r in inner if r["outcome"] == "failed"]
    skipped = [r for r in inner if r["outcome"] == "skipped"]
    calls = [r for r in inner if r["when"] == "call" and r["outcome"] == "passed"]
    if failed:
        outcome = "failed"
        longrepr = f"[in the {backend} lab, kernel {res.kernel_release}]\n" + failed[0]["longrepr"]
    elif skipped:
        outcome = "skipped"
        longrepr = (str(item.path), (item.location[1] or 0) + 1,
                    f"in the lab: {skipped[0]['longrepr']}")
    elif not calls or res.returncode != 0:
        outcome = "failed"
        longrepr = (f"the lab run ended with exit code {res.returncode} and no test result "
                    f"(timed out: {res.timed_out}); console log: {res.console_log}\n"
                    f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}")
    for when in ("setup", "call", "teardown"):
        if when == "call":
            rep = _report(item, "call", outcome, longrepr, duration, sections)
        elif when == "setup" and outcome == "skipped":
            rep = _report(item, "setup", "skipped", longrepr, 0.0, [])
        else:
            rep = _report(item, when, "passed", None, 0.0, [])
        if when == "call" and outcome == "skipped":
            continue
        if when == "call":
            rep.user_properties.append(("lab_cpu_s", round(cpu, 1)))
        item.ihook.pytest_runtest_logreport(report=rep)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


_LAB_CPU: list[tuple[float, float, str]] = []


def pytest_runtest_logreport(report: TestReport) -> None:
    """On the host: note each kernel test's guest CPU (also from xdist's workers). Inside the
    guest: hand each phase's outcome to the host through the result file."""
    path = os.environ.get("CACHEMGR_LAB_RESULT")
    if not IN_LAB:
        for k, v in report.user_properties:
            if k == "lab_cpu_s" and report.when == "call":
                _LAB_CPU.append((float(v), report.duration, report.nodeid))  # type: ignore[arg-type]
        return
    if not path:
        return
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
    else:
        text = str(report.longrepr) if report.longrepr else ""
    with open(path, "a") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "when": report.when,
                            "outcome": report.outcome, "longrepr": text}) + "\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """``--lab-durations=FILE``: this run's kernel tests' wall times, over FILE's (or the
    recorded ones, when FILE does not exist yet), written on the host (xdist's controller)."""
    out = session.config.getoption("--lab-durations")
    if IN_LAB or not out or not _LAB_CPU or hasattr(session.config, "workerinput"):
        return
    path = Path(out)
    wall = recorded_durations(path if path.exists() else DURATIONS)
    wall.update({nodeid: round(d, 1) for _, d, nodeid in _LAB_CPU})
    doc = {"about": "wall time (s) of each kernel test in a run of scripts/test.sh "
                    "(tests/labplugin.py: --lab-durations); orders the kernel tests "
                    "longest first",
           "wall_s": dict(sorted(wall.items(), key=lambda kv: (-kv[1], kv[0])))}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The kernel tests by the host CPU their guests used, most first (``--durations`` gives
    their wall time, which on a busy machine is mostly waiting for a CPU)."""
    if IN_LAB or not _LAB_CPU or hasattr(terminalreporter.config, "workerinput"):
        return
    total = sum(c for c, _, _ in _LAB_CPU)
    terminalreporter.write_sep("=", f"lab guests' CPU: {total:.0f} s in {len(_LAB_CPU)} tests")
    for c, d, nodeid in sorted(_LAB_CPU, reverse=True)[:25]:
        terminalreporter.write_line(f"{c:8.1f}s cpu {d:8.1f}s wall  {nodeid}")


@pytest.fixture
def lab_disks() -> list[str]:
    """The guest's scratch disks, checked to be block devices: the plain ones (/dev/ubda...
    or /dev/vda...), then the NVMe namespaces of a qemu guest (/dev/nvme0n1..., controller by
    controller in the order of the marker's disks: cachemgr/lab/lab-disks.sh)."""
    import stat

    disks = os.environ.get("LAB_DISKS", "").split()
    for d in disks:
        assert stat.S_ISBLK(os.stat(d).st_mode), f"{d} is not a block device"
    return disks
