"""The Debian package's sources (debian/, scripts/build-deb.sh), checked statically: control
fields, that every file debian/rules and the dh files install exists in the checkout, that
every systemd unit is packaged and no unit is enabled by the package, that the maintainer
scripts keep /etc/cachemgr and remove the state on purge.

The build itself (scripts/build-deb.sh: about 45-80 s with the wheels fetched and
pylibblkid compiled, then lintian) runs when CACHEMGR_TEST_DEB=1 asks for it and
dpkg-buildpackage is installed; it is skipped otherwise, saying so. The package is installed,
run and purged in the lab by tests/kernel/test_deb_kernel.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEB = ROOT / "debian"


def control() -> list[dict[str, str]]:
    """debian/control's paragraphs, continuation lines joined."""
    paras: list[dict[str, str]] = []
    for block in re.split(r"\n\s*\n", (DEB / "control").read_text().strip()):
        para: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line.startswith((" ", "\t")):
                para[key] += "\n" + line.strip()
            else:
                key, _, value = line.partition(":")
                para[key] = value.strip()
        paras.append(para)
    return paras


def names(field: str) -> set[str]:
    return {re.sub(r"[\s(].*", "", c.strip()) for c in field.split(",") if c.strip()}


def rules_var(name: str) -> list[str]:
    text = (DEB / "rules").read_text().replace("\\\n", " ")
    m = re.search(rf"^{name} := (.*)$", text, re.M)
    assert m, f"{name} not in debian/rules"
    return m.group(1).split()


def test_control_fields() -> None:
    src, pkg = control()
    assert src["Source"] == pkg["Package"] == "cachemgr"
    assert "debhelper-compat (= 13)" in src["Build-Depends"]
    assert {"gcc", "pkg-config", "libblkid-dev", "python3-dev", "python3-venv"} \
        <= names(src["Build-Depends"])
    assert src["Rules-Requires-Root"] == "no"
    assert pkg["Architecture"] == "any"  # pylibblkid is compiled
    deps = names(pkg["Depends"])
    assert {"bcache-tools", "fio", "dmsetup", "udev", "smartmontools", "libblkid1",
            "${cachemgr:Python}", "${shlibs:Depends}", "${misc:Depends}"} <= deps
    # the substitution names the venv's interpreter and python3
    assert 'cachemgr:Python="$(PYNAME), python3"' in (DEB / "rules").read_text()
    assert pkg["Description"].count("\n") >= 2


def test_version_matches_pyproject() -> None:
    version = re.search(r'^version = "(.*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    first = (DEB / "changelog").read_text().splitlines()[0]
    assert version and first.startswith(f"cachemgr ({version.group(1)}) ")
    assert (DEB / "source/format").read_text().strip() == "3.0 (native)"


def test_every_installed_file_exists() -> None:
    for name in ("install", "docs", "links"):
        lines = [ln.split() for ln in (DEB / f"cachemgr.{name}").read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")]
        assert lines, name
        for words in lines:
            if name == "links":
                assert words[0].startswith("usr/lib/cachemgr/bin/"), words
                assert words[1].startswith("usr/bin/"), words
            else:
                assert (ROOT / words[0]).exists(), f"debian/cachemgr.{name}: {words[0]}"
    rules = (DEB / "rules").read_text()
    found = re.findall(r"(?<=\s)((?:udev|systemd|man|completion|libvirt)/[\w./-]+)", rules)
    assert "udev/90-cachemgr.rules" in found and "libvirt/qemu-hook" in found
    for path in found:
        if "$" not in path and "*" not in path:
            assert (ROOT / path).exists(), f"debian/rules installs {path}"
    # the console scripts the links point at are the project's
    py = (ROOT / "pyproject.toml").read_text()
    for script in ("cachemgr", "cachemgr-tui"):
        assert re.search(rf"^{script} = ", py, re.M)


def test_every_unit_packaged_none_enabled() -> None:
    units = rules_var("UNITS")
    on_disk = sorted(p.name for p in (ROOT / "systemd").iterdir()
                     if p.suffix in (".service", ".timer"))
    assert sorted(units) == on_disk
    rules = (DEB / "rules").read_text()
    assert "dh_installsystemd --no-enable --no-start" in rules
    assert "s|@CACHEMGR@|/usr/bin/cachemgr|g" in rules
    assert "s|@PYTHON@|$(VENV)/bin/python3|g" in rules
    # the placeholders the rules fill are the only ones the sources have
    for f in [ROOT / "udev/90-cachemgr.rules", ROOT / "libvirt/qemu-hook",
              *[ROOT / "systemd" / u for u in units]]:
        assert set(re.findall(r"@[A-Z]+@", f.read_text())) <= {"@CACHEMGR@", "@ARGS@",
                                                                "@PYTHON@"}, f


def test_maintainer_scripts() -> None:
    postrm = (DEB / "postrm").read_text()
    assert "rm -rf /var/lib/cachemgr" in postrm
    assert "rm -rf /etc/cachemgr" not in postrm
    assert re.search(r'"\$1" = purge.*\n\s*rm -rf /var/lib/cachemgr', postrm)
    for name in ("postinst", "prerm", "postrm"):
        text = (DEB / name).read_text()
        assert "#DEBHELPER#" in text and text.startswith("#!/bin/sh\n"), name
        assert os.access(DEB / name, os.X_OK), name
        # nothing starts or enables a unit, nothing touches a device; postinst's one
        # exception, in place of the earlier version's timer the admin enabled, is run below
        # (test_postinst_puts_the_service_in_place_of_an_enabled_timer)
        if name == "postinst":
            text = text.split(UPGRADE_BLOCK)[0]
        assert "systemctl" not in text and "enable" not in text.replace("enabled", ""), name
        r = subprocess.run(["sh", "-n", str(DEB / name)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert "README.Debian" in (DEB / "postinst").read_text()
    assert "NOT enabled" in (DEB / "README.Debian").read_text()


UPGRADE_BLOCK = "# An upgrade from a version that shipped cachemgr-textfile.timer"


def postinst(root: Path, tmp_path: Path, *args: str) -> tuple[list[str], str]:
    """debian/postinst run with ``DPKG_ROOT=root`` (what it touches is under root; no running
    systemd is asked), deb-systemd-helper, deb-systemd-invoke and systemctl stand-ins that
    record their arguments; returns those calls and stderr (the byte-code step's line
    left out)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    log.write_text("")
    for tool in ("deb-systemd-helper", "deb-systemd-invoke", "systemctl"):
        (bin_ / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
        (bin_ / tool).chmod(0o755)
    r = subprocess.run(["sh", str(DEB / "postinst"), *args], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "DPKG_ROOT": str(root),
                                        "PATH": f"{bin_}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    # the byte-code step's interpreter is the package's, absent here ("not found": || true)
    err = "".join(x for x in r.stderr.splitlines(keepends=True)
                  if "/usr/lib/cachemgr/bin/python3" not in x)
    return log.read_text().splitlines(), err


def test_postinst_puts_the_service_in_place_of_an_enabled_timer(tmp_path: Path) -> None:
    """An upgrade from a version with cachemgr-textfile.timer (dpkg removed its file): the
    admin's links to it and deb-systemd-helper's record of it go, and
    cachemgr-textfile.service is enabled in its place; a fresh install, an upgrade without
    the timer enabled, and install-udev's own timer in /etc get nothing enabled."""
    root = tmp_path / "root"
    etc = root / "etc/systemd/system"
    wants = etc / "timers.target.wants"
    wants.mkdir(parents=True)
    link = wants / "cachemgr-textfile.timer"
    link.symlink_to("/lib/systemd/system/cachemgr-textfile.timer")  # dangling: dpkg removed it
    state = root / "var/lib/systemd/deb-systemd-helper-enabled"
    state.mkdir(parents=True)
    (state / "cachemgr-textfile.timer.dsh-also").write_text(
        "/etc/systemd/system/timers.target.wants/cachemgr-textfile.timer\n")
    assert postinst(root, tmp_path, "configure") == ([], "")  # a fresh install: nothing
    assert link.is_symlink()
    calls, err = postinst(root, tmp_path, "configure", "0.1.0")
    assert calls == ["deb-systemd-helper purge cachemgr-textfile.timer",
                     "deb-systemd-helper enable cachemgr-textfile.service"], calls
    (state / "cachemgr-textfile.timer.dsh-also").unlink()  # what the purge did
    assert not link.is_symlink() and "enabled in its place" in err
    # again (the links gone): nothing more
    assert postinst(root, tmp_path, "configure", "0.1.0") == ([], "")
    # install-udev's timer in /etc is install-udev's to remove
    (etc / "cachemgr-textfile.timer").write_text("[Timer]\n")
    link.symlink_to(etc / "cachemgr-textfile.timer")
    assert postinst(root, tmp_path, "configure", "0.1.0") == ([], "")
    assert link.is_symlink()


def test_no_index_named() -> None:
    """The machine's configured pip fetches the wheels: no index URL in the package's
    sources, and the install into the staging venv uses no index at all."""
    for f in [*DEB.rglob("*"), ROOT / "scripts/build-deb.sh"]:
        if f.is_file():
            text = f.read_text()
            assert "index-url" not in text.lower() and "://pypi" not in text.lower(), f
    assert "--no-index" in (DEB / "rules").read_text()


@pytest.mark.skipif(os.environ.get("CACHEMGR_TEST_DEB") != "1",
                    reason="the package build takes 45-80 s and fetches wheels: "
                           "CACHEMGR_TEST_DEB=1 runs it")
@pytest.mark.skipif(shutil.which("dpkg-buildpackage") is None or shutil.which("lintian") is None,
                    reason="debhelper or lintian not installed (scripts/setup.sh)")
def test_build_deb() -> None:
    r = subprocess.run(["scripts/build-deb.sh"], cwd=ROOT, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, r.stderr[-4000:]
    deb = ROOT / r.stdout.strip().splitlines()[-1]
    assert deb.exists() and deb.name.startswith("cachemgr_")
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                             check=True).stdout
    for path in ("./usr/lib/cachemgr/pyvenv.cfg", "./usr/bin/cachemgr ->",
                 "./lib/udev/rules.d/90-cachemgr.rules",
                 "./lib/systemd/system/cachemgr-metrics.service",
                 "./usr/share/cachemgr/monitoring/prometheus/cachemgr.rules.yml",
                 "./usr/libexec/cachemgr/qemu-hook",
                 "./usr/share/doc/cachemgr/admin-guide.md.gz"):
        assert path in listing, path
    assert ".pyc" not in listing and "/etc/" not in listing
