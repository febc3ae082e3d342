"""The detail of one device: identities, every tunable, stats per interval, errors, and the
backing devices of a set. Re-rendered from each new snapshot while it is open."""

from __future__ import annotations

import time
from collections.abc import Sequence
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

from cachemgr.core.model import GoneBacking, Size, Snapshot, human
from cachemgr.core.text import printable
from cachemgr.ops import cache as cache_ops
from cachemgr.ops import vms as vm_ops
from cachemgr.ops.health import Finding, Level
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


def section(sec: Any) -> RenderableType:
    """One section of a kind's detail (kinds' ``Section``: pairs, a table or a remark)."""
    if sec.note:
        return literal(sec.note, style="yellow")
    if not sec.columns:
        return kv(sec.title, list(sec.pairs))
    t = Table(title=literal(sec.title), title_justify="left", title_style="bold", box=None,
              padding=(0, 1))
    for i, c in enumerate(sec.columns):
        t.add_column(c, justify="right" if sec.numbers and i else "left")
    for row in sec.rows:
        t.add_row(*(literal(_v(c)) for c in row))
    return t


def vm_detail(node: str | None, snap: Snapshot) -> list[RenderableType]:
    """The VM disks this cached device serves, their cache modes, the VM's IO pressure and
    the warnings (cachemgr vms says the same)."""
    if snap.vms is None or node is None:
        return []
    pairs: list[tuple[str, object]] = []
    for v, d in vm_ops.serving(snap.vms, node):
        c = next((c for c in v.cache_io if c.cache == node), None)
        hits = ""
        if c is not None and c.why is None and c.read_bytes:
            hits = (f", read hit ratio {vm_ops.hit_text(c)} (the slow disk served "
                    f"{human(c.slow_read_bytes)} of {human(c.read_bytes)})")
        elif c is not None and c.why is not None and v.cgroup is not None:
            hits = f", read hit ratio unknown: {c.why}"
        pairs.append((printable(f"{v.name} {d.target}"),  # one line in its cell
                      f"cache={d.cache}, {v.state}, IO pressure % "
                      f"{vm_ops.pressure_text(v.pressure)}{hits}"))
        pairs += [("  !", w) for w in d.warnings]
    pairs += [("  noisy", n.text) for n in snap.vms.noisy if n.cache == node]
    if not pairs:
        if snap.vms.warnings and not snap.vms.vms:
            return []  # libvirt not there (or not reachable): nothing to say per cache
        pairs = [("(none)", "no libvirt domain's disk is here")]
    return [kv("VMs on this cache", pairs)]


def health_detail(cache: str | None, health: list[tuple[Any, Any]] | None
                  ) -> list[RenderableType]:
    """The SMART health of the SSDs under ``cache`` (as its kind names it: cache_ops.
    ssd_health, read in a worker: smartctl runs at most every 10 min per disk)."""
    if not health:
        return []
    pairs: list[tuple[str, object]] = [(ssd.node, h.words() if h is not None else "not read")
                                       for ssd, h in health if cache in ssd.caches]
    return [kv("cache SSD health (SMART)", pairs)] if pairs else []


def owner_detail(snap: Snapshot, obj: object) -> list[RenderableType]:
    """Who holds the device now (a drain, a replace-ssd run...), or the interrupted run
    that owns it and what to do about it: first, above everything else."""
    o = cache_ops.owner_of(snap, obj)
    if o is None:
        return []
    return [literal(view.owner_line(o), style="bold yellow" if o.running else "bold red")]


def findings_detail(snap: Snapshot, key: str, findings: Sequence[Finding]
                    ) -> list[RenderableType]:
    """The health model's findings about this device (what cachemgr check and status say),
    each with its next command: right under its owner."""
    row = next((r for r in view.rows(snap) if r.key == key), None)
    about = view.about(snap, row, findings) if row is not None else []
    return [literal(view.finding_line(f), style="bold red" if f.level == Level.CRITICAL
                    else "bold yellow") for f in about]


def causes_detail(snap: Snapshot, key: str, causes: Sequence[Finding]
                  ) -> list[RenderableType]:
    """Why this device's cache does not help: ``cachemgr doctor``'s causes over the app's
    polls (ops.doctor.Watch, the same diagnosis), each with the command that fixes it."""
    row = next((r for r in view.rows(snap) if r.key == key), None)
    about = view.about(snap, row, causes) if row is not None else []
    return [literal(f"not helping: {f.code}: {f.what}; next: {f.next}", style="yellow")
            for f in about]


def gone_detail(snap: Snapshot, key: str, g: GoneBacking,
                findings: Sequence[Finding]) -> RenderableType:
    """A bcache backing device gone while dirty (no device, no kind: nothing to act on):
    its finding with the next command first, then what ``check`` remembered of it."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(g.seen_at))
    c = snap.cache_set(g.cset_uuid)
    ssd = ",".join(x.identity.node for x in c.caches) if c is not None else None
    parts: list[RenderableType] = findings_detail(snap, key, findings) or [
        literal(f"{g.node}: gone while dirty", style="bold red")]
    parts.append(kv(f"{g.node}: gone", [
        ("backing device", g.node), ("bcache device", g.device),
        ("cache set", g.cset_uuid + ("" if c is not None else " (not registered now)")),
        ("its SSD", ssd), ("dirty when last seen", human(g.dirty_bytes)
                           if g.dirty_bytes is not None else None),
        ("last seen dirty", f"{when} (cachemgr check remembers it)"), ("UUID", g.uuid)]))
    parts.append(literal("Its dirty data is only on the cache set's SSD: do not unregister, "
                         "wipe or replace that SSD until it is back and clean.",
                         style="yellow"))
    spaced: list[RenderableType] = []
    for p in parts:
        spaced += [p, Text("")]
    return Group(*spaced)


def left_detail(snap: Snapshot, key: str, left: Sequence[view.Left]) -> list[RenderableType]:
    """The "a VM left" marks of this device (procedures/coherence.py), with the command that
    clears them (``i`` here): what status and ``vms`` say."""
    row = next((r for r in view.rows(snap) if r.key == key), None)
    marks = view.left_of(snap, row, left) if row is not None else []
    return [literal(f"{words} (i: invalidate)", style="bold yellow") for _, _, words in marks]


def render(snap: Snapshot, key: str,
           health: list[tuple[Any, Any]] | None = None,
           findings: Sequence[Finding] = (),
           left: Sequence[view.Left] = (),
           causes: Sequence[Finding] = ()) -> RenderableType:
    obj = view.find(snap, key)
    if isinstance(obj, GoneBacking):
        return gone_detail(snap, key, obj, findings)
    k = cache_ops.kind_of(obj) if obj is not None else None
    if obj is None or k is None:
        return literal(f"{key} is gone (removed or unplugged since it was selected)",
                       style="bold red")
    # who owns it, what is wrong, which VMs it serves: first, where a glance finds them
    parts = owner_detail(snap, obj) + findings_detail(snap, key, findings)
    parts += left_detail(snap, key, left) + causes_detail(snap, key, causes)
    parts += vm_detail(k.vm_node, snap) + [section(sec) for sec in k.detail(snap)]
    parts += health_detail(k.health_cache, health)
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
        shown = self.query("#detail")
        if not shown:  # pushed, not composed yet: on_mount shows the snapshot
            return
        shown.first(Static).update(render(snap, self.key, self.health, self._findings(),
                                          self._left(), self._causes()))
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
            self.query_one("#detail", Static).update(render(snap, self.key, health,
                                                            self._findings(), self._left(),
                                                            self._causes()))

    def _findings(self) -> list[Finding]:
        return list(getattr(self.app, "findings", []))

    def _causes(self) -> list[Finding]:
        return list(getattr(self.app, "causes", []))

    def _left(self) -> list[view.Left]:
        return list(getattr(self.app, "left", []))
