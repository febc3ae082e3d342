"""The Ansible collection as its users see it (issue #19 item 1): ansible-doc renders every
module's documentation, the options it documents are the ones the module takes, and the
collection declares the ansible-core it needs (meta/runtime.yml)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = ROOT / "ansible" / "ansible_collections" / "cachemgr" / "cachemgr"
MODULES = sorted(p.stem for p in (COLLECTION / "plugins" / "modules").glob("cachemgr_*.py"))


def _doc(module: str) -> dict[str, object]:
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "ansible"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": "/tmp/ansible-local"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "--json",
                        f"cachemgr.cachemgr.{module}"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[f"cachemgr.cachemgr.{module}"]["doc"]  # type: ignore[no-any-return]


def test_there_are_modules() -> None:
    assert {"cachemgr_drain", "cachemgr_facts", "cachemgr_mode",
            "cachemgr_replace_ssd"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_renders_each_module(module: str) -> None:
    doc = _doc(module)
    assert doc["description"], module
    opts = doc["options"]
    assert isinstance(opts, dict) and "cachemgr_bin" in opts
    for name, o in opts.items():
        assert o.get("description") and o.get("type"), (module, name, o)
    # the documented options are the ones the module's argument_spec takes
    src = (COLLECTION / "plugins" / "modules" / f"{module}.py").read_text()
    for name in opts:
        if name != "cachemgr_bin":
            assert f"{name}=" in src or f'"{name}"' in src, (module, name)


def test_runtime_names_the_ansible_core_it_needs() -> None:
    text = (COLLECTION / "meta" / "runtime.yml").read_text()
    assert "requires_ansible:" in text
