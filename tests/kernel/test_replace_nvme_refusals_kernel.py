"""replace-ssd refuses to pull an NVMe controller it may not pull (issue #17), on Debian's
kernel in the qemu lab: one emulated NVMe controller with two namespaces (``nvme:160M+32M``),
bcache's cache on namespace 1 in writeback holding dirty data, its backing device on a virtio
disk. Removing the controller's PCI function would take namespace 2 away too, so:

* shared controller: replace-ssd (and its dry run) is refused with exit 3 naming
  /dev/nvmeXn2, before anything is changed: still attached, same mode and tunables, the
  same dirty data, no journal;
* root-holding controller: namespace 2 mounted over ``/`` in a private mount namespace
  (``unshare -m``; the process keeps its old root, but its /proc/self/mountinfo says ``/``
  is on namespace 2): refused, saying namespace 2 is the root file system, nothing changed;
* the backend's own remove (there is no CLI command that pulls a disk: ``cachemgr remove``
  decommissions a cache, it does not touch the SSD) refuses the same way, writing nothing.

Runs with ``--lab-backend=qemu`` only (UML has no PCI, so no NVMe)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cachemgr.backends import bcache, hotplug, inuse, nvme, snapshot
from cachemgr.core import runner, state
from cachemgr.core.errors import UnsafeError
from cachemgr.core.model import CacheMode
from cachemgr.core.sysfs import Sysfs
from cachemgr.procedures import replace
from tests.kernel.clirun import in_process as cm
from tests.kernel.test_replace_kernel import FIO_COMMON, writeback_on

pytestmark = [pytest.mark.qemu_smoke,
              pytest.mark.kernel(disks="256M,nvme:160M+32M", timeout=400)]

# the region written before the refusals (dirty on the SSD), read back and checked after
REGION = ["--offset=16M", "--size=8M"]


def namespaces(sysfs: Sysfs) -> tuple[nvme.NvmeNamespace, nvme.NvmeNamespace]:
    """Namespaces 1 and 2 of the lab's controller (probed one after the other)."""
    (a,) = nvme.wait_for_all(sysfs, os.environ["LAB_NVME_SERIALS"].split(), 30)
    found: list[nvme.NvmeNamespace] = []

    def second() -> bool:
        found[:] = [n for n in nvme.namespaces(sysfs) if n.controller == a.controller
                    and n.nsid == 2 and inuse.node_ready(n.node)]
        return bool(found)

    assert bcache.wait_for(second, 30, 0.1), nvme.namespaces(sysfs)
    return a, found[0]


def fio(dev: str, *args: str) -> None:
    runner.run(["fio", "--name=pre", f"--filename={dev}", "--rw=randwrite", *REGION,
                *FIO_COMMON, *args, "--output-format=json"], timeout=300)


def state_of(sysfs: Sysfs) -> dict[str, Any]:
    """What a refused run must leave as it was: the set, its backing devices' attachment,
    mode, tunables and dirty data, the drives there, no journal, no drain record."""
    snap = snapshot.take(sysfs)
    return {
        "sets": [(c.uuid, [x.identity.name for x in c.caches]) for c in snap.cache_sets],
        "backings": [(b.identity.name, b.cset_uuid, b.mode, b.state, b.dirty_bytes,
                      b.writeback_running, b.writeback_percent, b.writeback_delay,
                      b.sequential_cutoff) for b in snap.backings],
        "namespaces": [(n.name, n.wwid, n.pci) for n in nvme.namespaces(sysfs)],
        "journals": [j.id for j in replace.list_runs()],
        "drains": sorted(p.name for p in (Path(state.state_dir()) / "drain").glob("*")),
    }


def in_root_namespace(ns2: nvme.NvmeNamespace, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` in a private mount namespace where ``ns2`` is mounted over ``/``: the command
    keeps running from the old root (its files are still found), but its mountinfo says the
    root file system is on ``ns2``."""
    script = f'mount {ns2.node} / && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "--",
                           "sh", "-c", script, "sh", *argv], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": os.getcwd()})


REMOVE = """
import sys
from cachemgr.backends import hotplug
from cachemgr.core.errors import UnsafeError
from cachemgr.core.sysfs import Sysfs
sysfs = Sysfs()
try:
    hotplug.remove(sysfs, hotplug.disk(sysfs, sys.argv[1]))
except UnsafeError as exc:
    print(exc.message)
    sys.exit(3)
"""


def test_shared_and_root_holding_controller_refused_changing_nothing(
        lab_disks: list[str]) -> None:
    sysfs = Sysfs()
    a, b = namespaces(sysfs)
    assert a.controller == b.controller and a.pci and a.pci == b.pci
    assert nvme.siblings(sysfs, a) == [b.name]
    bcache.create(sysfs, backings=[lab_disks[0]], cache=a.node, bucket="64k",
                  mode=CacheMode.WRITEBACK)
    (bk,) = snapshot.take(sysfs).backings
    assert bk.device
    # hold the dirty data (an idle set writes it back at once: docs/kernel-notes.md, "The
    # drain trap"), so that any drain or write-back by the refused runs would show
    sysfs.write(f"block/{bk.device_name}/bcache/writeback_running", "0")
    fio(bk.device, "--do_verify=0")
    before = state_of(sysfs)
    ((_, _, mode, _, dirty, *_),) = before["backings"]
    assert mode == CacheMode.WRITEBACK and dirty and dirty > 1 << 20, before
    shared = f"controller {a.controller} also carries {b.node}"

    # shared controller: the dry run and the run are refused at plan time, exit 3
    r = cm("replace-ssd", a.node, "--dry-run")
    assert r.returncode == 3 and shared in r.stderr, r.stderr
    r = cm("replace-ssd", a.node, "--yes", "--json")
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert shared in r.stderr and "removing it takes them away too" in r.stderr, r.stderr
    # --json answers in JSON, the refusal too (docs/json.md, "Errors and already so")
    err = json.loads(r.stdout)["error"]
    assert err["code"] == 3 and err["kind"] == "unsafe" and shared in err["message"], err
    assert state_of(sysfs) == before
    # by its cache set's UUID too
    r = cm("replace-ssd", before["sets"][0][0], "--yes")
    assert r.returncode == 3 and shared in r.stderr, r.stderr
    assert state_of(sysfs) == before

    # root-holding controller: namespace 2 is the root file system (of a mount namespace)
    runner.run(["mkfs.ext4", "-q", "-F", b.node], timeout=120)
    root = f"{b.node} is mounted on / (ext4), the root file system"
    r = in_root_namespace(b, "grep", f" / .* - ext4 {b.node} ", "/proc/self/mountinfo")
    assert r.returncode == 0, (r.stdout, r.stderr)  # the namespace does say so
    r = in_root_namespace(b, sys.executable, "-m", "cachemgr", "replace-ssd", a.node,
                          "--yes", "--json")
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert shared in r.stderr and root in r.stderr, r.stderr
    assert state_of(sysfs) == before
    # ... which this namespace does not have: there the refusal is the shared controller only
    assert root not in cm("replace-ssd", a.node, "--yes").stderr

    # the backend's remove (what replace-ssd's remove-old step calls) refuses the same way
    # and writes nothing; there is no CLI command that pulls a disk by itself
    r = in_root_namespace(b, sys.executable, "-c", REMOVE, a.name)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert shared in r.stdout and root in r.stdout, r.stdout
    assert f"{a.node} is the cache device of bcache cache set" in r.stdout
    with pytest.raises(UnsafeError, match="also carries") as exc:
        hotplug.remove(sysfs, hotplug.disk(sysfs, a.name))
    assert root not in str(exc.value)
    assert state_of(sysfs) == before

    # with writeback running (as a set normally is): still refused before any step
    writeback_on(sysfs)
    r = cm("replace-ssd", a.node, "--yes", "--json")
    assert r.returncode == 3 and shared in r.stderr, r.stderr
    after = state_of(sysfs)
    assert after["sets"] == before["sets"] and after["namespaces"] == before["namespaces"]
    assert after["journals"] == [] and after["drains"] == before["drains"]
    ((_, cset, mode, _, _, running, percent, delay, _),) = after["backings"]
    assert (cset, mode, running) == (before["sets"][0][0], CacheMode.WRITEBACK, True)
    assert (percent, delay) == before["backings"][0][6:8]  # no drain tunables left behind
    # the data written before is all there
    fio(bk.device, "--verify_only", "--verify_fatal=1")
