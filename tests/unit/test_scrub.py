"""``cachemgr scrub`` off the kernel: its refusals come before any read or change, cache_dump's
output is read exactly, the comparison finds every differing page and only those (a block
written between two reads is not one), and a scrub's findings reach check and the metrics.
What the kernel does (the corrupted copies served, found and dropped) is
tests/kernel/test_scrub_kernel.py's."""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachemgr.backends.dmcache import mappings
from cachemgr.cli.main import main
from cachemgr.core.errors import KernelFormatError
from cachemgr.procedures import kinds, scrub
from tests.unit.guards import mutations_refused
from tests.unit.tui_helpers import copy_capture

# cache_dump (thin-provisioning-tools 0.9.0) of a lab device: 64 KiB blocks, 3 mapped
DUMP = """<superblock uuid="" block_size="128" nr_cache_blocks="1024" policy="" hint_width="4">
  <mappings>
    <mapping cache_block="0" origin_block="0" dirty="false"/>
    <mapping cache_block="1" origin_block="7" dirty="false"/>
    <mapping cache_block="5" origin_block="2" dirty="true"/>
  </mappings>
  <hints>
    <hint cache_block="0" data="AAAAAA=="/>
  </hints>
</superblock>
"""


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def cli(root: Path, argv: Sequence[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["--sysfs-root", str(root), *argv])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    logging.root.handlers.clear()
    return rc, out.getvalue(), err.getvalue()


def test_cache_dump_is_read_exactly() -> None:
    assert mappings.parse(DUMP) == {0: (0, False), 7: (1, False), 2: (5, True)}
    with pytest.raises(KernelFormatError, match="mapping"):
        mappings.parse(DUMP.replace('dirty="false"/>', 'dirty="maybe"/>', 1))
    with pytest.raises(KernelFormatError):
        mappings.parse("syscall 'open' failed: Device or resource busy\n")


@given(st.dictionaries(st.integers(0, 2**40), st.tuples(st.integers(0, 2**31),
                                                        st.booleans()), max_size=20))
def test_cache_dump_round_trip(m: dict[int, tuple[int, bool]]) -> None:
    lines = "".join(f'    <mapping cache_block="{c}" origin_block="{o}" '
                    f'dirty="{"true" if d else "false"}"/>\n' for o, (c, d) in m.items())
    text = (f'<superblock uuid="" block_size="128" nr_cache_blocks="9" policy="" '
            f'hint_width="4">\n  <mappings>\n{lines}  </mappings>\n</superblock>\n')
    assert mappings.parse(text) == m


def test_a_dirty_writeback_cache_is_refused_before_anything(
        tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    ran = mutations_refused(monkeypatch)
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (opened.append(str(p)),
                                                       real_open(p, *a, **k))[1])
    rc, _, err = cli(root, ["scrub", "/dev/bcache0"])
    assert rc == 3, err
    assert "/dev/bcache0 is in writeback with 4.4 MiB of dirty data" in err, err
    assert "cachemgr mode /dev/bcache0 writethrough --drain && cachemgr scrub /dev/bcache0" \
        in err
    assert ran == []
    assert not [p for p in opened if p.startswith("/dev/")]  # nothing read
    assert not (state_dir / scrub.RECORD).exists()


def test_the_kinds_that_scrub() -> None:
    can = {k.name for k in kinds.REGISTRY if "scrub" in k.actions}
    # a writecache serves what was written from its SSD until written back: every block it
    # holds may differ from its origin by design
    assert can == {"bcache", "dm-cache", "lvmcache"}


def _disks(tmp_path: Path, n: int) -> tuple[str, str, bytes]:
    data = os.urandom(n)
    origin, served = tmp_path / "origin", tmp_path / "served"
    origin.write_bytes(b"\0" * 8192 + data)  # the data 16 sectors in, as bcache's
    served.write_bytes(data)
    return str(origin), str(served), data


def _corrupt(path: str, offsets: Sequence[int]) -> None:
    with open(path, "r+b") as f:
        for off in offsets:
            f.seek(off + 100)
            f.write(b"\xff" * 8)


@pytest.fixture
def buffered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files stand for the devices: no O_DIRECT (tmpfs refuses it)."""
    monkeypatch.delattr(os, "O_DIRECT", raising=False)


@pytest.mark.usefixtures("buffered")
def test_every_differing_page_is_found_and_nothing_else(tmp_path: Path) -> None:
    origin, served, _ = _disks(tmp_path, 3 << 20)
    bad = [4096, 1 << 20, (1 << 20) + 8192, (3 << 20) - 4096]
    _corrupt(served, bad)
    whole = scrub.Source(served, origin, 8192, scrub.CHUNK, 3 << 20, None, "whole")
    got = scrub.compare(whole, sleep=lambda s: None)
    assert sorted(p for m in got.mismatches for p in m.pages) == bad
    assert [m.block for m in got.mismatches] == [b // 4096 for b in bad]  # told in pages
    assert got.blocks == 3 and got.bytes == 3 << 20 and not got.unsettled
    # a list of 64 KiB blocks: only those compared, a mismatch told per block
    listed = scrub.Source(served, origin, 8192, 65536, 3 << 20, (0, 16, 40), "listed")
    got = scrub.compare(listed, sleep=lambda s: None)
    assert [(m.block, m.pages) for m in got.mismatches] == [
        (0, (4096,)), (16, (1 << 20, (1 << 20) + 8192))]
    assert got.blocks == 3


@pytest.mark.usefixtures("buffered")
def test_a_block_written_between_two_reads_is_not_a_mismatch(tmp_path: Path) -> None:
    origin, served, data = _disks(tmp_path, 1 << 20)
    _corrupt(served, [65536])

    def written(_: float) -> None:  # the write reaches the cache side before the re-read
        with open(served, "r+b") as f:
            f.write(data)

    got = scrub.compare(scrub.Source(served, origin, 8192, scrub.CHUNK, 1 << 20, None, "w"),
                        sleep=written)
    assert got.mismatches == [] and got.rechecked == 1


@pytest.mark.usefixtures("buffered")
def test_a_block_that_never_holds_still_is_unsettled(tmp_path: Path) -> None:
    origin, served, _ = _disks(tmp_path, 1 << 20)

    def churn(_: float) -> None:  # a VM rewriting the block on both sides all the time
        for p, at in ((served, 0), (origin, 8192)):
            with open(p, "r+b") as f:
                f.seek(at)
                f.write(os.urandom(4096))

    _corrupt(served, [0])
    got = scrub.compare(scrub.Source(served, origin, 8192, scrub.CHUNK, 1 << 20, None, "c"),
                        sleep=churn)
    assert got.mismatches == [] and got.unsettled == [0]


def test_a_found_mismatch_warns_in_check_until_a_clean_scrub(tmp_path: Path) -> None:
    root = copy_capture(tmp_path, "dmcache-states")
    found = scrub.Scrubbed("/dev/mapper/vc", blocks=64, bytes=64 << 16,
                           mismatches=[scrub.Mismatch(3, 3 << 16, 65536, (3 << 16,))])
    scrub.record("dmcache-vc", "/dev/mapper/vc", found, how="listed", invalidated=True)
    rc, out, _ = cli(root, ["check"])
    assert rc >= 1, out
    assert "/dev/mapper/vc: the scrub of" in out and "found 1 block served by the cache " \
        "unlike its origin in 4.0 MiB compared (all dropped from the cache)" in out, out
    assert "cachemgr scrub /dev/mapper/vc" in out
    rc, out, _ = cli(root, ["status", "--no-vms"])
    assert "found 1 block served by the cache unlike its origin" in out, out
    scrub.record("dmcache-vc", "/dev/mapper/vc", scrub.Scrubbed("/dev/mapper/vc", 64),
                 how="listed", invalidated=None)
    rc, out, _ = cli(root, ["check"])
    assert "scrub" not in out, out


class _Ours:
    """The scrub's reader as Paced sees it: its reads' count, wall milliseconds, sectors."""

    def __init__(self) -> None:
        self.ios, self.ms, self.sectors = 0, 0.0, 0


@pytest.mark.parametrize("vm_ms, lowered", [(50, True), (8, False)])
def test_the_pacer_sees_the_vms_io_beside_the_scrubs_own(vm_ms: int, lowered: bool) -> None:
    """The device counts the scrub's reads and the VMs'; the scrub's wall time around a read
    is more than the kernel counts for it. The VMs' IO is still seen (it was not, in the lab:
    the difference went negative and the meter started again at every reading), and slow
    VM IO slows the scrub down."""
    from cachemgr.core import pace

    now = [0.0]
    ours = _Ours()
    dev = [7000, 10_000]  # the device's IOs and milliseconds since boot

    def counters() -> pace.Counters:
        return pace.Counters(dev[0], dev[1], 0)

    def sleep(s: float) -> None:
        now[0] += s

    paced = scrub.Paced(20.0, counters, ours, clock=lambda: now[0],  # type: ignore[arg-type]
                        sleep=sleep)
    for _ in range(200):
        now[0] += 0.05
        ours.ios += 1
        ours.ms += 30.0  # its wall time
        ours.sectors += 2048
        dev[0] += 1 + 2  # its read (10 ms in the kernel) and two of the VM's
        dev[1] += 10 + 2 * vm_ms
        paced.wait(1 << 20)
    assert paced.pacer is not None
    assert (paced.pacer.lowered > 0) == lowered, paced.pacer.note
    assert "no other IO" not in paced.pacer.note
