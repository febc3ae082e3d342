"""The Debian package (issue #33 item 1) installed, used and purged with dpkg on a Debian 12
root in the lab: ``--lab-backend=qemu`` boots Debian's own kernel over this machine's root
(read-only under a tmpfs overlay, so what dpkg does stays in the guest). The package is the
one ``scripts/build-deb.sh`` left in the checkout's dist/ (the guest sees the checkout at its
own path); without one the test is skipped, saying so.

Checks: the Depends are all in the guest's root; ``dpkg -i`` configures it; ``cachemgr
--help`` and ``cachemgr status`` run from the package's venv (not from the checkout);
the udev rule and the units are in place with the packaged paths and no unit is enabled;
the packaged rule (the only cachemgr rule, udevd running) attaches a hot-added scsi_debug
cache and backing disk as a policy says;
``dpkg -r`` keeps what an admin wrote in /etc/cachemgr and the state; ``dpkg --purge``
leaves no file of the package (each path ``dpkg -L`` listed is gone, or is a directory
another package owns) and removes /var/lib/cachemgr."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Debian 12's own kernel and root: the package is built for them (scripts/test.sh builds it
# before the qemu set, in which this test runs)
pytestmark = [pytest.mark.kernel(timeout=300, qemu_timeout=900, udev=True,
                                 qemu_only="it installs the package on Debian's own kernel"),
              pytest.mark.qemu_smoke]

VENV = Path("/usr/lib/cachemgr")
UNITS_WITH_INSTALL = ("cachemgr-autoattach.service", "cachemgr-metrics.service",
                      "cachemgr-textfile.service", "cachemgr-smart.timer",
                      "cachemgr-protect.timer")


def run(*argv: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # no PYTHONPATH, cwd /: what runs is the package's, never this checkout's cachemgr
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    r = subprocess.run(argv, capture_output=True, text=True, cwd="/", env=env,
                       timeout=timeout)
    if check:
        assert r.returncode == 0, f"{argv}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def the_deb() -> Path:
    version = re.search(r'^version = "(.*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version
    arch = run("dpkg", "--print-architecture").stdout.strip()
    deb = ROOT / "dist" / f"cachemgr_{version.group(1)}_{arch}.deb"
    if not deb.exists():
        pytest.skip(f"{deb.relative_to(ROOT)} not built: run scripts/build-deb.sh first")
    return deb


def installed(pkg: str) -> bool:
    r = run("dpkg-query", "-W", "-f=${Status}", pkg, check=False)
    return r.returncode == 0 and "install ok installed" in r.stdout


def hot_add_attaches_by_the_packaged_rule() -> None:
    """A cache SSD and a backing disk hot-added (scsi_debug, SCSI rescan of their hosts) are
    attached as the policy says by the packaged rule's handler: no other cachemgr rule is in
    place, and udevd's log names the packaged interpreter running it."""
    from tests.kernel import test_udev_kernel as ut

    for d in ("/etc/udev/rules.d", "/run/udev/rules.d"):
        assert not list(Path(d).glob("*cachemgr*")), f"a cachemgr rule in {d}"
    assert not ut.POLICY.exists()
    sysfs, ssd, backs = ut.prepare(1)  # formatted, then pulled out, with no policy in place
    ut.POLICY.parent.mkdir(parents=True, exist_ok=True)
    ut.POLICY.write_text(ut.policy_text(ssd, backs))
    try:
        # the packaged rule read again (SIGHUP: a control message can be ignored, see
        # docs/kernel-notes.md "udevd can ignore udevadm control"), and the debug log the
        # assertion below reads, proven on
        run("sh", "-c", "kill -HUP $(pgrep -o -x systemd-udevd) && udevadm control --ping")
        ut.udev_debug()
        for d in (ssd, *backs):
            ut.rescan(sysfs, d)
        ut.wait(lambda: all(ut.backing_ok(sysfs, b) for b in backs), 120,
                "the policy's attachment, by the packaged rule")
        ut.settle()
        assert ut.acts("attach"), ut.records()
        assert not [r for r in ut.records() if r.get("result") == "failed"], ut.records()
        log = Path("/run/udevd.log").read_text(errors="replace")
        assert f"{VENV}/bin/python3 -m cachemgr.cli.udev udev-event" in log, log[-3000:]
    finally:
        run("udevadm", "control", "--log-level=info", check=False)
        ut.POLICY.unlink()
        ut.release(sysfs, [d for d in (ut.Disk.find(x, sysfs) for x in (ssd, *backs)) if d])


def test_deb_installs_runs_and_purges_clean() -> None:
    deb = the_deb()
    assert not installed("cachemgr"), "cachemgr is installed in the lab root already"

    # every Depends in the guest's root (alternatives: one of them)
    depends = run("dpkg-deb", "-f", str(deb), "Depends").stdout
    missing = []
    for clause in depends.split(","):
        names = [re.sub(r"[\s(].*", "", alt.strip()) for alt in clause.split("|")]
        if not any(installed(n) for n in names):
            missing.append(clause.strip())
    assert not missing, f"Depends missing from the lab root: {missing}"

    t0 = time.monotonic()
    run("dpkg", "-i", str(deb))
    took = time.monotonic() - t0
    print(f"dpkg -i took {took:.1f} s")
    assert installed("cachemgr")
    files = [p for p in run("dpkg", "-L", "cachemgr").stdout.splitlines() if p.strip()]
    assert "/usr/bin/cachemgr" in files

    # the package's venv, its byte code compiled by postinst for the installed paths
    r = run(str(VENV / "bin/python3"), "-c", "import cachemgr, sys; print(cachemgr.__file__)")
    assert r.stdout.startswith(str(VENV) + "/"), r.stdout
    assert list((VENV / "lib").glob("python3*/site-packages/cachemgr/__pycache__/*.pyc"))
    assert Path("/usr/bin/cachemgr").resolve() == VENV / "bin/cachemgr"

    h = run("cachemgr", "--help")
    assert "status" in h.stdout
    version = re.search(r'^version = "(.*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version and run("cachemgr", "--version").stdout.strip() == \
        f"cachemgr {version.group(1)}"
    # the man pages and the completion, where man and bash look for them
    assert "/usr/share/man/man8/cachemgr.8.gz" in files
    assert "/usr/share/man/man8/cachemgr-drain.8.gz" in files
    if Path("/usr/bin/man").exists():
        assert run("man", "-w", "cachemgr").stdout.strip() == "/usr/share/man/man8/cachemgr.8.gz"
        page = run("man", "-P", "cat", "cachemgr-drain", timeout=120).stdout
        assert "drain" in page and "SYNOPSIS" in page.upper()
    comp = Path("/usr/share/bash-completion/completions/cachemgr")
    assert comp in {Path(f) for f in files}
    words = run("bash", "-c", f"source {comp}; COMP_WORDS=(cachemgr sta); COMP_CWORD=1; "
                "_cachemgr 2>/dev/null || true; printf '%s\\n' \"${COMPREPLY[@]}\"").stdout
    assert "status" in words.split(), words
    assert "/usr/share/zsh/vendor-completions/_cachemgr" in files
    s = run("cachemgr", "status", check=False)
    assert s.returncode == 0, f"cachemgr status: exit {s.returncode}\n{s.stdout}\n{s.stderr}"
    assert "Traceback" not in s.stderr, s.stderr
    run("cachemgr", "status", "--json")

    # the udev rule, its handler the packaged interpreter (which imports the handler)
    rule = Path("/lib/udev/rules.d/90-cachemgr.rules").read_text()
    assert f'RUN+="{VENV}/bin/python3 -m cachemgr.cli.udev udev-event"' in rule
    assert "@" not in "".join(ln for ln in rule.splitlines() if not ln.startswith("#"))
    run(str(VENV / "bin/python3"), "-c", "import cachemgr.cli.udev")

    # the units: in place, the packaged binary, none enabled or started
    unitdir = Path("/lib/systemd/system")
    for u in sorted(p.name for p in (ROOT / "systemd").iterdir() if p.suffix in (".service",
                                                                                  ".timer")):
        text = (unitdir / u).read_text()
        assert "@CACHEMGR@" not in text and "@ARGS@" not in text, u
        if u.endswith(".service"):
            assert "ExecStart=/usr/bin/cachemgr " in text, u
    # the boot unit's command, as systemd would run it: only with a policy (its condition),
    # here an empty one (nothing to do); the file goes again before the purge checks
    boot = (unitdir / "cachemgr-autoattach.service").read_text()
    assert "ConditionPathExists=|/etc/cachemgr/cachemgr.toml" in boot
    cmd = next(ln.split("=", 1)[1] for ln in boot.splitlines() if ln.startswith("ExecStart="))
    policy = Path("/etc/cachemgr/cachemgr.toml")
    had = policy.exists()
    if not had:
        policy.parent.mkdir(exist_ok=True)
        policy.write_text("")
    try:
        r = run(*cmd.split(), check=False)
    finally:
        if not had:
            policy.unlink()
    assert r.returncode in (0, 4) and "Traceback" not in r.stderr, (cmd, r.returncode, r.stderr)
    for u in UNITS_WITH_INSTALL:
        r = run("systemctl", "is-enabled", u, check=False)
        assert r.stdout.strip() == "disabled", (u, r.stdout, r.stderr)
    links = [str(p) for p in Path("/etc/systemd/system").rglob("cachemgr*")]
    assert not links, f"enabled on install: {links}"
    if Path("/run/systemd/system").exists():
        for u in UNITS_WITH_INSTALL:
            assert run("systemctl", "is-active", u, check=False).stdout.strip() != "active"

    hot_add_attaches_by_the_packaged_rule()

    # an admin's file and cachemgr's state
    Path("/etc/cachemgr").mkdir(exist_ok=True)
    admin = Path("/etc/cachemgr/admin-notes.txt")
    admin.write_text("written by the admin\n")
    state = Path("/var/lib/cachemgr")
    state.mkdir(mode=0o700, exist_ok=True)
    (state / "test-state.json").write_text("{}\n")

    run("dpkg", "-r", "cachemgr")
    assert not Path("/usr/bin/cachemgr").exists()
    assert not VENV.exists(), "run-time byte code left under /usr/lib/cachemgr"
    assert admin.exists() and (state / "test-state.json").exists()

    run("dpkg", "--purge", "cachemgr")
    r = run("dpkg-query", "-W", "-f=${Status}", "cachemgr", check=False)
    assert "installed" not in r.stdout.replace("not-installed", ""), r.stdout
    left = []
    for p in files:
        path = Path(p)
        if not (path.exists() or path.is_symlink()):
            continue
        # "/." and a merged-/usr link (/lib -> usr/lib) are the system's, not the package's
        if p in ("/.", "/") or (path.is_symlink() and p.count("/") == 1 and path.is_dir()):
            continue
        left.append(p)
    # a directory the package shares with others (/usr/bin, /lib/udev/rules.d, ...): another
    # package owns it ("pkg1, pkg2: /usr/bin"); one dpkg-query for all (each is seconds on TCG)
    dirs = [p for p in left if Path(p).is_dir()]
    if dirs:
        r = run("dpkg-query", "-S", *dirs, check=False)
        owned = {ln.rsplit(": ", 1)[1] for ln in r.stdout.splitlines() if ": " in ln}
        left = [p for p in left if p not in owned]
    assert not left, f"left after purge: {left}"
    assert not state.exists(), "/var/lib/cachemgr left after purge"
    assert admin.read_text() == "written by the admin\n", "purge touched the admin's file"
