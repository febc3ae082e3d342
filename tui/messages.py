"""Typed messages: what workers report back to the UI thread (all IO runs in workers)."""

from __future__ import annotations

from collections.abc import Sequence

from textual.message import Message

from cachemgr.core.model import Snapshot
from cachemgr.ops.health import Finding
from tui.view import Row


class SnapshotReady(Message):
    """A poll finished: the snapshot and the block layer's IO counters, read together, and
    the health model's findings of that snapshot (worst first)."""

    def __init__(self, snap: Snapshot, ios: dict[str, int], t: float,
                 findings: Sequence[Finding] = (), rows: list[Row] | None = None,
                 wb: dict[str, float | None] | None = None,
                 left: Sequence[tuple[str, str | None, str]] = (),
                 causes: Sequence[Finding] | None = None) -> None:
        super().__init__()
        self.snap = snap
        self.ios = ios
        self.t = t
        self.findings = list(findings)
        self.rows = rows  # view.rows(snap, findings), made once in the poll worker
        # each backing device's measured write-back bytes per second since the last poll
        self.wb = wb or {}
        # the caches marked as holding copies of a disk a VM took elsewhere (ops.coherence
        # left_marks: device, VM, words with the next command)
        self.left = list(left)
        # why a cache does not help (ops.doctor.Watch over the polls); None: not looked at
        self.causes = None if causes is None else list(causes)


class OpProgress(Message):
    """Progress of a running operation; bursts merge (only the newest line matters)."""

    def __init__(self, op_id: int, line: str, fraction: float | None = None,
                 eta_s: float | None = None) -> None:
        super().__init__()
        self.op_id = op_id
        self.line = line
        self.fraction = fraction
        self.eta_s = eta_s

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, OpProgress) and message.op_id == self.op_id


class OpSaid(Message):
    """A line an operation says (replace-ssd's steps, bench's runs): every one is kept."""

    def __init__(self, op_id: int, line: str) -> None:
        super().__init__()
        self.op_id = op_id
        self.line = line


class OpFinished(Message):
    """An operation ended (done, already so, refused, failed or cancelled)."""

    def __init__(self, op_id: int, title: str, ok: bool, lines: list[str],
                 result: object = None) -> None:
        super().__init__()
        self.op_id = op_id
        self.title = title
        self.ok = ok
        self.lines = lines
        self.result = result
