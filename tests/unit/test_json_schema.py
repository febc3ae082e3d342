"""`status --json` from every captured tree validates against the documented schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from cachemgr.backends import snapshot
from cachemgr.core.sysfs import Sysfs

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs/schema/status.schema.json").read_text())


@pytest.mark.parametrize("fx", sorted((ROOT / "tests/fixtures").glob("*/sys")),
                         ids=lambda p: p.parent.name)
def test_status_json_matches_schema(fx: Path) -> None:
    doc = snapshot.to_json(snapshot.take(Sysfs(fx)))
    jsonschema.validate(doc, SCHEMA)


def test_schema_rejects_a_string_dirty_count() -> None:
    fx = next((ROOT / "tests/fixtures").glob("bcache-writeback-dirty-*/sys"))
    doc = snapshot.to_json(snapshot.take(Sysfs(fx)))
    doc["devices"][0]["dirty_bytes"] = "4.4M"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)
