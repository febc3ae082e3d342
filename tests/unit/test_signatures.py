"""The one wipefs wrapper: its reading of wipefs' output (wipefs(8): one TYPE per line)."""

from __future__ import annotations

import pytest

from cachemgr.backends import signatures
from cachemgr.core import runner


def fake_run(monkeypatch: pytest.MonkeyPatch, rc: int, out: str) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(argv: list[str], **kw: object) -> runner.Completed:
        calls.append(list(argv))
        return runner.Completed(tuple(argv), rc, out, "")

    monkeypatch.setattr(runner, "run", run)
    return calls


@pytest.mark.parametrize("rc, out, found", [
    (0, "", []),
    (0, "ext4\n", ["ext4"]),
    (0, "gpt\nPMBR\n", ["gpt", "PMBR"]),
    (0, "  bcache  \n\n", ["bcache"]),
    (1, "ext4\n", []),  # a failed probe finds nothing; the format after it fails loudly
])
def test_found_and_first(monkeypatch: pytest.MonkeyPatch, rc: int, out: str,
                         found: list[str]) -> None:
    calls = fake_run(monkeypatch, rc, out)
    assert signatures.found("/dev/sdx") == found
    assert signatures.first("/dev/sdx") == (found[0] if found else None)
    assert calls[0] == ["wipefs", "--no-act", "--noheadings", "--output", "TYPE", "/dev/sdx"]


def test_wipe_is_wipefs_a(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_run(monkeypatch, 0, "")
    signatures.wipe("/dev/sdx")
    assert calls == [["wipefs", "-a", "/dev/sdx"]]
