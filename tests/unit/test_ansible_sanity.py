"""The Ansible collection through the tools its users and Galaxy run (issue #19 item 1):
``ansible-test sanity`` (every test it has for a collection, all offline once their
virtualenvs exist), ``ansible-test units`` (the unit tests inside the
collection) and ``ansible-lint`` (profile production, the collection and the lab
playbooks). Each test fails, never skips, when its tool is missing: the test extra
(pyproject.toml) installs ansible-core and ansible-lint.

ansible-test wants the collection at ``.../ansible_collections/NS/NAME`` outside a git work
tree; it is copied to such a tree under the temporary directory. HOME points to the directory
where ansible-test keeps the virtualenv it builds for each sanity test (~/.ansible/test), so a
run costs seconds once they are built: /var/cache/cachemgr/ansible-test beside the lab's
kernels when it can be written there (root, as scripts/test.sh runs), which outlives the
checkout (a fresh clone in CI paid ~300 s to build them), else a directory of this
virtualenv. ansible-test puts pip into each
of them with a get-pip script it downloads from a host this machine cannot reach;
ansible/tests/get_pip_offline.py is put where ansible-test looks for that script first. The
units run in this virtualenv (pytest and xdist are here).
Measured (2 CPUs, idle): sanity 5 s, units 10 s, lint 2-5 s with the virtualenvs there; about
70 s more the first time (pip fetches the pinned tools).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# scripts/test.sh bounds a unit test at 300 s for hung Textual pilots; ansible-test's first
# run on a machine builds its virtualenvs with pip (~300 s on a fresh CI host, 767 s beside
# six other jobs here, 2026-11-28): a slow build, not a hang
pytestmark = pytest.mark.timeout(1500)

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = ROOT / "ansible" / "ansible_collections" / "cachemgr" / "cachemgr"
BIN = Path(sys.executable).parent


def _home() -> Path:
    """Where ansible-test's virtualenvs are kept (see the module's docstring). They are named
    by ansible-test after the hash of their pip commands and the Python version
    (``venv/sanity.NAME/3.11/HASH``, _internal/commands/sanity/__init__.py
    create_sanity_virtualenv), and link to the system's Python, not to this checkout or its
    .venv: one set serves every checkout on the machine (a new ansible-core's pins make new
    ones beside the old)."""
    shared = Path("/var/cache/cachemgr/ansible-test")  # made by locked() below
    if os.access(shared if shared.exists() else shared.parent, os.W_OK):
        return shared
    return Path(sys.prefix) / "ansible-test-home"


HOME = _home()
# outside any git work tree: in one, ansible-test lists the files git tracks there (none of a
# copy under the ignored .venv/) and tests nothing
TREES = Path(tempfile.gettempdir()) / (
    "cachemgr-ansible-test-" + hashlib.sha256(str(ROOT).encode()).hexdigest()[:8])


def tool(name: str) -> str:
    path = BIN / name
    assert path.is_file(), f"{name} is missing: scripts/setup.sh installs it (pyproject 'test')"
    return str(path)


def pip_version() -> str:
    """The pip release ansible-test bootstraps into its virtualenvs (the name of its cached
    get-pip script carries it)."""
    reqs = importlib.import_module("ansible_test._internal.python_requirements")

    class Python:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return str(reqs.get_venv_packages(Python())["pip"])


def env() -> dict[str, str]:
    real_home = os.path.expanduser("~")
    return {**os.environ, "HOME": str(HOME),
            # pip's configuration (its indexes) stays the user's
            "XDG_CONFIG_HOME": os.environ.get("XDG_CONFIG_HOME", f"{real_home}/.config"),
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "ansible"), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCAL_TEMP": str(HOME / "tmp"), "NO_COLOR": "1"}


@pytest.fixture()
def locked() -> Iterator[None]:
    """One ansible-test at a time on these trees and caches (other pytest runs on the same
    checkout or, with the shared HOME, on another; xdist workers)."""
    HOME.mkdir(exist_ok=True)
    with open(HOME / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = HOME / ".ansible" / "test" / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        seed = cache / f"get_pip_{pip_version().replace('.', '_')}.py"
        shutil.copyfile(ROOT / "ansible" / "tests" / "get_pip_offline.py", seed)
        yield


def tree(name: str, source: Path = COLLECTION) -> Path:
    """The collection copied to <TREES>/<name>/ansible_collections/cachemgr/cachemgr, fresh
    but for the output directory ansible-test keeps in it."""
    dest = TREES / name / "ansible_collections" / "cachemgr" / "cachemgr"
    if dest.exists():
        for p in dest.iterdir():
            if p.name != "tests":
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        for p in (dest / "tests").iterdir():
            if p.name != "output":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, dest, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "output"))
    return dest


def ansible_test(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    return subprocess.run([tool("ansible-test"), *args, "--python", py, "--color", "no"],
                          cwd=where, env=env(), capture_output=True, text=True, timeout=1200)


def errors(r: subprocess.CompletedProcess[str]) -> str:
    return "\n".join(x for x in (r.stdout + r.stderr).splitlines()
                     if x.startswith(("ERROR", "FATAL"))) or r.stdout[-3000:] + r.stderr[-3000:]


def test_ansible_test_sanity_passes(locked: None) -> None:
    """All 24 sanity tests ansible-core 2.19 has for a collection (those with nothing to look
    at, as pslint and shellcheck here, pass empty)."""
    r = ansible_test(tree("sanity"), "sanity")
    assert r.returncode == 0, errors(r)
    assert 'Running sanity test "validate-modules"' in r.stdout + r.stderr
    assert 'Running sanity test "pylint"' in r.stdout + r.stderr


def test_ansible_test_sanity_finds_a_module_whose_docs_and_spec_differ(locked: None,
                                                                       tmp_path: Path) -> None:
    """The check above can fail: an option the module takes but does not document."""
    src = tmp_path / "cachemgr"
    shutil.copytree(COLLECTION, src, ignore=shutil.ignore_patterns("__pycache__", "output"))
    mod = src / "plugins" / "modules" / "cachemgr_drain.py"
    text = mod.read_text()
    assert 'timeout={"type": "int", "default": 86400})' in text
    mod.write_text(text.replace('timeout={"type": "int", "default": 86400})',
                                'timeout={"type": "int", "default": 86400}, undocumented={})'))
    r = ansible_test(tree("sanity-broken", src), "sanity", "--test", "validate-modules")
    assert r.returncode != 0
    assert "cachemgr_drain.py" in r.stdout + r.stderr and "undocumented" in r.stdout + r.stderr


def test_ansible_test_units_pass(locked: None) -> None:
    # in this virtualenv (it has pytest and xdist); one worker: two per CPU cost more to
    # start than the 22 tests take (7.6 s instead of 18 s wall, measured under load)
    r = ansible_test(tree("units"), "units", "--num-workers", "1")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert r.stdout.count(" passed") >= 2  # module_utils and modules


def lint(*paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("ansible-lint"), "-c", str(ROOT / "ansible" / ".ansible-lint"),
                           "--nocolor", *paths], cwd=ROOT / "ansible", env=env(),
                          capture_output=True, text=True, timeout=600)


def test_ansible_lint_passes(locked: None) -> None:
    r = lint(".")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "Profile 'production' was required, and it passed" in r.stdout + r.stderr


def test_ansible_lint_finds_an_unnamed_task(locked: None, tmp_path: Path) -> None:
    """The check above can fail (and reads the playbooks it is given)."""
    bad = tmp_path / "probe.yml"
    good = (ROOT / "ansible" / "tests" / "mode.yml").read_text()
    bad.write_text(good.replace("    - name: Show the devices\n      ansible.builtin.debug:",
                                "    - ansible.builtin.debug:"))
    assert bad.read_text() != good
    r = lint(str(bad))
    assert r.returncode != 0
    assert "name[missing]" in r.stdout + r.stderr
