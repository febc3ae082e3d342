from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.labplugin"]


@pytest.fixture(autouse=True)
def _dmcache_records(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
                     ) -> None:
    """On the host, dm-cache records (backends/dmcache/record.py) go to a directory of the
    test's own, never /etc/cachemgr/dmcache; in the lab the guest's /etc is a tmpfs."""
    if os.environ.get("CACHEMGR_IN_LAB") != "1":
        d: Path = tmp_path_factory.mktemp("dmcache-records")
        monkeypatch.setenv("CACHEMGR_DMCACHE_DIR", str(d / "dmcache"))


@pytest.fixture(autouse=True)
def _no_host_journal(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
                     ) -> None:
    """On the host, the journal trail (cachemgr/ops/trail.py) goes to a socket nobody
    listens on, never to the host's journal; in the lab it is the guest's own."""
    if os.environ.get("CACHEMGR_IN_LAB") != "1":
        d: Path = tmp_path_factory.mktemp("journal")
        monkeypatch.setenv("CACHEMGR_JOURNAL_SOCKET", str(d / "no-journal"))
