"""The detail of one device: identities, every tunable, stats per interval, errors, and the
backing devices of a set. Re-rendered from each new snapshot while it is open."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from cachemgr.core.model import (
    BcacheBacking,
    CacheSet,
    DmCacheDevice,
    DmWritecacheDevice,
    Identity,
    Size,
    Snapshot,
    Stats,
    human,
)
from cachemgr.core.text import printable
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import vms as vm_ops
from tui import view
from tui.safe import literal


def _v(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, Size):
        return human(x.low) if x.is_exact else f"{human(x.low)} (≤ {human(x.high)})"
    if isinstance(x, bool):
        return "yes" if x else "no"
    return str(x)


def kv(title: str, pairs: list[tuple[str, object]]) -> Table:
    t = Table(title=literal(title, style="bold"), title_justify="left", show_header=False,
              box=None, padding=(0, 1), expand=False)
    t.add_column(style="cyan", no_wrap=True)
    t.add_column(overflow="fold")
    for k, v in pairs:
        t.add_row(literal(k), literal(_v(v)))  # keys too: a VM's name is the owner's text
    return t


def identity_table(title: str, i: Identity) -> Table:
    return kv(title, [
        ("node", i.node), ("kernel name", i.name), ("devno", i.devno),
        ("size", human(i.size_bytes) if i.size_bytes is not None else None),
        ("by-id", "\n".join(i.by_id) or None), ("by-path", i.by_path),
        ("serial", i.serial), ("WWN", i.wwn), ("vendor/model",
                                                " ".join(x for x in (i.vendor, i.model) if x)
                                                or None),
        ("rotational", i.rotational), ("fs type", i.fs_type), ("fs UUID", i.fs_uuid),
    ])


def stats_table(stats: dict[str, Stats]) -> Table:
    t = Table(title="stats per interval", title_justify="left", title_style="bold",
              box=None, padding=(0, 1))
    for c in ("interval", "hits", "misses", "hit%", "bypassed", "byp hits", "byp miss",
              "collisions"):
        t.add_column(c, justify="left" if c == "interval" else "right")
    for name in ("five_minute", "hour", "day", "total"):
        s = stats.get(name)
        if s is None:
            continue
        r = s.computed_hit_ratio
        t.add_row(*(literal(c) for c in (
            name, _v(s.hits), _v(s.misses), "-" if r is None else f"{100 * r:.1f}",
            _v(s.bypassed), _v(s.bypass_hits), _v(s.bypass_misses), _v(s.miss_collisions))))
    return t


def backing_detail(b: BcacheBacking, snap: Snapshot) -> list[RenderableType]:
    cset = snap.cache_set(b.cset_uuid) if b.cset_uuid else None
    out: list[RenderableType] = [
        kv(f"bcache device {b.device or '(stopped)'}", [
            ("device", b.device), ("backing UUID", b.uuid),
            ("by-uuid", f"/dev/bcache/by-uuid/{b.uuid}" if b.uuid else None),
            ("label", b.label or None), ("cache set", b.cset_uuid or "none"),
            ("cache device", ", ".join(c.identity.node for c in cset.caches) if cset else None),
            ("mode", b.mode), ("state", b.state), ("dirty", view.dirty_text(b)),
            ("running", b.running),
        ]),
        identity_table("backing device", b.identity),
        kv("tunables", [
            ("writeback_percent", b.writeback_percent), ("writeback_delay", b.writeback_delay),
            ("writeback_running", b.writeback_running),
            ("writeback_rate_minimum", b.writeback_rate_minimum),
            ("writeback_rate", f"{_v(b.writeback_rate)}/s" if b.writeback_rate else None),
            ("sequential_cutoff", b.sequential_cutoff),
            ("stop_when_cache_set_failed", b.stop_when_cache_set_failed),
        ]),
        stats_table(b.stats),
        kv("errors", [("io_errors", b.io_errors), ("io_error_limit", b.io_error_limit)]),
    ]
    if b.rate_debug:
        d = b.rate_debug
        out.append(kv("writeback_rate_debug", [
            ("rate", d.rate), ("dirty", d.dirty), ("target", d.target),
            ("proportional", d.proportional), ("integral", d.integral), ("change", d.change),
            ("next io", f"{d.next_io_ms} ms" if d.next_io_ms is not None else None)]))
    return out


def cset_detail(c: CacheSet, snap: Snapshot) -> list[RenderableType]:
    out: list[RenderableType] = [kv(f"cache set {c.uuid}", [
        ("backing devices", ", ".join(f"/dev/{n}" for n in c.backing_names) or "none"),
        ("flash volumes", c.flash_volumes),
        ("cache used", None if c.cache_available_percent is None
         else f"{100 - c.cache_available_percent}% ({c.cache_available_percent}% available)"),
        ("dirty (at last GC)", c.dirty), ("block size", c.block_size),
        ("bucket size", c.bucket_size), ("congested", c.congested),
        ("congested_read_threshold_us", c.congested_read_threshold_us),
        ("congested_write_threshold_us", c.congested_write_threshold_us),
        ("errors", c.errors), ("io_error_limit", c.io_error_limit),
        ("io_error_halflife", c.io_error_halflife),
    ])]
    for x in c.caches:
        out.append(identity_table(f"cache device {x.identity.node}", x.identity))
        out.append(kv("cache device", [
            ("io_errors", x.io_errors), ("buckets", x.nbuckets), ("bucket size", x.bucket_size),
            ("block size", x.block_size), ("replacement", x.replacement_policy),
            ("written", x.written)]))
    out.append(stats_table(c.stats))
    members = [b for b in snap.backings if b.cset_uuid == c.uuid]
    if members:
        t = Table(title="backing devices", title_justify="left", title_style="bold",
                  box=None, padding=(0, 1))
        for col in ("device", "backing", "mode", "state", "dirty"):
            t.add_column(col)
        for b in members:
            t.add_row(*(literal(c) for c in (b.device or "-", b.identity.node, _v(b.mode),
                                             b.state.value, view.dirty_text(b))))
        out.append(t)
    return out


def dm_detail(d: DmCacheDevice) -> list[RenderableType]:
    st = d.status
    out: list[RenderableType] = [kv(f"dm-cache {d.node}", [
        ("dm name", d.name), ("kernel name", d.kernel_name), ("devno", d.devno),
        ("dm UUID", d.uuid), ("owned by LVM", d.lvm_owned), ("mode", d.mode),
        ("state", d.state), ("dirty", human(d.dirty_bytes) if d.dirty_bytes is not None
                             else "unknown"),
        ("block size", human(d.block_bytes)), ("open count", d.open_count),
        ("suspended", d.suspended), ("holders", ", ".join(d.holders) or None),
        ("failure", d.failure), ("table", d.table.line()),
    ])]
    if st:
        out.append(kv("status", [
            ("used", f"{st.used}/{st.total} blocks"),
            ("dirty", f"{st.dirty} blocks"),
            ("metadata", f"{st.metadata_used}/{st.metadata_total} blocks"),
            ("read hits/misses", f"{st.read_hits}/{st.read_misses}"),
            ("write hits/misses", f"{st.write_hits}/{st.write_misses}"),
            ("hit ratio (total)", None if st.hit_ratio is None else f"{100 * st.hit_ratio:.1f}%"),
            ("promotions/demotions", f"{st.promotions}/{st.demotions}"),
            ("policy", f"{st.policy} {' '.join(st.policy_args)}".strip()),
            ("migration_threshold", st.migration_threshold),
            ("features", " ".join(st.features)), ("metadata mode", st.metadata_mode),
            ("needs_check", st.needs_check)]))
    for title, ident in (("origin", d.origin), ("cache device", d.cache),
                         ("metadata device", d.metadata)):
        if ident is not None:
            out.append(identity_table(title, ident))
    out += lvm_detail(d)
    return out


def lvm_detail(d: DmCacheDevice | DmWritecacheDevice) -> list[RenderableType]:
    """What lvm2 says of an LVM-owned cache (cachemgr changes it through lvm2)."""
    v = d.lvm
    if v is None:
        if d.lvm_owned:
            return [Text("owned by LVM, but lvs did not describe it (see cachemgr status's "
                         "warnings)", style="yellow")]
        return []
    return [kv(f"LVM {v.kind} {v.full_name}", [
        ("cache", f"{v.vg}/{v.pool_name} ({v.pool_kind})"), ("segment type", v.segtype),
        ("origin PVs", ", ".join(v.origin_pvs) or None),
        ("cache PVs", ", ".join(v.cache_pvs) or None),
        ("mode (lvm2)", v.cache_mode), ("policy (lvm2)", v.policy),
        ("settings", ",".join(f"{k}={x}" for k, x in v.settings) or None),
        ("chunk/block size", human(v.chunk_bytes) if v.chunk_bytes else None),
        ("health", v.health or "ok"), ("check needed", v.check_needed)])]


def wc_detail(d: DmWritecacheDevice) -> list[RenderableType]:
    st = d.status
    out: list[RenderableType] = [kv(f"dm-writecache {d.node}", [
        ("dm name", d.name), ("kernel name", d.kernel_name), ("devno", d.devno),
        ("dm UUID", d.uuid), ("owned by LVM", d.lvm_owned), ("state", d.state),
        ("dirty", human(d.dirty_bytes) if d.dirty_bytes is not None else "unknown"),
        ("block size", human(d.table.block_bytes)), ("open count", d.open_count),
        ("suspended", d.suspended), ("holders", ", ".join(d.holders) or None),
        ("failure", d.failure), ("table", d.table.line()),
    ])]
    if st:
        out.append(kv("status", [
            ("error", st.error), ("blocks", st.total), ("free", st.free),
            ("dirty", f"{st.dirty} blocks"), ("under writeback", st.writeback),
            ("watermarks", f"high {d.table.settings().get('high_watermark', '50')}, "
                           f"low {d.table.settings().get('low_watermark', '45')}")]))
    for title, ident in (("origin", d.origin), ("cache device", d.cache)):
        if ident is not None:
            out.append(identity_table(title, ident))
    return out + lvm_detail(d)


def vm_detail(node: str | None, snap: Snapshot) -> list[RenderableType]:
    """The VM disks this cached device serves, their cache modes, the VM's IO pressure and
    the warnings (cachemgr vms says the same)."""
    if snap.vms is None or node is None:
        return []
    pairs: list[tuple[str, object]] = []
    for v, d in vm_ops.serving(snap.vms, node):
        pairs.append((printable(f"{v.name} {d.target}"),  # one line in its cell
                      f"cache={d.cache}, {v.state}, IO pressure % "
                      f"{vm_ops.pressure_text(v.pressure)}"))
        pairs += [("  !", w) for w in d.warnings]
    if not pairs:
        if snap.vms.warnings and not snap.vms.vms:
            return []  # libvirt not there (or not reachable): nothing to say per cache
        pairs = [("(none)", "no libvirt domain's disk is here")]
    return [kv("VMs on this cache", pairs)]


def health_detail(obj: object, health: list[tuple[Any, Any]] | None) -> list[RenderableType]:
    """The SMART health of the SSDs under this cache (cache_ops.ssd_health, read in a worker:
    smartctl runs at most every 10 min per disk)."""
    if not health:
        return []
    if isinstance(obj, CacheSet):
        cache: str | None = obj.uuid
    elif isinstance(obj, BcacheBacking):
        cache = obj.cset_uuid
    else:
        cache = getattr(obj, "node", None)
    pairs: list[tuple[str, object]] = [(ssd.node, h.words() if h is not None else "not read")
                                       for ssd, h in health if cache in ssd.caches]
    return [kv("cache SSD health (SMART)", pairs)] if pairs else []


def render(snap: Snapshot, key: str,
           health: list[tuple[Any, Any]] | None = None) -> RenderableType:
    obj = view.find(snap, key)
    if obj is None:
        return literal(f"{key} is gone (removed or unplugged since it was selected)",
                       style="bold red")
    if isinstance(obj, BcacheBacking):
        parts = backing_detail(obj, snap) + vm_detail(obj.device, snap)
    elif isinstance(obj, CacheSet):
        parts = cset_detail(obj, snap)
    elif isinstance(obj, DmWritecacheDevice):
        parts = wc_detail(obj) + vm_detail(obj.node, snap)
    else:
        parts = dm_detail(obj) + vm_detail(obj.node, snap)
    parts += health_detail(obj, health)
    spaced: list[RenderableType] = []
    for p in parts:
        spaced += [p, Text("")]
    return Group(*spaced)


class DetailScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [("escape", "app.pop_screen", "Back")]

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.health: list[tuple[Any, Any]] | None = None
        self._health_at = -1e9

    def compose(self) -> ComposeResult:
        yield Header(icon="≡")
        with VerticalScroll(id="detail-scroll"):
            yield Static("", id="detail")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        snap = self.app.snap  # type: ignore[attr-defined]
        if snap is not None:
            self.show(snap)
        self.query_one("#detail-scroll").focus()

    def show(self, snap: Snapshot) -> None:
        self.query_one("#detail", Static).update(render(snap, self.key, self.health))
        if time.monotonic() - self._health_at >= 60:  # the lookup itself is cached
            self._health_at = time.monotonic()
            self.read_health(snap)

    @work(thread=True, exclusive=True, exit_on_error=False, group="health")
    def read_health(self, snap: Snapshot) -> None:
        health = cache_ops.ssd_health(self.app.sysfs, snap)  # type: ignore[attr-defined]
        self.app.call_from_thread(self._got_health, snap, health)

    def _got_health(self, snap: Snapshot, health: list[tuple[Any, Any]]) -> None:
        self.health = health
        if health:
            self.query_one("#detail", Static).update(render(snap, self.key, health))
