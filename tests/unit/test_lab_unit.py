from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pytest

from cachemgr.core.errors import LabError, UsageError
from cachemgr.lab import core, kernels
from cachemgr.lab.core import parse_disk_specs, parse_disks, parse_size
from tests.unit.tui_helpers import fx


def test_sizes() -> None:
    assert parse_disks("1G,256M") == (1 << 30, 256 << 20)
    assert parse_size("2048k") == 2 << 20
    assert parse_size("2GiB") == 2 << 30
    for bad in ("", "1X", "-1G", "10"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_nvme_disks_are_their_own_list_and_qemu_only(tmp_path: object) -> None:
    assert parse_disk_specs("1G,nvme:512M, NVMe:256M,256M") == (
        (1 << 30, 256 << 20), ((512 << 20,), (256 << 20,)))
    with pytest.raises(UsageError, match="nvme: disks are not taken here"):
        parse_disks("1G,nvme:512M")
    with pytest.raises(UsageError):
        parse_disk_specs("nvme:")
    with pytest.raises(UsageError, match="NVMe disks need the qemu backend"):
        core.run(["true"], core.LabSpec(backend="uml", nvme=((1 << 30,),)))
    # fixed identities, different per controller
    assert core.nvme_serial(0) != core.nvme_serial(1) and len(core.nvme_serial(99)) <= 20
    assert core.nvme_eui64(0) != core.nvme_eui64(1)


def test_nvme_controller_with_several_namespaces() -> None:
    assert parse_disk_specs("512M,nvme:160M+32M,nvme:64M") == (
        (512 << 20,), ((160 << 20, 32 << 20), (64 << 20,)))
    assert parse_disk_specs("nvme: 1M + 2M ")[1] == ((1 << 20, 2 << 20),)
    assert parse_disk_specs("nvme:" + "+".join(["1M"] * 8))[1] == ((1 << 20,) * 8,)
    for bad, word in (("nvme:+", "namespace 1 has no size"),
                      ("nvme:1G+", "namespace 2 has no size"),
                      ("nvme:1G++1G", "namespace 2 has no size"),
                      ("nvme:0", "namespace 1: disk size '0' is below 1 MiB"),
                      ("nvme:1G+0", "namespace 2: disk size '0' is below 1 MiB"),
                      ("nvme:1G+lots", "namespace 2: bad size 'lots'"),
                      ("nvme:" + "+".join(["1M"] * 9), "9 namespaces on one controller")):
        with pytest.raises(UsageError) as exc:
            parse_disk_specs(bad)
        assert word in exc.value.message and repr(bad) in exc.value.message, bad
        assert exc.value.hint, bad


def test_nvme_namespace_identities() -> None:
    # namespace 1 keeps the identity the lab always gave (captures and tests know it)
    assert core.nvme_eui64(0) == core.nvme_eui64(0, 1) == 0x5254_00c0_ffee_0001
    assert core.nvme_uuid(0) == core.nvme_uuid(0, 1) == "5c0ffee0-0000-4000-8000-000000000001"
    assert core.nvme_eui64(3) == 0x5254_00c0_ffee_0004
    euis = {core.nvme_eui64(i, n) for i in range(16) for n in range(1, 9)}
    uuids = {core.nvme_uuid(i, n) for i in range(16) for n in range(1, 9)}
    assert len(euis) == len(uuids) == 16 * 8
    assert all(len(u) == 36 and u.count("-") == 4 for u in uuids)


def _devices(argv: list[str]) -> list[dict[str, str]]:
    """The -device and -drive options of a qemu argv, as dicts (``kind`` = the driver)."""
    out = []
    for opt, val in itertools.pairwise(argv):
        if opt in ("-device", "-drive"):
            first, *rest = val.split(",")
            d = dict(x.split("=", 1) for x in rest)
            d["kind"] = first if opt == "-device" else "drive"
            if opt == "-drive":
                d["file"] = first.split("=", 1)[1]
            out.append(d)
    return out


def test_qemu_argv_of_nvme_controllers(tmp_path: Path) -> None:
    from cachemgr.lab import qemu

    a1, a2, b1 = (tmp_path / n for n in ("nvme0n1.img", "nvme0n2.img", "nvme1n1.img"))
    devs = _devices(qemu.nvme_devices([[a1, a2], [b1]]))
    ports = [d for d in devs if d["kind"] == "pcie-root-port"]
    ctrls = [d for d in devs if d["kind"] == "nvme"]
    nss = [d for d in devs if d["kind"] == "nvme-ns"]
    drives = {d["id"]: d["file"] for d in devs if d["kind"] == "drive"}
    # one root port and one serial per controller
    assert [p["id"] for p in ports] == ["rp0", "rp1"]
    assert [(c["id"], c["bus"], c["serial"]) for c in ctrls] == [
        ("nvmec0", "rp0", core.nvme_serial(0)), ("nvmec1", "rp1", core.nvme_serial(1))]
    # namespaces 1 and 2 on controller 0, each on its own image, with its own identity
    assert [(n["bus"], n["nsid"], drives[n["drive"]]) for n in nss] == [
        ("nvmec0", "1", str(a1)), ("nvmec0", "2", str(a2)), ("nvmec1", "1", str(b1))]
    assert [n["eui64"] for n in nss] == [
        str(core.nvme_eui64(0)), str(core.nvme_eui64(0, 2)), str(core.nvme_eui64(1))]
    assert [n["uuid"] for n in nss] == [
        core.nvme_uuid(0), core.nvme_uuid(0, 2), core.nvme_uuid(1)]
    assert len({n["eui64"] for n in nss}) == len({n["uuid"] for n in nss}) == 3
    # a controller is declared before its namespaces (qemu attaches them by bus)
    kinds = [d["kind"] for d in devs if d["kind"] != "drive"]
    assert kinds == ["pcie-root-port", "nvme", "nvme-ns", "nvme-ns",
                     "pcie-root-port", "nvme", "nvme-ns"]
    # today's single-namespace controller is unchanged: drive nvme0, nsid 1
    one = _devices(qemu.nvme_devices([[a1]]))
    assert [d.get("id") for d in one if d["kind"] == "drive"] == ["nvme0"]
    assert qemu.nvme_devices([]) == []


def test_lab_run_makes_an_image_per_namespace(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """core.run hands the backend the images in controller and namespace order, sized as
    asked, and one serial per controller (not per namespace)."""
    seen: dict[str, object] = {}

    class Fake(core.Backend):
        def tty_names(self) -> dict[str, str]:
            return {}

        def boot(self, info, spec, rundir, disks, console, out, err,  # type: ignore[no-untyped-def]
                 capture):
            seen["disks"] = [(d.name, d.stat().st_size) for d in disks]
            seen["env"] = (rundir / "lab.env").read_text()
            return core.LabResult(0, False, rundir, console, None, [])

    kernel = tmp_path / "vmlinuz"
    kernel.write_text("")
    monkeypatch.setattr(core, "_backend", lambda name: Fake())
    monkeypatch.setattr(kernels, "load_manifest",
                        lambda: {"qemu": kernels.KernelInfo("qemu", "0", "6.1", str(kernel), "",
                                                           {})})
    monkeypatch.setenv("CACHEMGR_LAB_RUNS", str(tmp_path / "runs"))
    disks, nvme = parse_disk_specs("2M,nvme:3M+4M,nvme:5M")
    core.run(["true"], core.LabSpec(backend="qemu", disks=disks, nvme=nvme))
    assert seen["disks"] == [("disk0.img", 2 << 20), ("nvme0n1.img", 3 << 20),
                             ("nvme0n2.img", 4 << 20), ("nvme1n1.img", 5 << 20)]
    assert (f"LAB_NVME_SERIALS='{core.nvme_serial(0)} {core.nvme_serial(1)}'"
            in str(seen["env"]))
    # the guest adds the namespaces to $LAB_DISKS after the plain disks (lab-disks.sh):
    # it needs how many each controller has
    assert "LAB_NVME_NAMESPACES='2 1'" in str(seen["env"])
    assert "LAB_DISKS='/dev/vda'\n" in str(seen["env"])


def _lab_disks(sysfs: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = Path(core.HERE) / "lab-disks.sh"
    return subprocess.run(["bash", "-c", f'. "{script}"; lab_disks'], capture_output=True,
                          text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "LAB_SYSFS": str(sysfs), **env})


def test_lab_disks_names_the_nvme_namespaces_after_the_plain_disks() -> None:
    """$LAB_DISKS in the guest (stage2.sh sources lab-disks.sh), on the qemu capture of two
    NVMe controllers: the plain disks, then each controller's namespace found by its serial
    and nsid, in the order of the serials (the order of --disks), whatever the kernel's
    names."""
    sysfs = fx("nvme-pair")
    a, b = core.nvme_serial(0), core.nvme_serial(1)
    r = _lab_disks(sysfs, LAB_DISKS="/dev/vda", LAB_NVME_SERIALS=f"{a} {b}",
                   LAB_NVME_NAMESPACES="1 1")
    assert (r.returncode, r.stdout, r.stderr) == (0, "/dev/vda /dev/nvme0n1 /dev/nvme1n1\n", "")
    r = _lab_disks(sysfs, LAB_DISKS="/dev/vda /dev/vdb", LAB_NVME_SERIALS=f"{b} {a}",
                   LAB_NVME_NAMESPACES="1 1")
    assert r.stdout == "/dev/vda /dev/vdb /dev/nvme1n1 /dev/nvme0n1\n"
    # no NVMe: the plain disks as they were
    assert _lab_disks(sysfs, LAB_DISKS="/dev/vda").stdout == "/dev/vda\n"
    # only NVMe
    assert _lab_disks(sysfs, LAB_NVME_SERIALS=b).stdout == "/dev/nvme1n1\n"


def test_lab_disks_leaves_out_and_names_a_namespace_that_never_came() -> None:
    sysfs = fx("nvme-pair")
    a = core.nvme_serial(0)
    # the capture's controller has one namespace; a second one never appears
    r = _lab_disks(sysfs, LAB_DISKS="/dev/vda", LAB_NVME_SERIALS=f"{a} CMLABNVME77",
                   LAB_NVME_NAMESPACES="2 1", LAB_NVME_WAIT="0")
    assert r.returncode == 1
    assert r.stdout == "/dev/vda /dev/nvme0n1\n"
    assert f"namespace 2 of NVMe controller {a} did not appear" in r.stderr
    assert "namespace 1 of NVMe controller CMLABNVME77 did not appear" in r.stderr


def test_qemu_monitor_reaches_the_guest_through_a_port_on_its_own_socket() -> None:
    """The monitor's server socket and the guest port's client socket are the same file, the
    monitor speaks QMP, and the port has the name the guest-side client looks for."""
    from cachemgr.lab import qemu, qmp

    argv = qemu.monitor_devices()
    chardevs = {}
    for opt, val in itertools.pairwise(argv):
        if opt == "-chardev":
            kind, *rest = val.split(",")
            fields = dict(x.split("=", 1) for x in rest)
            chardevs[fields.pop("id")] = (kind, fields)
    mon = argv[argv.index("-mon") + 1]
    assert "mode=control" in mon.split(",")
    server = mon.split("chardev=")[1].split(",")[0]
    (port,) = [d for d in _devices(argv) if d["kind"] == "virtserialport"]
    client = port["chardev"]
    assert chardevs[server][1]["server"] == "on" and chardevs[server][1]["wait"] == "off"
    assert "server" not in chardevs[client][1]
    assert chardevs[server][0] == chardevs[client][0] == "socket"
    assert chardevs[server][1]["path"] == chardevs[client][1]["path"]
    assert port["name"] == qmp.PORT_NAME
    assert not os.path.isabs(chardevs[server][1]["path"])  # the run directory: qemu's cwd


def test_qemu_virtio_disks_with_serials(tmp_path: Path) -> None:
    from cachemgr.lab import qemu

    a, b = tmp_path / "a.img", tmp_path / "b.img"
    devs = _devices(qemu.virtio_disks([a, b], ("LAB-A",)))
    assert [(d["kind"], d.get("drive"), d.get("serial")) for d in devs
            if d["kind"] != "drive"] == [("virtio-blk-pci", "disk0", "LAB-A"),
                                         ("virtio-blk-pci", "disk1", None)]
    assert [d["file"] for d in devs if d["kind"] == "drive"] == [str(a), str(b)]
    # UML's ubd disks have no serial: refused, as a malformed one is
    with pytest.raises(UsageError, match="disk serials are the qemu lab's"):
        core.run(["true"], core.LabSpec(backend="uml", disks=(1 << 20,),
                                        disk_serials=("X",)))
    with pytest.raises(UsageError, match="one for each plain disk at most"):
        core.run(["true"], core.LabSpec(backend="qemu", disks=(1 << 20,),
                                        disk_serials=("a,b",)))


def test_monitor_is_qemu_only() -> None:
    with pytest.raises(UsageError, match="machine monitor needs the qemu backend"):
        core.run(["true"], core.LabSpec(backend="uml", monitor=True))


DEB822 = """\
Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822(tmp_path: Path) -> None:
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(DEB822)
    (d / "other.sources").write_text("Types: deb\nURIs: https://x.invalid/apt\nSuites: nodistro\n")
    assert kernels.debian_mirror(tmp_path / "none", d) == "http://mirror.invalid/debian"


def test_mirror_from_one_line_list(tmp_path: Path) -> None:
    f = tmp_path / "sources.list"
    f.write_text("# c\ndeb [arch=amd64] http://m.invalid/debian/ bookworm main\n")
    assert kernels.debian_mirror(f, tmp_path / "none") == "http://m.invalid/debian"


def test_no_mirror_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LabError) as exc:
        kernels.debian_mirror(tmp_path / "a", tmp_path / "b")
    assert "mirror" in str(exc.value)


def test_this_machine_has_a_mirror() -> None:
    assert kernels.debian_mirror().startswith(("http://", "https://", "file:"))


def test_a_read_write_directory_the_host_lacks_is_refused(tmp_path: Path) -> None:
    """`lab run --rw DIR` with no DIR on the host: a clear refusal, no guest booted (it died
    in its first stage with exit 125 and the console's tail)."""
    with pytest.raises(UsageError, match="no such directory on the host") as e:
        core.run(["true"], core.LabSpec(rw_paths=(str(tmp_path / "nope"),)))
    assert e.value.hint == f"create it first: mkdir -p {tmp_path / 'nope'}"


def test_uml_guests_run_in_seccomp_mode_unless_told_otherwise() -> None:
    from cachemgr.lab import uml

    assert uml.seccomp_arg({}) == "seccomp=auto"
    assert uml.seccomp_arg({"CACHEMGR_LAB_UML_SECCOMP": "off"}) == "seccomp=off"
    assert uml.seccomp_arg({"CACHEMGR_LAB_UML_SECCOMP": "on"}) == "seccomp=on"
    for bad in ("", "yes", "off; reboot"):
        with pytest.raises(UsageError, match="CACHEMGR_LAB_UML_SECCOMP"):
            uml.seccomp_arg({"CACHEMGR_LAB_UML_SECCOMP": bad})
