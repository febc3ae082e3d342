"""The lock keys of the cache objects: one spelling each, shared by the cache kinds (which
name their objects' keys, cachemgr/procedures/kinds/), the gate that takes them
(cachemgr/ops/gate.py) and cachemgr/procedures/owners.py (which reads the procedures'
journals for the keys they claim).

* a bcache backing device: its bcache UUID (or kernel name) (:func:`bcache_key`);
* a cache set, a dm-cache device's or an LVM cache's whole cache, as replace-ssd holds it:
  ``replace-<cset UUID | dm name | VG/LV>`` (:func:`cache_key`);
* a dm-cache device: ``dmcache-<name>`` (:func:`dmcache_key`);
* an LVM cached LV: ``lvm-<VG/LV>`` (:func:`lvm_key`).
"""

from __future__ import annotations


def bcache_key(uuid_or_name: str) -> str:
    return uuid_or_name


def cache_key(cache: str) -> str:
    return f"replace-{cache}"


def dmcache_key(name: str) -> str:
    return f"dmcache-{name}"


def lvm_key(vg_lv: str) -> str:
    return f"lvm-{vg_lv}"
