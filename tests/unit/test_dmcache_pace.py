"""The paced dm-cache drain (cachemgr/backends/dmcache/pacing.py): the pacer in percent of
copy time, the throttle journaled before it changes and put back whatever ends the drain
(also by the next drain after a kill), on fake counters in a tmp sysfs tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachemgr.backends.dmcache import pacing
from cachemgr.core import pace, state
from cachemgr.core.sysfs import Sysfs

VM, ORIGIN = "dm-2", "sdb"


def _tree(tmp_path: Path, throttle: str = "100") -> Sysfs:
    root = tmp_path / "sys"
    p = root / pacing.PARAM
    p.parent.mkdir(parents=True)
    p.write_text(f"{throttle}\n")
    for name in (VM, ORIGIN):
        (root / "block" / name).mkdir(parents=True)
        (root / "block" / name / "stat").write_text("0 0 0 0 0 0 0 0 0 0 0\n")
    return Sysfs(root)


class _SlowVm:
    """The VMs' counters on the cache device: ``n`` IOs of ``ms`` each per reading."""

    def __init__(self, sysfs: Sysfs, n: int = 4, ms: int = 50) -> None:
        self.path, self.n, self.ms, self.ios = sysfs.path(f"block/{VM}/stat"), n, ms, 0

    def tick(self) -> None:
        self.ios += self.n
        self.path.write_text(f"{self.ios} 0 {8 * self.ios} {self.ms * self.ios} 0 0 0 0 0 0 0\n")


def _throttle(sysfs: Sysfs) -> str:
    return sysfs.read(pacing.PARAM).strip()


@pytest.fixture
def statedir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from tests.unit.tui_helpers import kernel_writes

    kernel_writes(monkeypatch)  # a write reads back as the kernel's would
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def test_a_percent_pacer_halves_from_the_ceiling_and_unpaces_at_it() -> None:
    p = pace.Pacer(10, floor=1, start=5, ceiling=100, fmt=pacing.percent)
    assert p.pace == 5
    p.decide(0, None, 0, None)  # the first call starts the period
    d = p.decide(2, 30, 20, None)  # over the bound: half, whatever the drain wrote
    assert (d.pace, d.changed) == (2, True) and p.lowered == 1
    assert p.decide(4, 30, 20, None).pace == 1
    assert p.decide(6, 30, 20, None).pace == 1  # never below the floor
    assert p.decide(8, 2, 20, None).pace == 2  # under half the bound: up by half, +1
    for t in range(10, 30, 2):
        p.decide(t, 2, 20, None)
    assert p.pace is None and p.note.startswith("unpaced")  # at the ceiling: unpaced
    d = p.decide(30, 30, 20, None)  # over again, from unpaced: half the ceiling
    assert d.pace == 50
    assert "holding" in p.decide(32, 7, 20, None).note and p.pace == 50
    assert p.decide(34, 7, 20, None).note.startswith("paced at 50%")


def test_the_throttle_is_journaled_first_paced_and_put_back(
        tmp_path: Path, statedir: Path) -> None:
    sysfs = _tree(tmp_path, "80")
    vm = _SlowVm(sysfs)
    seen: list[tuple[str, dict[str, object] | None]] = []
    clock = [0.0]
    with pacing.paced(sysfs, VM, ORIGIN, 10, "/dev/mapper/vc") as p:
        assert p is not None
        seen.append((_throttle(sysfs), state.read_json(pacing.journal())))
        p.pacer.period = 0.0
        p.clock = lambda: clock[0]
        for _ in range(4):
            clock[0] += 1
            vm.tick()
            p.sampler.read()
            p.step("/dev/mapper/vc")
        seen.append((_throttle(sysfs), None))
        words, summary = p.words(), p.summary()
    assert seen[0][0] == "5" and seen[0][1] is not None and seen[0][1]["original"] == 80
    assert seen[1][0] == "1"  # 50 ms IOs over a 10 ms bound: down to the floor
    assert "copy time 1%" in words and "slowed" in words
    assert summary["lowered"] and summary["slowest_words"] == pacing.pace_words(1)
    assert _throttle(sysfs) == "80" and not pacing.journal().exists()


def test_put_back_when_the_drain_fails(tmp_path: Path, statedir: Path) -> None:
    sysfs = _tree(tmp_path)
    with pytest.raises(KeyboardInterrupt), pacing.paced(sysfs, VM, ORIGIN, 10, "vc"):
        assert _throttle(sysfs) == "5"
        raise KeyboardInterrupt  # Ctrl-C, or SIGTERM (signals.terminate_as_interrupt)
    assert _throttle(sysfs) == "100" and not pacing.journal().exists()


def test_a_killed_drains_throttle_is_put_back_by_the_next(
        tmp_path: Path, statedir: Path) -> None:
    sysfs = _tree(tmp_path, "3")  # a killed paced drain left its pace ...
    state.write_json(pacing.journal(), {"original": 100, "device": "vc", "started": 0})
    with pacing.paced(sysfs, VM, ORIGIN, 10, "vc"):
        # ... and its journal: the value it found is the original, not its pace
        assert state.read_json(pacing.journal())["original"] == 100  # type: ignore[index]
    assert _throttle(sysfs) == "100"
    sysfs.write(pacing.PARAM, "3")
    state.write_json(pacing.journal(), {"original": 100, "device": "vc", "started": 0})
    assert pacing.restore_stale(sysfs) == 100 and _throttle(sysfs) == "100"  # --resume
    assert pacing.restore_stale(sysfs) is None  # nothing left


def test_a_bad_journal_is_refused_and_nothing_changes(tmp_path: Path, statedir: Path) -> None:
    sysfs = _tree(tmp_path, "3")
    state.write_json(pacing.journal(), {"original": "fast"})
    with pytest.raises(state.StateFileError), pacing.paced(sysfs, VM, ORIGIN, 10, "vc"):
        pass
    assert _throttle(sysfs) == "3"


def test_unpaced_changes_nothing_and_no_module_no_pace(tmp_path: Path, statedir: Path) -> None:
    sysfs = _tree(tmp_path)
    with pacing.paced(sysfs, VM, ORIGIN, None, "vc") as p:
        assert p is None
    assert not pacing.journal().exists() and _throttle(sysfs) == "100"
    sysfs.write(pacing.PARAM, "3")  # a killed paced drain's: an unpaced one puts it back
    state.write_json(pacing.journal(), {"original": 100, "device": "vc", "started": 0})
    with pacing.paced(sysfs, VM, ORIGIN, None, "vc"):
        assert _throttle(sysfs) == "100"
    assert not pacing.journal().exists()
    sysfs.path(pacing.PARAM).unlink()
    from cachemgr.core.errors import CacheMgrError
    with pytest.raises(CacheMgrError, match="cache_copy_throttle"), \
            pacing.paced(sysfs, VM, ORIGIN, 10, "vc"):
        pass
    assert not pacing.journal().exists()


def test_an_unpaced_drain_beside_a_paced_one_says_it_copies_at_its_pace(
        tmp_path: Path, statedir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The throttle is the module's: a second, unpaced drain runs at the paced one's pace,
    and says so (it cannot put back what the running one holds)."""
    import threading

    sysfs = _tree(tmp_path)
    seen: list[object] = []

    def unpaced() -> None:  # another TUI worker, or another process: not the lock's owner
        with pacing.paced(sysfs, VM, ORIGIN, None, "vd") as p:
            seen.extend([p, _throttle(sysfs)])

    with pacing.paced(sysfs, VM, ORIGIN, 10, "vc"):
        assert _throttle(sysfs) == "5"
        with caplog.at_level("WARNING"):
            t = threading.Thread(target=unpaced)
            t.start()
            t.join()
        assert seen == [None, "5"] and pacing.journal().exists()
    assert "vd: another paced dm-cache drain holds dm_cache's cache_copy_throttle at 5%" \
        in caplog.text
    assert _throttle(sysfs) == "100"


def test_resume_puts_back_a_throttle_whose_flush_journal_is_gone(
        tmp_path: Path, statedir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed between setting the throttle and writing the flush's journal (or after its
    journal went): `drain DEV --resume` finds no flush journal but puts the throttle back."""
    from cachemgr.procedures.kinds import dm

    sysfs = _tree(tmp_path, "3")
    state.write_json(pacing.journal(), {"original": 100, "device": "vc", "started": 0})
    obj = type("Obj", (), {"node": "/dev/mapper/vc", "name": "vc"})()
    monkeypatch.setattr(dm.flushing, "lock_key", lambda o: "dmcache-flush-vc")
    monkeypatch.setattr(dm.flushing, "journal", lambda o: statedir / "none.json")
    kind = dm.DmCache.__new__(dm.DmCache)
    kind.obj = obj  # type: ignore[misc]
    assert kind.restore_interrupted(sysfs) == {"cache_copy_throttle": 100}
    assert _throttle(sysfs) == "100" and not pacing.journal().exists()
    assert kind.restore_interrupted(sysfs) == {}  # nothing left: "no interrupted flush"


def test_a_pace_that_cannot_start_leaves_no_journal(
        tmp_path: Path, statedir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its counters unreadable as the drain starts: no journal is left behind, which a later
    drain would 'put back' over what the admin set in between."""
    sysfs = _tree(tmp_path)

    def broken(*a: object) -> None:
        raise OSError("no such device")

    monkeypatch.setattr(pacing.blockdev, "pace_sources", broken)
    with pytest.raises(OSError), pacing.paced(sysfs, VM, ORIGIN, 10, "vc"):
        pass
    assert not pacing.journal().exists() and _throttle(sysfs) == "100"

