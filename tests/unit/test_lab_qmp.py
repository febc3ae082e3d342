"""The guest-side QMP client of the qemu lab (cachemgr/lab/qmp.py) against a scripted peer on
a pseudo-terminal in raw mode (the guest's virtio-serial port is a character device too).
The real monitor is exercised by the qemu kernel test that swaps a drive in its slot."""

from __future__ import annotations

import json
import os
import pty
import select
import threading
import tty
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cachemgr.core.errors import TimeoutExpired
from cachemgr.lab import qmp

Reply = Callable[[dict[str, Any]], list[dict[str, Any]]]


class FakeQemu:
    """Answers each command line with what ``reply`` returns (answers and events, in order),
    after a greeting; records the commands."""

    def __init__(self, reply: Reply) -> None:
        self.master, slave = pty.openpty()
        tty.setraw(slave)
        self.node = os.ttyname(slave)
        self._slave = slave  # kept open: the pty goes away with its last slave fd
        self.reply = reply
        self.commands: list[dict[str, Any]] = []
        # close() stops the thread through this pipe before it closes the pty: a thread still
        # reading a closed master's fd number would read the next test's pty (the number is
        # reused) and answer its commands with this test's replies (seen in a full run:
        # test_an_error_answer_is_raised got {"return": {}} for its device_add)
        self._stop_r, self._stop_w = os.pipe()
        self._send({"QMP": {"version": {}, "capabilities": []}})
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _send(self, msg: dict[str, Any]) -> None:
        os.write(self.master, json.dumps(msg).encode() + b"\n")

    def _serve(self) -> None:
        buf = b""
        while True:
            ready = select.select([self.master, self._stop_r], [], [])[0]
            if self._stop_r in ready:
                return
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                cmd = json.loads(line)
                self.commands.append(cmd)
                for msg in self.reply(cmd):
                    self._send(msg)

    def close(self) -> None:
        os.write(self._stop_w, b"x")
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the fake monitor's thread did not stop"
        for fd in (self.master, self._slave, self._stop_r, self._stop_w):
            os.close(fd)


@pytest.fixture
def qemu() -> Iterator[Callable[[Reply], FakeQemu]]:
    made: list[FakeQemu] = []

    def make(reply: Reply) -> FakeQemu:
        made.append(FakeQemu(reply))
        return made[-1]

    yield make
    for q in made:
        q.close()


def ok(cmd: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"return": {}}]


def test_capabilities_then_a_command_and_its_answer(qemu: Callable[[Reply], FakeQemu]) -> None:
    def reply(cmd: dict[str, Any]) -> list[dict[str, Any]]:
        if cmd["execute"] == "query-status":
            return [{"return": {"status": "running"}}]
        return [{"return": {}}]

    fake = qemu(reply)
    with qmp.Qmp(fake.node) as q:
        assert q.execute("query-status") == {"status": "running"}
    assert [c["execute"] for c in fake.commands] == ["qmp_capabilities", "query-status"]


def test_an_error_answer_is_raised(qemu: Callable[[Reply], FakeQemu]) -> None:
    def reply(cmd: dict[str, Any]) -> list[dict[str, Any]]:
        if cmd["execute"] == "device_add":
            return [{"error": {"class": "GenericError",
                               "desc": "Bus 'nvmec9' does not support hotplugging"}}]
        return [{"return": {}}]

    with qmp.Qmp(qemu(reply).node) as q, pytest.raises(qmp.QmpError, match="hotplugging"):
        q.execute("device_add", driver="nvme-ns", bus="nvmec9")


def test_pull_waits_for_its_own_device_deleted_event(
        qemu: Callable[[Reply], FakeQemu]) -> None:
    """device_del's answer comes before the device is gone; events for other devices (the
    namespace's anonymous child, another drive) come first and are not the end of it."""

    def reply(cmd: dict[str, Any]) -> list[dict[str, Any]]:
        if cmd["execute"] == "device_del":
            return [{"event": "DEVICE_DELETED", "data": {"path": "/machine/anon/device[1]"}},
                    {"return": {}},
                    {"event": "DEVICE_DELETED", "data": {"device": "other"}},
                    {"event": "DEVICE_DELETED", "data": {"device": cmd["arguments"]["id"]}}]
        return [{"return": {}}]

    with qmp.Qmp(qemu(reply).node) as q:
        q.pull("nvmec0", timeout=10)
        # the others are kept for whoever waits for them
        assert q.wait_event("DEVICE_DELETED", lambda d: d.get("device") == "other",
                            timeout=1)["data"] == {"device": "other"}


def test_pull_times_out_when_the_guest_never_ejects(qemu: Callable[[Reply], FakeQemu]) -> None:
    with qmp.Qmp(qemu(ok).node) as q, pytest.raises(TimeoutExpired, match="DEVICE_DELETED"):
        q.pull("nvmec0", timeout=1.5)


def test_insert_adds_the_image_then_the_controller_in_the_slot(
        qemu: Callable[[Reply], FakeQemu]) -> None:
    fake = qemu(ok)
    with qmp.Qmp(fake.node) as q:
        q.insert_nvme(slot="rp0", device_id="newssd", image="/run/lab/new.img",
                      serial="CMLABNVMENEW")
    add, dev = fake.commands[1:]
    assert add == {"execute": "blockdev-add", "arguments": {
        "node-name": "newssd-drive", "driver": "raw",
        "file": {"driver": "file", "filename": "/run/lab/new.img"}}}
    assert dev == {"execute": "device_add", "arguments": {
        "driver": "nvme", "id": "newssd", "bus": "rp0", "serial": "CMLABNVMENEW",
        "drive": "newssd-drive"}}


def test_command_line_usage_and_bad_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert qmp.main([]) == 2
    assert "usage" in capsys.readouterr().err
    assert qmp.main(["device_del", "{not json"]) == 2
    assert "not JSON" in capsys.readouterr().err
