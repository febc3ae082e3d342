"""Words, not Python (issue #32 item 6): what cachemgr prints never says ``None``, never the
all-zero UUID bcache writes for "no cache set", never a bare bound of a rounded size.

* every read command and every plan (``--dry-run``) on every captured lab tree: stdout and
  stderr hold no ``None`` word, no ``00000000`` and no ``≤`` (``--json`` may carry null: it is
  not read here);
* every change the code can report (each ``Change(target, "what", ...)`` in cachemgr, with
  nothing before, nothing after, or neither) reads as words;
* the change lines of real runs (mode, attach, detach, tune) on copied captures;
* a backing device whose superblock names the all-zero cache set is on no cache set;
* a size the kernel rounded is said as the range it stands for.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from pathlib import Path

import pytest

from cachemgr.backends import bcache_super, snapshot
from cachemgr.core.change import Change
from cachemgr.core.model import Identity, Size, Snapshot, UnregisteredBcache
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops.control import change_lines
from cachemgr.procedures import kinds
from cachemgr.procedures.kinds.base import size_words
from tests.unit.guards import mutations_refused
from tests.unit.test_state_files import cli
from tests.unit.tui_helpers import FIXTURES, copy_capture, kernel_writes, unpack

REPO = Path(__file__).resolve().parents[2]
# Python's words and the kernel's placeholders, as they leaked (issue #32): "format None ->",
# "detach ... -> None", "cache set 00000000", "512 B (≤ 614 B)"
LEAK = re.compile(r"\bNone\b|00000000|≤")

CAPTURES = sorted(p.name for p in FIXTURES.iterdir() if (p / "sys").is_dir())
READS = [("status",), ("status", "--stats"), ("status", "--no-vms"), ("check",), ("vms",),
         ("ssd-health",), ("scheduler",), ("register", "/dev/cachemgr-no-such-disk")]
POLICY = "version = 1\n[defaults]\nmode = \"writethrough\"\n[protect]\nenabled = true\n"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    return d


def leaks(text: str) -> list[str]:
    return [line for line in text.splitlines() if LEAK.search(line)]


def policy(tmp_path: Path) -> Path:
    p = tmp_path / "cachemgr.toml"
    p.write_text(POLICY)
    os.chmod(p, 0o644)
    return p


def caches_of(root: Path) -> list[str]:
    """What replace-ssd takes on this tree: each cache set, dm-cache device, cached LV."""
    snap = snapshot.take(Sysfs(str(root)))
    names = [k.cache_name for k in kinds.listed(snap)]
    return sorted({n for n in names if n})


def sweep(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Every read command and every plan on ``root``: the lines that leak, per command."""
    mutations_refused(monkeypatch)  # a slip cannot reach this host's disks
    pol = str(policy(tmp_path))
    argvs: list[tuple[str, ...]] = [*READS, ("policy", "check", "--policy", pol),
                                    ("autoattach", "--dry-run", "--policy", pol),
                                    ("protect", "--dry-run", "--policy", pol)]
    argvs += [("replace-ssd", c, "--dry-run") for c in caches_of(root)]
    argvs += [("replace-ssd", c, "--dry-run", "--new", "any") for c in caches_of(root)]
    found = {}
    for argv in argvs:
        _, out, err = cli(root, argv)
        assert "Traceback" not in err, (argv, err)
        assert (out + err).strip(), f"{argv}: said nothing"  # something was read
        bad = leaks(out + err)
        if bad:
            found[" ".join(argv)] = bad
    return found


@pytest.mark.parametrize("capture", CAPTURES)
def test_read_commands_and_plans_say_words(capture: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    root = FIXTURES / capture / "sys"
    assert sweep(root, tmp_path, monkeypatch) == {}


def test_the_packed_capture_says_words_too(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    root = unpack("bcache-64-backing", tmp_path / "packed")
    assert sweep(root, tmp_path, monkeypatch) == {}


# ----------------------------------------------------------------------------- changes


def change_whats() -> set[str]:
    """The ``what`` of every ``Change(target, "what", before, after)`` written in cachemgr
    with a literal word: what a change line can say."""
    found = set()
    for path in (REPO / "cachemgr").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Change" \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                found.add(str(node.args[1].value))
    return found


def test_the_code_makes_changes_of_many_kinds() -> None:
    # the scan below must see them (a refactor that hides them would make it pass vacuously)
    assert {"register", "format", "attach", "detach", "stop", "cache", "remove",
            "unregister", "create"} <= change_whats()


@pytest.mark.parametrize("what", sorted(change_whats()))
def test_every_change_reads_as_words(what: str) -> None:
    for before, after in ((None, "x1"), ("x0", None), (None, None), ("x0", "x1")):
        (line,) = change_lines([Change("/dev/x", what, before, after)])
        assert not LEAK.search(line) and "{" not in line, line
        assert line.startswith("/dev/x: ")
        for v in (before, after):
            assert v is None or v in line, (line, v)


def test_the_change_lines_of_the_issue() -> None:
    assert change_lines([Change("/dev/sdb", "format", None, "bcache backing"),
                         Change("/dev/bcache0", "detach", "fb5bd09d", None),
                         Change("/dev/bcache0", "attach", None, "3a85497b"),
                         Change("vg0/vm1", "cache", "vg0/pool", None),
                         Change("/dev/bcache0", "cache_mode", None, "none")]) == [
        "/dev/sdb: formatted as bcache backing",
        "/dev/bcache0: detached from cache set fb5bd09d",
        "/dev/bcache0: attached to cache set 3a85497b",
        "vg0/vm1: cache vg0/pool -> none",
        "/dev/bcache0: cache_mode unknown -> none"]


DIRTY_CSET = "fb5bd09d-aace-4719-84d5-79fbb9e849bf"  # bcache-writeback-dirty's cache set
FREE_CSET = "3a85497b-f234-4651-a39a-c547edabc679"  # bcache-unattached's (nothing attached)


@pytest.mark.parametrize("capture,argv,says", [
    ("bcache-writeback-dirty", ("mode", "/dev/bcache0", "none", "--yes"),
     "/dev/bcache0: cache_mode writeback -> none"),
    ("bcache-writeback-dirty", ("mode", "/dev/bcache0", "writearound"),
     "/dev/bcache0: cache_mode writeback -> writearound"),
    ("bcache-writeback-dirty", ("detach", "/dev/bcache0", "--yes"),
     f"/dev/bcache0: detached from cache set {DIRTY_CSET}"),
    ("bcache-unattached", ("attach", "/dev/bcache0", FREE_CSET),
     f"/dev/bcache0: attached to cache set {FREE_CSET}"),
    ("bcache-writeback-dirty", ("tune", "/dev/bcache0", "writeback_percent=5"),
     "/dev/bcache0: writeback_percent 10 -> 5"),
])
def test_change_lines_of_real_runs(capture: str, argv: tuple[str, ...], says: str,
                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_capture(tmp_path, capture)
    writes = kernel_writes(monkeypatch)
    mutations_refused(monkeypatch)
    rc, out, err = cli(root, argv)
    assert rc == 0, err
    assert writes, "nothing was written"
    assert says in out.splitlines(), out
    assert leaks(out + err) == []


# ----------------------------------------------------------------------------- bcache's words


NO_SET = ("sb.magic\t\tok\nsb.first_sector\t\t8 [match]\nsb.version\t\t1 [backing device]\n"
          "dev.uuid\t\t6f2c3b4e-0d2a-4c1e-9a43-3f0e2b1d5c77\n"
          "dev.data.cache_mode\t0 [writethrough]\ndev.data.cache_state\t0 [detached]\n"
          "cset.uuid\t\t00000000-0000-0000-0000-000000000000\n")


def test_the_all_zero_cache_set_is_no_cache_set(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = bcache_super.parse_super_show(NO_SET)
    assert "cset.uuid" not in fields and fields["dev.data.cache_state"] == "detached"
    # a real one stays
    named = bcache_super.parse_super_show(NO_SET.replace("00000000-0000-0000-0000-000000000000",
                                                         DIRTY_CSET))
    assert named["cset.uuid"] == DIRTY_CSET
    # and status says nothing of a cache set for such a device (it said "its cache set
    # 00000000 is not registered")
    ident = Identity(name="sdx", node="/dev/sdx", devno="8:0", size_bytes=1 << 30, serial=None,
                     wwn=None, by_id=(), by_path=None, model=None)
    u = UnregisteredBcache(identity=ident, kind="backing", uuid=fields["dev.uuid"],
                           cset_uuid=fields.get("cset.uuid"),
                           sb_state=fields["dev.data.cache_state"],
                           sb_mode=fields["dev.data.cache_mode"])
    real = snapshot.take

    def take(sysfs: Sysfs, **kw: object) -> Snapshot:
        return dataclasses.replace(real(sysfs, **kw), unregistered=(u,))  # type: ignore[arg-type]

    monkeypatch.setattr(snapshot, "take", take)
    rc, out, err = cli(FIXTURES / "bcache-unattached-uml" / "sys", ["status"])
    assert rc == 0, err
    assert "unregistered bcache backing /dev/sdx: superblock detached" in out
    assert leaks(out + err) == []


def test_what_a_resumed_drain_put_back_is_said_as_settings() -> None:
    snap = snapshot.take(Sysfs(str(FIXTURES / "bcache-writeback-dirty-uml" / "sys")))
    k = kinds.of(snap.backings[0])
    assert k is not None
    said = k.restored_note({"writeback_percent": 10, "writeback_delay": 30})
    assert said == ("/dev/bcache0: restored tunables writeback_percent=10, "
                    "writeback_delay=30")  # it was a Python dict: {'writeback_percent': 10}
    from cachemgr.procedures.kinds.base import Drained

    d = Drained("/dev/mapper/vc", 4096, 1.0, {"policy": "smq", "mode": None})
    assert "None" not in d.summary() and "policy smq" in d.summary()


def test_a_rounded_size_is_said_as_its_range() -> None:
    assert size_words(Size.exact(512)) == "512 B"
    rate = Size.parse_hprint("0.5k")  # bch_hprint: [512, 614] bytes
    said = size_words(rate, "/s")
    assert said == "512 B/s to 614 B/s, as bcache rounds it"
    assert not LEAK.search(said)
