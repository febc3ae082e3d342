"""lvs's report -> :class:`~cachemgr.core.model.LvmCachedLv` for every cached LV.

One row per LV segment (``lvs -a`` with segment fields): a cached LV has one ``cache`` or
``writecache`` segment whose ``origin`` is the hidden ``[LV_corig]``/``[LV_wcorig]`` and whose
``pool_lv`` is the cache pool ``[POOL_cpool]`` or cachevol ``[FAST_cvol]``. The PVs under each
part are found by following ``devices`` (``/dev/sdb(0)``: a PV; ``vm1_corig(0)``: another LV of
the VG) down to the PVs; a cache pool adds its ``metadata_devices``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cachemgr.core.model import LvmCachedLv


def _s(row: dict[str, Any], key: str) -> str:
    v = row.get(key, "")
    return v if isinstance(v, str) else ""


def bare(name: str) -> str:
    """``[pool_cpool]`` -> ``pool_cpool`` (lvs brackets hidden LVs)."""
    return name[1:-1] if name.startswith("[") and name.endswith("]") else name


def attached_name(pool: str) -> str:
    """The name an attached cache pool (``pool_cpool``) or cachevol (``fast_cvol``) had
    before it was attached, and gets back when it is split off."""
    for suffix in ("_cpool", "_cvol"):
        if pool.endswith(suffix):
            return pool[:-len(suffix)]
    return pool


def _entries(field: str) -> list[str]:
    """``/dev/sdb(0),vm1_corig(12)`` -> [``/dev/sdb``, ``vm1_corig``]."""
    out = []
    for part in field.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, _ = part.rpartition("(") if part.endswith(")") else (part, "", "")
        out.append(bare(name or part))
    return out


def _settings(text: str) -> tuple[tuple[str, str], ...]:
    out = []
    for kv in text.replace(" ", ",").split(","):
        k, sep, v = kv.partition("=")
        if sep and k:
            out.append((k, v))
    return tuple(out)


def _int(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) < 20 else None


class _Vg:
    def __init__(self, rows: Iterable[dict[str, Any]]) -> None:
        self.rows: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            self.rows.setdefault(bare(_s(r, "lv_name")), []).append(r)

    def pvs(self, lv: str, seen: frozenset[str] = frozenset()) -> list[str]:
        if lv in seen:
            return []
        out: list[str] = []
        for r in self.rows.get(lv, []):
            for e in _entries(_s(r, "devices")) + _entries(_s(r, "metadata_devices")):
                for pv in ([e] if e.startswith("/") else self.pvs(e, seen | {lv})):
                    if pv not in out:
                        out.append(pv)
            for sub in (_s(r, "data_lv"), _s(r, "metadata_lv")):
                if sub:
                    for pv in self.pvs(bare(sub), seen | {lv}):
                        if pv not in out:
                            out.append(pv)
        return out


def cached_lvs(rows: list[dict[str, Any]]) -> dict[str, LvmCachedLv]:
    """dm path (``/dev/mapper/vg0-vm1``) -> the cached LV, for every cache/writecache LV."""
    by_vg: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_vg.setdefault(_s(r, "vg_name"), []).append(r)
    out: dict[str, LvmCachedLv] = {}
    for vg, vrows in by_vg.items():
        v = _Vg(vrows)
        for r in vrows:
            seg = _s(r, "segtype")
            if seg not in ("cache", "writecache"):
                continue
            lv = bare(_s(r, "lv_name"))
            pool = bare(_s(r, "pool_lv"))
            pool_layout = _s(v.rows.get(pool, [{}])[0], "lv_layout")
            origin = bare(_s(r, "origin"))
            out[_s(r, "lv_dm_path")] = LvmCachedLv(
                vg=vg, lv=lv, uuid=_s(r, "lv_uuid"), segtype=seg, pool=pool,
                pool_kind="cachevol" if "cachevol" in pool_layout or pool.endswith("_cvol")
                else "cachepool",
                origin_pvs=tuple(v.pvs(origin)) if origin else (),
                cache_pvs=tuple(v.pvs(pool)) if pool else (),
                cache_mode=_s(r, "cache_mode") or None,
                policy=_s(r, "cache_policy") or None,
                settings=_settings(_s(r, "cache_settings")),
                chunk_bytes=_int(_s(r, "chunk_size")) or _int(_s(r, "writecache_block_size")),
                health=_s(r, "lv_health_status"),
                check_needed=_s(r, "lv_check_needed") in ("check needed", "1"),
            )
    return out


def lv_rows(rows: list[dict[str, Any]], vg: str, lv: str) -> list[dict[str, Any]]:
    return [r for r in rows if _s(r, "vg_name") == vg and bare(_s(r, "lv_name")) == lv]


def field(rows: list[dict[str, Any]], vg: str, lv: str, name: str) -> str:
    """Field ``name`` of ``vg/lv``'s first row (``lv_layout``: "linear", "cache,pool", ...);
    "" when there is no such LV."""
    rs = lv_rows(rows, vg, lv)
    return _s(rs[0], name) if rs else ""


def lvs_on(rows: list[dict[str, Any]], vg: str, pv: str) -> list[str]:
    """The LVs of ``vg`` (hidden ones too, bare names) with a segment directly on PV ``pv``."""
    out: list[str] = []
    for r in rows:
        if _s(r, "vg_name") != vg:
            continue
        if pv in _entries(_s(r, "devices")) + _entries(_s(r, "metadata_devices")):
            name = bare(_s(r, "lv_name"))
            if name not in out:
                out.append(name)
    return out


def attached_to(rows: list[dict[str, Any]], vg: str, cache: str) -> str | None:
    """The LV of ``vg`` that cache pool or cachevol ``cache`` (its own name) caches now."""
    for r in rows:
        if _s(r, "vg_name") == vg and _s(r, "segtype") in ("cache", "writecache") \
                and attached_name(bare(_s(r, "pool_lv"))) == cache:
            return bare(_s(r, "lv_name"))
    return None


def partial(rows: list[dict[str, Any]], vg: str, lv: str) -> bool:
    """lvm2 marks an LV with a PV missing under it partial (``lv_attr`` character 9 ``p``)."""
    attr = field(rows, vg, lv, "lv_attr")
    return len(attr) > 8 and attr[8] == "p"


def size(rows: list[dict[str, Any]], vg: str, lv: str) -> int | None:
    """``vg/lv``'s size in bytes (the report is read with ``--units b``)."""
    return _int(field(rows, vg, lv, "lv_size"))


def pvs_of(rows: list[dict[str, Any]], vg: str, lv: str) -> list[str]:
    """The PVs under ``vg/lv`` (through its hidden sub-LVs)."""
    return _Vg([r for r in rows if _s(r, "vg_name") == vg]).pvs(lv)


def lv_names(rows: list[dict[str, Any]], vg: str, segtype: str) -> list[str]:
    """The LVs of ``vg`` (bare names) with a segment of type ``segtype``."""
    return sorted({bare(_s(r, "lv_name")) for r in rows
                   if _s(r, "vg_name") == vg and _s(r, "segtype") == segtype})
