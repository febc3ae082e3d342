"""The objects a replace-ssd run owns (procedures/owners.py ``replace_keys``): its cache's
key and what its kind's module declares (procedures/replace/, ``Kind.run_keys``), the same
keys for each kind as when owners.py spelled every kind out."""

from __future__ import annotations

import pytest

from cachemgr.procedures import keys, owners


@pytest.mark.parametrize("kind,cache,backings,lvs,want", [
    ("bcache", "cset-1", ({"uuid": "u1", "name": "sdb"}, {"uuid": None, "name": "sdc"}), (),
     {keys.cache_key("cset-1"), keys.bcache_key("u1"), keys.bcache_key("sdc")}),
    ("dmcache", "vc", (), (), {keys.cache_key("vc"), keys.dmcache_key("vc")}),
    ("lvm", "vg0/vm1", (), ("vg0/vm2",),
     {keys.cache_key("vg0/vm1"), keys.lvm_key("vg0/vm1"), keys.lvm_key("vg0/vm2")}),
])
def test_a_run_owns_its_cache_and_what_its_kind_declares(
        kind: str, cache: str, backings: tuple[dict[str, str | None], ...],
        lvs: tuple[str, ...], want: set[str]) -> None:
    assert owners.replace_keys(kind, cache, backings, lvs) == frozenset(want)
