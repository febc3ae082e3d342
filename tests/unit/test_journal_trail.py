"""The journal trail (issue #33 item 4, docs/admin-guide.md, "The journal trail"): every
change through the gate is written to the system journal (native protocol, a fake journal
socket here: CACHEMGR_JOURNAL_SOCKET) with its fields; a refusal too, at a lower priority; a
read-only command writes nothing; a value with a newline or a "=" stays one field's value.
On a copied capture (bcache-writeback-dirty-uml: bcache0 writeback on cache set fb5bd09d)."""

from __future__ import annotations

import array
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachemgr.backends import journal
from cachemgr.core.change import Change
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import gate, trail
from cachemgr.ops.control import Result
from tests.unit.guards import held_elsewhere
from tests.unit.test_parity import cli, lock_key
from tests.unit.tui_helpers import copy_capture, kernel_writes

Entry = dict[str, str]


def parse(data: bytes) -> list[tuple[str, str]]:
    """An entry's fields as journald reads them: a line with "=" is NAME=value (split at its
    first "="), a line without is a name followed by the 64-bit length and the bytes."""
    out, i = [], 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            i = nl + 1
        else:
            k = line
            (n,) = struct.unpack("<Q", data[nl + 1:nl + 9])
            v = data[nl + 9:nl + 9 + n]
            assert data[nl + 9 + n:nl + 10 + n] == b"\n"
            i = nl + 10 + n
        out.append((k.decode(), v.decode()))
    return out


class FakeJournal:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)

    def raw(self) -> list[list[tuple[str, str]]]:
        out = []
        while True:
            try:
                data, anc, _, _ = self.sock.recvmsg(1 << 20, socket.CMSG_SPACE(4))
            except BlockingIOError:
                return out
            for level, kind, fds in anc:  # a big entry: in a memfd
                assert (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS) and not data
                fd = array.array("i", fds[:4])[0]
                with os.fdopen(fd, "rb") as f:
                    f.seek(0)  # journald maps it whole; the sender's offset is at its end
                    data = f.read()
            out.append(parse(data))

    def entries(self) -> list[Entry]:
        out = []
        for fields in self.raw():
            names = [k for k, _ in fields]
            assert len(names) == len(set(names)), fields  # no field twice: none forged
            out.append(dict(fields))
        return out


@pytest.fixture
def jr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeJournal]:
    path = tmp_path / "journal.sock"
    monkeypatch.setenv("CACHEMGR_JOURNAL_SOCKET", str(path))
    j = FakeJournal(path)
    yield j
    j.sock.close()


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(d))
    monkeypatch.setenv("SUDO_USER", "alice")
    return d


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    kernel_writes(monkeypatch)
    return copy_capture(tmp_path, "bcache-writeback-dirty")


def test_a_mode_change_is_written_with_its_fields(root: Path, jr: FakeJournal) -> None:
    rc, _, err = cli(root, ["mode", "/dev/bcache0", "writethrough"])
    assert rc == 0, err
    (e,) = jr.entries()
    assert e["SYSLOG_IDENTIFIER"] == "cachemgr" and e["PRIORITY"] == str(journal.NOTICE)
    assert e["CACHEMGR_COMMAND"] == "mode" and e["CACHEMGR_TARGET"] == "/dev/bcache0"
    assert e["CACHEMGR_ATTRIBUTE"] == "cache_mode"
    assert (e["CACHEMGR_FROM"], e["CACHEMGR_TO"]) == ("writeback", "writethrough")
    assert e["CACHEMGR_USER"] == "alice" and e["CACHEMGR_EXIT"] == "0"
    assert e["CACHEMGR_OUTCOME"] == "changed" and "CACHEMGR_RUN" not in e
    assert e["MESSAGE"] == ("mode: /dev/bcache0 cache_mode writeback -> writethrough "
                            "(by alice, exit 0)")


def test_tune_writes_each_change_and_not_what_was_already_so(root: Path,
                                                             jr: FakeJournal) -> None:
    rc, _, err = cli(root, ["tune", "/dev/bcache0", "sequential_cutoff=0",
                            "writeback_percent=10"])
    assert rc == 0, err
    (e,) = jr.entries()  # writeback_percent was already 10
    assert e["CACHEMGR_COMMAND"] == "tune" and e["CACHEMGR_ATTRIBUTE"] == "sequential_cutoff"
    rc, _, _ = cli(root, ["tune", "/dev/bcache0", "sequential_cutoff=0"])
    assert rc == 4 and jr.entries() == []  # already so: nothing changed, nothing written


def test_a_refusal_is_written_at_a_lower_priority(root: Path, jr: FakeJournal) -> None:
    rc, _, _ = cli(root, ["force-run", "/dev/bcache0"])  # before the gate: no data-loss word
    assert rc == 3
    (e,) = jr.entries()
    assert e["PRIORITY"] == str(journal.INFO) and e["CACHEMGR_OUTCOME"] == "refused"
    assert e["CACHEMGR_COMMAND"] == "force-run" and e["CACHEMGR_TARGET"] == "/dev/bcache0"
    assert e["CACHEMGR_EXIT"] == "3" and "corrupt" in e["CACHEMGR_REASON"]
    assert e["CACHEMGR_USER"] == "alice" and "CACHEMGR_FROM" not in e


def test_a_refusal_by_the_gate_names_what_holds_it(root: Path, jr: FakeJournal,
                                                   state_dir: Path) -> None:
    with held_elsewhere(lock_key(root, "/dev/bcache0"), state_dir, '{"procedure": "drain"}'):
        rc, _, _ = cli(root, ["mode", "/dev/bcache0", "writethrough"])
    assert rc == 3
    (e,) = jr.entries()
    assert e["CACHEMGR_OUTCOME"] == "refused" and e["CACHEMGR_ACTION"] == "mode"
    assert e["CACHEMGR_TARGET"] == "/dev/bcache0" and "held by" in e["CACHEMGR_REASON"]


@pytest.mark.parametrize("argv", [["status"], ["status", "--json"], ["check"],
                                  ["scheduler"], ["mode", "/dev/cachemgr-no-such", "none"],
                                  ["mode", "/dev/bcache0", "writeback"]])
def test_read_only_usage_errors_and_already_so_write_nothing(root: Path, jr: FakeJournal,
                                                             argv: list[str]) -> None:
    cli(root, argv)
    assert jr.entries() == []


def test_a_change_from_the_command_layer_alone_is_written(root: Path,
                                                          jr: FakeJournal) -> None:
    """The TUI runs ops functions (in a worker thread): the gate writes the trail."""
    res = cache_ops.mode(cache_ops.Sysfs(str(root)), "/dev/bcache0", "writearound")
    assert res.exit_code == 0
    (e,) = jr.entries()
    assert e["CACHEMGR_COMMAND"] == "mode" and e["CACHEMGR_TO"] == "writearound"
    assert (e["CACHEMGR_FROM"], e["CACHEMGR_EXIT"]) == ("writeback", "0")


def test_a_tune_from_the_command_layer_alone_names_old_and_new(root: Path,
                                                                jr: FakeJournal) -> None:
    """The TUI's tune: no command frame, so the gate's own; its entry names the setting's
    old and new value (it was "tune on /dev/bcache0: done", without them)."""
    res = cache_ops.tune(cache_ops.Sysfs(str(root)), "/dev/bcache0", ["sequential_cutoff=0"])
    assert res.exit_code == 0 and res.changes
    (e,) = jr.entries()
    assert e["CACHEMGR_COMMAND"] == "tune" and e["CACHEMGR_OUTCOME"] == "changed"
    assert e["CACHEMGR_ATTRIBUTE"] == "sequential_cutoff"
    assert e["CACHEMGR_FROM"] == res.changes[0].before and e["CACHEMGR_TO"] == "0"
    assert e["CACHEMGR_FROM"] not in ("", "0")


def test_no_journal_fails_nothing(root: Path, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMGR_JOURNAL_SOCKET", str(tmp_path / "nobody-listens"))
    assert journal.send([("MESSAGE", "x")]) is False
    rc, out, err = cli(root, ["mode", "/dev/bcache0", "writethrough"])
    assert rc == 0 and "writeback -> writethrough" in out, err


FORGED = "/dev/evil\nCACHEMGR_USER=mallory\nPRIORITY=0"


def test_a_newline_or_equals_in_a_value_forges_no_field(jr: FakeJournal) -> None:
    assert journal.send([("MESSAGE", "a=b"), ("CACHEMGR_TARGET", FORGED)])
    (fields,) = jr.raw()
    assert fields == [("MESSAGE", "a=b"), ("CACHEMGR_TARGET", FORGED)]
    with pytest.raises(ValueError):
        journal.encode([("PRIORITY\nX", "0")])


def test_a_device_name_with_a_newline_through_the_gate(jr: FakeJournal,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # the gate takes no lock then
    with gate.gate(gate.of_names(FORGED, ["vm-x"]), "vm-cache", run="r=1\nx"):
        Result(changes=[Change(FORGED, "cache", "none", "a=b\nPRIORITY=0")])
    started, e = jr.entries()  # a run ID: its start is written too
    assert started["CACHEMGR_OUTCOME"] == "started" and started["CACHEMGR_TARGET"] == FORGED
    assert "\n" not in started["MESSAGE"] and started["CACHEMGR_RUN"] == "r=1\nx"
    assert e["CACHEMGR_TARGET"] == FORGED and e["CACHEMGR_USER"] == "alice"
    assert e["CACHEMGR_TO"] == "a=b\nPRIORITY=0" and e["PRIORITY"] == str(journal.NOTICE)
    assert e["CACHEMGR_RUN"] == "r=1\nx"
    assert "\n" not in e["MESSAGE"] and "\\x0a" in e["MESSAGE"]


def test_a_long_action_leaves_its_start_before_it_ends(jr: FakeJournal,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain killed outright (SIGKILL, power cut) writes no end: its start is in the
    journal from the moment the gate let it in. A short change writes only its end."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with gate.gate(gate.of_names("/dev/bcache9", ["disk-9"]), "drain"):
        (e,) = jr.entries()
        assert e["CACHEMGR_OUTCOME"] == "started" and e["CACHEMGR_ACTION"] == "drain"
        assert e["CACHEMGR_TARGET"] == "/dev/bcache9" and e["PRIORITY"] == str(journal.INFO)
        assert e["MESSAGE"] == "drain on /dev/bcache9 started (by alice)"
    assert [x["CACHEMGR_OUTCOME"] for x in jr.entries()] == ["done"]  # read: gone
    with gate.gate(gate.of_names("/dev/x", ["disk-x"]), "scheduler"):
        assert jr.entries() == []
    assert [x["CACHEMGR_OUTCOME"] for x in jr.entries()] == ["done"]


def test_a_big_entry_goes_in_a_memfd(jr: FakeJournal) -> None:
    big = "x" * (1 << 19)  # past a datagram's size limit
    assert journal.send([("MESSAGE", "big"), ("CACHEMGR_REASON", big)])
    (fields,) = jr.raw()
    assert fields == [("MESSAGE", "big"), ("CACHEMGR_REASON", big)]


def test_a_failure_inside_the_gate_is_written(jr: FakeJournal) -> None:
    with pytest.raises(trail.CacheMgrError), gate.gate(gate.of_names("/dev/x", ["disk-x"]),
                                                       "scheduler"):
        raise trail.CacheMgrError("write failed")
    (e,) = jr.entries()
    assert e["CACHEMGR_OUTCOME"] == "failed" and e["PRIORITY"] == str(journal.WARNING)
    assert e["CACHEMGR_EXIT"] == "1" and e["CACHEMGR_REASON"] == "write failed"
