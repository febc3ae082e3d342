"""Replace the cache SSD of a set: the plan, each step's progress, the operator's swap
prompt, resume and rollback of interrupted runs (cachemgr/procedures/replace.py does the work)."""

from __future__ import annotations

from typing import Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Label, RichLog, Static

from cachemgr.core.errors import CacheMgrError
from cachemgr.ops import replace
from cachemgr.ops.control import Control, Result
from tui.dialogs import when
from tui.dialogs.choose import ChoiceDialog
from tui.dialogs.confirm import ConfirmDialog
from tui.safe import literal


class SwapPrompt(ConfirmDialog):
    """replace.py's prompt callback: the operator swaps the disk, then confirms."""

    def __init__(self, text: str) -> None:
        super().__init__("Physical swap", text, [("done", "Done: the disk is in", "primary")])


def step_lines(done: list[str], current: str | None, failed: str | None,
               steps: tuple[tuple[str, str], ...] = replace.STEPS) -> str:
    out = []
    for i, (name, _) in enumerate(steps, 1):
        if name in done:
            mark = "✓"
        elif name == failed:
            mark = "✗"
        elif name == current:
            mark = "▶"
        else:
            mark = "·"
        out.append(f"{mark} {i:2d} {name}")
    return "\n".join(out)


class ReplaceScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "plan", "Plan"),
        Binding("g", "start", "Start"),
        Binding("r", "resume", "Resume"),
        Binding("u", "rollback", "Rollback"),
        Binding("c", "cancel", "Cancel"),
        Binding("escape", "app.pop_screen", "Back"),
    ]

    # the keys act on the screen; Tab reaches the two inputs
    AUTO_FOCUS = "#oplog"

    def __init__(self, cset: str, steps: tuple[tuple[str, str], ...] | None = None) -> None:
        super().__init__()
        self.cset = cset  # a cache set's UUID, a cached LV's VG/LV, a dm-cache device's name
        self.steps = steps or replace.steps_for(cset)
        # LVM and dm-cache caches drain through the cleaner: no interim mode to choose
        self.lvm = self.steps is not replace.STEPS
        self.journal: replace.Journal | None = None
        self.plan_text: list[str] = []  # the plan as shown (steps, then the VMs slowed)
        self.current: str | None = None
        self.op: Any = None

    def compose(self) -> ComposeResult:
        yield Header(icon="≡")
        with Horizontal(classes="row"):
            yield Label("new SSD")
            yield Input("same", id="new",
                        placeholder="same | any | /dev/sdX | /dev/nvmeXnY | wwn:...")
            yield Label("interim mode")
            yield Input("none", id="interim", placeholder="none|writearound|writethrough",
                        disabled=self.lvm)  # LVM and dm-cache drain through the cleaner
        what = {replace.LVM_STEPS: "cached LV", replace.DM_STEPS: "dm-cache device"}.get(
            self.steps, "cache set")
        yield Static(literal(f"{what} {self.cset}: press p for the plan (changes "
                             "nothing), g to start, r to resume an interrupted run."),
                     id="plan")
        with Horizontal(classes="two-cols"):
            yield Static(literal(step_lines([], None, None, self.steps)),
                         id="steps")
            with Vertical():
                yield RichLog(id="oplog", wrap=True, markup=False)
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.set_interval(0.5, self.show_steps)

    def say(self, line: str) -> None:
        if line.startswith("[") and "] " in line:
            self.current = line.split("] ", 1)[1].strip()
        self.query_one("#oplog", RichLog).write(literal(line))
        self.app.log_line(f"  replace-ssd: {line}")  # type: ignore[attr-defined]
        self.show_steps()

    def show_steps(self) -> None:
        j = self.journal
        failed = None
        if j is not None and j.status == "failed" and j.error:
            failed = j.error.split(":", 1)[0]
        steps = j.steps if j else self.steps
        self.query_one("#steps", Static).update(
            literal(step_lines(list(j.done) if j else [], self.current, failed, steps)))

    def options(self) -> replace.Options:
        return replace.Options(new=self.query_one("#new", Input).value.strip() or "same",
                               interim_mode=self.query_one("#interim", Input).value.strip()
                               or "none")

    # ---------------------------------------------------------------- plan

    def action_plan(self, then_start: bool = False) -> None:
        self.make_plan(self.options(), then_start)

    @work(thread=True, exclusive=True, exit_on_error=False, group="replace-plan")
    def make_plan(self, opts: replace.Options, then_start: bool) -> None:
        try:
            app: Any = self.app
            j = replace.plan(app.sysfs, self.cset, opts)
            lines = replace.plan_lines(app.sysfs, j)
        except CacheMgrError as exc:
            self.app.call_from_thread(self.plan_failed, str(exc))
            return
        self.app.call_from_thread(self.planned, j, lines, then_start)

    def plan_failed(self, text: str) -> None:
        self.query_one("#plan", Static).update(literal(f"refused: {text}"))
        self.app.log_line(f"✗ replace-ssd plan: {text}", "red")  # type: ignore[attr-defined]

    def planned(self, j: replace.Journal, lines: list[str], then_start: bool) -> None:
        self.journal = j
        self.plan_text = lines
        self.query_one("#plan", Static).update(literal("\n".join(lines[:3])))
        log = self.query_one("#oplog", RichLog)
        for line in lines:
            log.write(literal(line))
        self.show_steps()
        if then_start:
            self.confirm_start(j)

    # ---------------------------------------------------------------- run

    def action_start(self) -> None:
        if self.journal is None or self.journal.status != "running" or self.journal.done:
            self.action_plan(then_start=True)
        else:
            self.confirm_start(self.journal)

    def confirm_start(self, j: replace.Journal) -> None:
        if j.kind == "lvm":
            tail = ("The LV stays up (uncached between the split and the new attach). Every "
                    "step is journaled: an interrupted run resumes (r) or, before "
                    "'remove-old-cache', rolls back (u).")
        elif j.kind == "dmcache":
            tail = ("The dm-cache device stays up (a linear table over its origin while the "
                    "SSD is out). Every step is journaled: an interrupted run resumes (r) or, "
                    "before 'release-old', rolls back (u).")
        else:
            tail = ("The VMs' bcache devices stay up (passthrough while detached). Every step "
                    "is journaled: an interrupted run resumes (r) or, before 'unregister', "
                    "rolls back (u).")
        lines = self.plan_text if self.journal is j and self.plan_text else replace.describe(j)
        body = "\n".join(lines) + "\n\n" + tail
        self.app.push_screen(ConfirmDialog(f"Replace the SSD of {j.cset[:8]}", body,
                                           [("go", "Start replacement", "error")]),
                             when(lambda b: self.execute(j)))

    def execute(self, j: replace.Journal) -> None:
        self.journal = j
        app: Any = self.app

        def fn(ctl: Control) -> Result:
            ctl.say = lambda line: app.call_from_thread(self.say, line)
            ctl.prompt = lambda text: bool(app.ask_from_thread(SwapPrompt(text), ctl.cancel))
            return replace.run(app.sysfs, j, ctl=ctl)

        self.query_one("#oplog", RichLog).write(
            literal(f"run id {j.id} (resume with: cachemgr replace-ssd --resume {j.id})"))
        self.op = app.start_op(f"replace-ssd {j.cset[:8]}", fn)

    def action_cancel(self) -> None:
        if self.op is not None and self.op.id in self.app.ops:  # type: ignore[attr-defined]
            self.op.ctl.cancel.set()
            self.query_one("#oplog", RichLog).write("cancelling at the next step report...")

    # ---------------------------------------------------------------- resume / rollback

    def _pick_run(self, title: str, then: Any) -> None:
        # finished and rolled-back runs can be neither resumed nor rolled back
        runs = replace.runs(unfinished=True)
        choices = [(j.id, f"{j.id}  {j.status}  "
                    f"{'lv ' + j.cset if j.kind == 'lvm' else 'cset ' + j.cset[:8]}  last: "
                    f"{(j.done or ['-'])[-1]}" + (f"  ({j.error})" if j.error else ""))
                   for j in runs]
        self.app.push_screen(ChoiceDialog(title, choices, empty="no interrupted run"),
                             when(lambda rid: then(replace.load(rid))))

    def action_resume(self) -> None:
        self._pick_run("Resume which run?", self._resume)

    def _resume(self, j: replace.Journal) -> None:
        self.journal = j
        self.show_steps()
        self.execute(j)

    def action_rollback(self) -> None:
        self._pick_run("Roll back which run?", self._confirm_rollback)

    def _confirm_rollback(self, j: replace.Journal) -> None:
        app: Any = self.app

        def fn(ctl: Control) -> Result:
            ctl.say = lambda m: app.call_from_thread(self.say, m)
            return replace.rollback(app.sysfs, j.id, ctl=ctl)

        last = "remove-old-cache" if j.kind == "lvm" else "unregister"
        app.push_screen(ConfirmDialog(f"Roll back {j.id}",
                                      "Put the modes back and re-attach what was detached "
                                      f"(possible only before '{last}').",
                                      [("go", "Roll back", "warning")]),
                        when(lambda b: app.start_op(f"replace-ssd rollback {j.id}", fn)))


