"""The qemu lab's machine monitor, from inside the guest: pull and insert drives like a hand.

A qemu lab started with ``monitor=True`` (``cachemgr lab run --backend qemu --monitor``,
marker ``kernel(monitor=True)``) connects its own QMP monitor to a virtio-serial port the
guest sees as ``/dev/vportNpM`` named :data:`PORT_NAME` (cachemgr/lab/qemu.py). Through it a
test does what an operator's hand does to a drive bay, which the guest kernel cannot do by
itself: ``device_del`` takes an NVMe controller out of its PCIe slot (qemu asks the guest's
hotplug driver to eject it; the guest sees it go), ``device_add`` puts a drive, a new one or
the same one, into that slot (the guest's hotplug driver probes it). A PCI ``remove`` and
``rescan`` from the guest only detach and re-find the drive that stays in the slot
(docs/kernel-notes.md, "SCSI and NVMe hotplug").

The monitor gives the guest the whole of its own qemu: it is for the lab, whose guest runs
the project's own code as root with the project directory writable anyway.

``python -m cachemgr.lab.qmp COMMAND [JSON-ARGUMENTS]`` runs one QMP command from a shell in
the guest and prints its JSON answer.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from cachemgr.core.errors import CacheMgrError, TimeoutExpired, UsageError
from cachemgr.core.sysfs import Sysfs

PORT_NAME = "org.cachemgr.qmp"
# qemu.py's names: controller i is "nvmec<i>" on root port "rp<i>", its namespace "nvme<i>"
CONTROLLER_ID = "nvmec{}"
ROOT_PORT_ID = "rp{}"


class QmpError(CacheMgrError):
    """qemu answered a command with an error."""


def port(sysfs: Sysfs | None = None, timeout: float = 10.0) -> str:
    """The guest's device node of the monitor port (virtio_console loaded if needed)."""
    sysfs = sysfs or Sysfs()
    if not sysfs.is_dir("class/virtio-ports"):
        subprocess.run(["modprobe", "virtio_console"], check=False, capture_output=True)
    deadline = time.monotonic() + timeout
    while True:
        for name in sysfs.listdir("class/virtio-ports") if sysfs.is_dir(
                "class/virtio-ports") else []:
            if (sysfs.read_opt(f"class/virtio-ports/{name}/name") or "").strip() == PORT_NAME:
                return f"/dev/{name}"
        if time.monotonic() > deadline:
            raise UsageError(f"no qemu monitor port ({PORT_NAME}) in this guest",
                             hint="start the lab with --backend qemu --monitor "
                                  "(marker kernel(monitor=True))")
        time.sleep(0.2)


class Qmp:
    """One QMP session over the port: :meth:`execute` commands, :meth:`wait_event` for the
    events qemu sends (DEVICE_DELETED, ...). Events that arrive while a command waits for its
    answer are kept for :meth:`wait_event`."""

    def __init__(self, node: str | None = None) -> None:
        self.fd = os.open(node or port(), os.O_RDWR | os.O_NOCTTY)
        self._buf = b""
        self.events: list[dict[str, Any]] = []
        # a session left open by an earlier user of the port may still be in command mode;
        # a new greeting comes only on a new connection, so ask for the capabilities and
        # accept "already in command mode" as well
        self._drain_pending()
        ans = self._command("qmp_capabilities", {})
        if "error" in ans and "CommandNotFound" not in ans["error"].get("class", ""):
            raise QmpError(f"qmp_capabilities: {ans['error'].get('desc')}")

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Qmp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drain_pending(self) -> None:
        """Read what is already there (qemu's greeting): greetings are not answers."""
        while select.select([self.fd], [], [], 0.5)[0]:
            self._buf += os.read(self.fd, 65536)
        lines = self._buf.split(b"\n")
        self._buf = lines.pop()
        for line in lines:
            if line.strip():
                msg = json.loads(line)
                if "event" in msg:
                    self.events.append(msg)

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutExpired(f"qemu's monitor said nothing for {timeout:g} s")
            if select.select([self.fd], [], [], min(left, 1.0))[0]:
                self._buf += os.read(self.fd, 65536)
        line, _, self._buf = self._buf.partition(b"\n")
        msg = json.loads(line) if line.strip() else {}
        return msg if isinstance(msg, dict) else {}

    def _command(self, name: str, args: dict[str, Any], timeout: float = 30.0
                 ) -> dict[str, Any]:
        os.write(self.fd, json.dumps({"execute": name, "arguments": args}).encode() + b"\n")
        while True:
            msg = self._read(timeout)
            if "event" in msg:
                self.events.append(msg)
            elif "return" in msg or "error" in msg:
                return msg

    def execute(self, name: str, **args: Any) -> Any:
        """Run QMP command ``name``; its ``return`` value, QmpError for an error answer."""
        ans = self._command(name, args)
        if "error" in ans:
            raise QmpError(f"qemu refused {name}: {ans['error'].get('desc')}")
        return ans["return"]

    def wait_event(self, name: str, pred: Callable[[dict[str, Any]], bool] = lambda d: True,
                   timeout: float = 60.0) -> dict[str, Any]:
        """The first event ``name`` whose data satisfies ``pred`` (kept ones first)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self.events):
                if ev.get("event") == name and pred(ev.get("data") or {}):
                    return self.events.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutExpired(f"no {name} event from qemu within {timeout:g} s")
            try:
                msg = self._read(left)
            except TimeoutExpired:
                continue
            if "event" in msg:
                self.events.append(msg)

    # ------------------------------------------------------------------ drive bay actions

    def pull(self, device_id: str, timeout: float = 60.0) -> None:
        """Take device ``device_id`` (an NVMe controller: ``nvmec0``) out of its slot and
        wait until qemu says it is gone (the guest's hotplug driver ejected it)."""
        self.execute("device_del", id=device_id)
        self.wait_event("DEVICE_DELETED", lambda d: d.get("device") == device_id, timeout)

    def insert_nvme(self, *, slot: str, device_id: str, image: str, serial: str,
                    node_name: str | None = None) -> None:
        """Put an NVMe drive into PCIe slot (root port) ``slot``: controller ``device_id``
        with serial ``serial`` and one namespace backed by the host file ``image`` (a path
        the host sees: the lab's run directory is shared at the same path;
        core.make_image makes one)."""
        node = node_name or f"{device_id}-drive"
        self.execute("blockdev-add", **{
            "node-name": node, "driver": "raw",
            "file": {"driver": "file", "filename": image}})
        self.execute("device_add", driver="nvme", id=device_id, bus=slot, serial=serial,
                     drive=node)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or len(args) > 2:
        print("usage: python -m cachemgr.lab.qmp COMMAND [JSON-ARGUMENTS]", file=sys.stderr)
        return 2
    try:
        params = json.loads(args[1]) if len(args) == 2 else {}
        if not isinstance(params, dict):
            raise UsageError("the arguments must be a JSON object")
        with Qmp() as q:
            print(json.dumps(q.execute(args[0], **params), indent=2))
    except json.JSONDecodeError as exc:
        print(f"qmp: the arguments are not JSON: {exc}", file=sys.stderr)
        return 2
    except CacheMgrError as exc:
        print(f"qmp: {exc.message}", file=sys.stderr)
        return int(exc.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
