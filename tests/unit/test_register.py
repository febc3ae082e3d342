"""cachemgr register's decisions (ops.cache.register): the order (cache devices first), the
refusals (dirty data on a set neither registered nor named), "already so". The snapshot's
unregistered devices are what bcache-super-show reads on a live host, so they are given
here; the kernel test (tests/kernel/test_register_kernel.py) proves the registration."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cachemgr.backends import snapshot
from cachemgr.core.errors import UnsafeError, UsageError
from cachemgr.core.model import Identity, Snapshot, UnregisteredBcache
from cachemgr.core.sysfs import Sysfs
from cachemgr.ops import cache as cache_ops
from cachemgr.procedures import kinds
from cachemgr.procedures.kinds import bcache as kinds_bcache
from tests.unit.tui_helpers import copy_capture, kernel_writes

CSET = "11111111-2222-3333-4444-555555555555"


def unreg(name: str, kind: str, state: str | None) -> UnregisteredBcache:
    ident = Identity(name=name, node=f"/dev/{name}", devno="8:0", size_bytes=1 << 30,
                     serial=None, wwn=None, by_id=(), by_path=None, model=None)
    return UnregisteredBcache(identity=ident, kind=kind, uuid=f"uuid-{name}", cset_uuid=CSET,
                              sb_state=state, sb_mode="writeback")


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Sysfs, list[str]]:
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(tmp_path / "state"))
    sysfs = Sysfs(str(copy_capture(tmp_path, "bcache-unattached")))
    done: list[str] = []

    def register(sysfs: Sysfs, node: str) -> object:
        done.append(node)
        return cache_ops.bcache.Change(node, "register", None, "registered")

    monkeypatch.setattr(cache_ops.bcache, "register", register)
    monkeypatch.setattr(kinds_bcache, "REGISTER_WAIT", 0.0)
    return sysfs, done


def with_unregistered(monkeypatch: pytest.MonkeyPatch, *us: UnregisteredBcache) -> None:
    real = snapshot.take

    def take(sysfs: Sysfs, **kw: object) -> Snapshot:
        return dataclasses.replace(real(sysfs, **kw), unregistered=us)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshot, "take", take)


def test_the_ssd_is_registered_first_whatever_the_order(host: tuple[Sysfs, list[str]],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, done = host
    with_unregistered(monkeypatch, unreg("sdx", "backing", "dirty"), unreg("sdy", "cache", None))
    res = cache_ops.register(sysfs, ["/dev/sdx", "/dev/sdy"])
    assert done == ["/dev/sdy", "/dev/sdx"]
    assert [c.target for c in res.changes] == ["/dev/sdy", "/dev/sdx"]


def test_dirty_data_on_an_ssd_not_named_is_refused_naming_it(
        host: tuple[Sysfs, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, done = host
    with_unregistered(monkeypatch, unreg("sdx", "backing", "dirty"), unreg("sdy", "cache", None))
    with pytest.raises(UnsafeError, match="present but was not named") as ei:
        cache_ops.register(sysfs, ["/dev/sdx"])
    assert ei.value.hint == "register them together, the SSD first: cachemgr register " \
                            "/dev/sdy /dev/sdx"
    assert done == []


def test_dirty_data_on_an_absent_ssd_is_refused(host: tuple[Sysfs, list[str]],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, done = host
    with_unregistered(monkeypatch, unreg("sdx", "backing", "dirty"))
    with pytest.raises(UnsafeError, match="whose SSD is absent"):
        cache_ops.register(sysfs, ["/dev/sdx"])
    assert done == []


def test_a_clean_backing_device_is_registered_alone(host: tuple[Sysfs, list[str]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, done = host
    with_unregistered(monkeypatch, unreg("sdx", "backing", "clean"))
    cache_ops.register(sysfs, ["/dev/sdx"])
    assert done == ["/dev/sdx"]


def test_each_disk_is_asked_of_the_kind_that_registers_it(
        host: tuple[Sysfs, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """register decides nothing by role itself: the kind that registers a disk's role says
    what stands against it (Kind.register_refusal) and what to wait for once it is done
    (Kind.wait_registered); the caches are registered first (not ``cached_device``)."""
    sysfs, done = host
    with_unregistered(monkeypatch, unreg("sdx", "backing", "clean"), unreg("sdy", "cache", None))
    waited: list[str] = []
    for k in (kinds.Bcache, kinds.BcacheSet):
        monkeypatch.setattr(k, "wait_registered", classmethod(
            lambda cls, sysfs, u: waited.append(f"{cls.name} {u.identity.node}")))
    cache_ops.register(sysfs, ["/dev/sdx", "/dev/sdy"])
    assert done == ["/dev/sdy", "/dev/sdx"]
    assert waited == ["bcache-set /dev/sdy", "bcache /dev/sdx"]
    done.clear()
    monkeypatch.setattr(kinds.BcacheSet, "register_refusal", classmethod(
        lambda cls, snap, named, u, batch: UnsafeError(f"{named}: not now ({len(batch)})")))
    with pytest.raises(UnsafeError, match=r"^/dev/sdy: not now \(2\)$"):
        cache_ops.register(sysfs, ["/dev/sdx", "/dev/sdy"])
    assert done == []


def test_registered_ones_are_already_so_and_others_usage_errors(
        host: tuple[Sysfs, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    sysfs, done = host
    with_unregistered(monkeypatch)
    snap = snapshot.take(sysfs)
    ssd = snap.cache_sets[0].caches[0].identity.node
    res = cache_ops.register(sysfs, [snap.cache_sets[0].uuid])
    assert res.already and not res.changes
    res = cache_ops.register(sysfs, [ssd])
    assert res.already
    with pytest.raises(UsageError, match="carries no bcache superblock"):
        cache_ops.register(sysfs, ["/dev/cachemgr-no-such-disk"])
    with pytest.raises(UsageError, match="at least one DEV"):
        cache_ops.register(sysfs, [])
    assert done == []


def test_json_claims_no_loss_while_the_ssd_is_on_the_host(tmp_path: Path) -> None:
    """issue #31: a transient SSD fault made bcache stop the set; the SSD read again and was
    registered: the JSON said dirty_data_lost_with_cache true although all of it came back."""
    snap = snapshot.take(Sysfs(str(copy_capture(tmp_path, "bcache-unattached"))))
    dirty, ssd = unreg("sdx", "backing", "dirty"), unreg("sdy", "cache", None)
    both = snapshot.to_json(dataclasses.replace(snap, unregistered=(dirty, ssd)))
    (entry,) = [u for u in both["unregistered"] if u["device"] == "/dev/sdx"]
    assert entry["dirty_data"] is True and entry["cache_ssd_present"] is True
    assert entry["cache_registered"] is False and entry["dirty_data_lost_with_cache"] is False
    alone = snapshot.to_json(dataclasses.replace(snap, unregistered=(dirty,)))
    (entry,) = alone["unregistered"]
    assert entry["cache_ssd_present"] is False and entry["dirty_data_lost_with_cache"] is True
    registered = dataclasses.replace(dirty, cset_uuid=snap.cache_sets[0].uuid)
    doc = snapshot.to_json(dataclasses.replace(snap, unregistered=(registered,)))
    (entry,) = doc["unregistered"]
    assert entry["cache_registered"] is True and entry["dirty_data_lost_with_cache"] is False


def test_a_cache_set_holding_a_stopped_devices_dirt_is_not_removed(
        host: tuple[Sysfs, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """remove of a cache set asks its kind (kinds.BcacheSet.remove): a backing device bcache
    stopped with its dirty data on this SSD is seen only on its superblock, and refuses the
    unregister (the lab's proof: tests/kernel/test_orphaned_dirt_kernel.py)."""
    sysfs, _ = host
    cset = snapshot.take(sysfs).cache_sets[0].uuid
    stopped = dataclasses.replace(unreg("sdx", "backing", "dirty"), cset_uuid=cset)
    with_unregistered(monkeypatch, stopped)
    writes = kernel_writes(monkeypatch)
    with pytest.raises(UnsafeError) as ei:
        cache_ops.remove(sysfs, cset)
    assert ei.value.message.startswith(
        f"cache set {cset} holds dirty data of /dev/sdx, which bcache stopped")
    assert "unregistering the cache set would lose it" in ei.value.message
    assert "then run remove again" in str(ei.value.hint)
    assert writes == []
