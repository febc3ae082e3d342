"""`cachemgr --version`, the shell completion scripts (completion/, generated from the
parser by cachemgr/cli/completion.py) and their read-only helper `cachemgr --complete KIND`.
The bash script is run for real: sourced in bash with COMP_WORDS/COMP_CWORD set."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from cachemgr.cli import complete as complete_helper
from cachemgr.cli import completion
from cachemgr.cli.main import main
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from tests.unit.tui_helpers import copy_capture, fx

ROOT = Path(__file__).resolve().parents[2]
BASH = shutil.which("bash")
ZSH = shutil.which("zsh")


def pyproject_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


# ----------------------------------------------------------------------------- --version


def test_version_prints_the_projects_version_and_exits_0(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"cachemgr {pyproject_version()}\n"


def test_version_in_a_process() -> None:
    r = subprocess.run([sys.executable, "-m", "cachemgr", "--version"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, check=False)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"cachemgr {pyproject_version()}\n", "")


# ----------------------------------------------------------------------------- the scripts


def test_completion_scripts_are_current() -> None:
    for name, text in completion.render_all().items():
        assert (ROOT / "completion" / name).read_text() == text, \
            f"completion/{name} is stale: .venv/bin/python -m cachemgr.cli.completion completion/"


def test_the_parser_tree_reaches_every_command() -> None:
    nodes = {n.path: n for n in completion.nodes(
        __import__("cachemgr.cli.main", fromlist=["build_parser"]).build_parser())}
    assert {"status", "lab", "bench", "replace-ssd"} <= set(nodes[()].subs)
    assert "--version" in nodes[()].options
    assert "--sysfs-root" not in nodes[()].options and "--complete" not in nodes[()].options
    assert nodes[("lab", "run")].options["--backend"][1] == completion.Arg(choices=("uml", "qemu"))
    assert nodes[("mode",)].positionals[0].kind == "targets"
    assert nodes[("create",)].options["--cache"][1] == completion.Arg(kind="free")
    assert nodes[("register",)].positionals[0].kind == "disks"
    assert nodes[("register",)].positionals[0].repeats
    # protect --clear DEV: the SSD a pass protected, a disk (issue #41)
    assert nodes[("protect",)].options["--clear"][1] == completion.Arg(kind="disks")


# ----------------------------------------------------------------------------- the helper


def complete(kind: str, root: Path) -> list[str]:
    return complete_helper.candidates(kind, Sysfs(root))


def test_targets_and_backings_of_lvm_caches() -> None:
    root = fx("lvm-caches")
    targets = complete("targets", root)
    assert {"/dev/mapper/vg0-vm1", "vg0/vm1", "vg0/vm2", "vg0/vm3"} <= set(targets)
    snap = cache_ops.status(Sysfs(root))
    assert {d["device"] for d in cache_ops.status_json(snap)["devices"]} <= set(targets)
    assert "vg0/vm1" in complete("backings", root)


def test_caches_are_the_sets_and_their_devices() -> None:
    root = fx("bcache-writeback-dirty")
    doc = cache_ops.status_json(cache_ops.status(Sysfs(root)))
    want = {doc["caches"][0]["uuid"], *doc["caches"][0]["cache_devices"]}
    assert set(complete("caches", root)) == want
    assert set(complete("backings", root)) == {"/dev/bcache0", "/dev/ubda"}


def test_free_disks_leave_out_held_ones() -> None:
    root = fx("lvm-caches")  # ubda, ubdb under LVM; ubdc free
    assert complete("disks", root) == ["/dev/ubda", "/dev/ubdb", "/dev/ubdc"]
    assert complete("free", root) == ["/dev/ubdc"]
    nvme = fx("nvme-pair")
    assert complete("free", nvme) == ["/dev/nvme1n1"]


def test_the_helper_reads_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    asked: list[dict[str, object]] = []
    real = cache_ops.status

    def status(sysfs: Sysfs, **kw: object) -> object:
        asked.append(kw)
        return real(sysfs, **kw)  # type: ignore[arg-type]

    def no_write(self: Sysfs, rel: str, value: str) -> None:
        raise AssertionError(f"wrote {value!r} to {rel}")

    monkeypatch.setattr(cache_ops, "status", status)
    monkeypatch.setattr(Sysfs, "write", no_write)
    root = copy_capture(tmp_path, "bcache-writeback-dirty")
    for kind in complete_helper.KINDS:
        complete(kind, root)
    # never probes devices, never asks libvirt
    assert asked and all(kw["probe_unregistered"] is False and kw["vms"] is False
                         for kw in asked)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cachemgr", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, **(env or {})})


def test_complete_option_in_a_process() -> None:
    r = run_cli("--sysfs-root", str(fx("lvm-caches")), "--complete", "targets")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.splitlines() == complete("targets", fx("lvm-caches"))
    # from $CACHEMGR_SYSFS too, and nothing (no traceback) where there is no sysfs
    r = run_cli("--complete", "caches", env={"CACHEMGR_SYSFS": str(fx("nvme-pair"))})
    assert r.returncode == 0 and "/dev/nvme0n1" in r.stdout.splitlines()
    r = run_cli("--sysfs-root", "/nonexistent", "--complete", "targets")
    assert (r.returncode, r.stdout) == (0, "")


def hostile(tmp_path: Path, name: str) -> Path:
    """dmcache-writeback with its cached device renamed ``name``."""
    root = copy_capture(tmp_path, "dmcache-writeback")
    (root / "block/dm-1/dm/name").write_text(name + "\n")
    for f in root.parent.glob("dmsetup-*.txt"):
        f.write_text(f.read_text().replace("vmcache", name))
    return root


def test_a_name_with_a_control_character_is_not_offered(tmp_path: Path) -> None:
    root = hostile(tmp_path, "vm\x1bcache")
    assert complete("targets", root) == []


# ----------------------------------------------------------------------------- bash


@pytest.fixture
def prog(tmp_path: Path) -> Path:
    """A `cachemgr` that runs this checkout's code (what COMP_WORDS[0] names)."""
    p = tmp_path / "bin" / "cachemgr"
    p.parent.mkdir()
    p.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m cachemgr \"$@\"\n")
    p.chmod(0o755)
    return p


def bash_complete(words: list[str], env: dict[str, str] | None = None,
                  cwd: Path = ROOT) -> list[str]:
    assert BASH
    script = ('source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); _cachemgr; '
              'printf "%s\\0" "${COMPREPLY[@]}"')
    r = subprocess.run([BASH, "--norc", "--noprofile", "-c", script, "bash",
                        str(ROOT / "completion" / "cachemgr.bash"), *words],
                       capture_output=True, text=True, timeout=60, check=False, cwd=cwd,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return [w for w in r.stdout.split("\0") if w]


pytestmark_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")


@pytestmark_bash
def test_bash_completes_commands_and_subcommands() -> None:
    assert bash_complete(["cachemgr", "st"]) == ["status", "stop-set"]
    assert bash_complete(["cachemgr", "lab", ""]) == ["run", "shell", "demo", "setup"]
    assert bash_complete(["cachemgr", "-v", "bench", "r"]) == ["run", "replay"]
    assert "--version" in bash_complete(["cachemgr", "--"])
    assert bash_complete(["cachemgr", "drain", "--st"]) == ["--stall-timeout"]


@pytestmark_bash
def test_bash_completes_choices() -> None:
    assert bash_complete(["cachemgr", "lab", "run", "--backend", ""]) == ["uml", "qemu"]
    assert bash_complete(["cachemgr", "replace-ssd", "--interim-mode", "w"]) == \
        ["writearound", "writethrough"]
    # COMP_WORDBREAKS splits --opt=value into three words
    assert bash_complete(["cachemgr", "replace-ssd", "--interim-mode", "=", "n"]) == ["none"]
    assert bash_complete(["cachemgr", "create", ""]) == ["bcache", "dm-cache"]
    assert bash_complete(["cachemgr", "vm-cache", "dom", "vda", "write"]) == \
        ["writethrough", "writeback"]
    # a value of an option is not taken for a positional
    assert bash_complete(["cachemgr", "bench", "run", "--rw", "read", "--rw", "rand"]) == \
        ["randread", "randwrite", "randrw"]


@pytestmark_bash
def test_bash_completes_devices_from_the_host(prog: Path) -> None:
    lvm = str(fx("lvm-caches"))
    assert bash_complete([str(prog), "--sysfs-root", lvm, "mode", "vg0/"]) == \
        ["vg0/vm1", "vg0/vm2", "vg0/vm3"]
    assert bash_complete([str(prog), "mode", "vg0/vm1", "--timeout", "5", ""]) == []
    nvme = {"CACHEMGR_SYSFS": str(fx("nvme-pair"))}
    uuid = next(w for w in complete("caches", fx("nvme-pair")) if not w.startswith("/"))
    assert bash_complete([str(prog), "stop-set", ""], env=nvme) == \
        ["/dev/nvme0n1", uuid]
    assert bash_complete([str(prog), "create", "bcache", "--cache", "/dev/"], env=nvme) == \
        ["/dev/nvme1n1"]
    assert bash_complete([str(prog), "register", "/dev/vda", "/dev/nv"], env=nvme) == \
        ["/dev/nvme0n1", "/dev/nvme1n1"]


@pytestmark_bash
def test_bash_quotes_a_hostile_device_name_and_never_runs_it(prog: Path,
                                                             tmp_path: Path) -> None:
    name = "x$(touch pwned)`touch pwned2` y"
    root = hostile(tmp_path, name)
    got = bash_complete([str(prog), "--sysfs-root", str(root), "drain", ""], cwd=tmp_path)
    assert got == ["/dev/mapper/x\\$\\(touch\\ pwned\\)\\`touch\\ pwned2\\`\\ y"]
    # the word, read back by the shell, is the device's path
    r = subprocess.run([BASH or "bash", "-c", f"printf %s {got[0]}"], capture_output=True,
                       text=True, timeout=60, check=True, cwd=tmp_path)
    assert r.stdout == f"/dev/mapper/{name}"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


@pytestmark_bash
def test_bash_completes_files_for_paths(tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text("")
    (tmp_path / "outdir").mkdir()
    assert bash_complete(["cachemgr", "autoattach", "--policy", "pol"], cwd=tmp_path) == \
        ["policy.toml"]
    assert bash_complete(["cachemgr", "bench", "run", "--out", "o"], cwd=tmp_path) == \
        ["outdir"]


# ----------------------------------------------------------------------------- zsh


@pytest.mark.skipif(ZSH is None, reason="zsh is not installed (Debian: zsh, in "
                    "scripts/setup.sh's package list)")
def test_zsh_function_parses_and_loads(tmp_path: Path) -> None:
    assert ZSH
    script = ROOT / "completion" / "_cachemgr"
    r = subprocess.run([ZSH, "-n", str(script)], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = subprocess.run(
        [ZSH, "-fc", f"fpath=({script.parent} $fpath); autoload -U compinit; "
                     f"compinit -u -d {tmp_path}/zcompdump; "
                     "autoload -Uz _cachemgr; print -r -- ${_comps[cachemgr]}"],
        capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "_cachemgr", r.stdout + r.stderr


def test_zsh_script_is_generated_from_the_same_tables() -> None:
    zsh = (ROOT / "completion" / "_cachemgr").read_text()
    bash = (ROOT / "completion" / "cachemgr.bash").read_text()
    assert zsh.startswith("#compdef cachemgr\n")
    for fn in ("_cachemgr_node() {", "_cachemgr_optval() {", "_cachemgr_posval() {"):
        assert fn in zsh and fn in bash
    # zsh's $path is tied to $PATH: the walk must not use it as a variable
    assert "local path" not in zsh and "path=" not in zsh.replace("cmdpath=", "")
    assert json.dumps("status:show every cache, its mode, state and dirty data")[1:-1] in zsh
