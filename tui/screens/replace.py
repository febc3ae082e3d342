"""Replace the cache SSD of a set: the plan, each step's progress, the operator's swap
prompt, resume and rollback of interrupted runs (cachemgr/procedures/replace/ does the work).

Every word about a kind of replacement (bcache cache set, LVM cache, dm-cache device: its
name, how a run's object is labelled, its steps, its point of no return, what stays up and
what a rollback puts back) comes from its ``replace.Kind``; nothing here spells a kind out."""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Label, RichLog, Static

from cachemgr.core.errors import CacheMgrError
from cachemgr.ops import replace
from cachemgr.ops.control import Control, Plan, Result
from tui.dialogs import when
from tui.dialogs.choose import ChoiceDialog
from tui.dialogs.confirm import ConfirmDialog
from tui.safe import literal


class SwapPrompt(ConfirmDialog):
    """replace.py's prompt callback: the operator swaps the disk, then confirms."""

    def __init__(self, text: str) -> None:
        super().__init__("Physical swap", text, [("done", "Done: the disk is in", "primary")])


def step_lines(done: list[str], current: str | None, failed: str | None,
               steps: tuple[tuple[str, str], ...] = replace.STEPS,
               point_of_no_return: str | None = None, note: str = " (no return)") -> str:
    """The steps, each marked done ✓, failed ✗, running ▶ or to do ·; with
    ``point_of_no_return``, that step says so (``note``: the steps' panel is 36 columns)."""
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
        out.append(f"{mark} {i:2d} {name}"
                   + (note if name == point_of_no_return else ""))
    return "\n".join(out)


class ReplaceScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "plan", "Plan", tooltip="check everything and show the plan: the "
                "steps, the VMs slowed meanwhile, the old SSD's health (changes nothing)"),
        Binding("g", "start", "Start", tooltip="plan, take the devices, plan again, confirm, "
                "then run the steps (each journaled); the swap prompt says when to change "
                "the disk"),
        Binding("r", "resume", "Resume", tooltip="finish an interrupted run from its "
                "journal, at the step where it stopped"),
        Binding("u", "rollback", "Rollback", tooltip="undo an interrupted run, possible "
                "before its kind's point of no return (the old cache still there)"),
        Binding("c", "cancel", "Cancel", tooltip="stop the run at its next step report "
                "(the journal keeps its place: resume or roll back later)"),
        Binding("escape", "app.pop_screen", "Back", tooltip="back to the dashboard (a run "
                "goes on: o shows it again)"),
    ]

    # the keys act on the screen; Tab reaches the two inputs
    AUTO_FOCUS = "#oplog"

    def __init__(self, cset: str, kind: replace.Kind | None = None) -> None:
        super().__init__()
        self.cset = cset  # a cache set's UUID, a cached LV's VG/LV, a dm-cache device's name
        self.kind = kind or replace.kind_for(cset)
        self.steps = self.kind.steps
        self.sub_title = f"replace the SSD of {self.kind.name} {self.cset}"
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
            # LVM and dm-cache caches drain through the cleaner: no interim mode to choose
            yield Input("none", id="interim", placeholder="none|writearound|writethrough",
                        disabled=not self.kind.interim_mode)
        yield Static(literal(f"{self.kind.what} {self.cset}: press p for the plan (changes "
                             "nothing), g to start, r to resume an interrupted run."),
                     id="plan")
        with Horizontal(classes="two-cols"):
            yield Static(literal(step_lines([], None, None, self.steps,
                                            self.kind.point_of_no_return)), id="steps")
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
        kind = replace.kind_of(j.kind) if j else self.kind
        self.query_one("#steps", Static).update(
            literal(step_lines(list(j.done) if j else [], self.current, failed, kind.steps,
                               kind.point_of_no_return)))

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
        """Start fresh run ``j``: the command layer's run takes its cache's and every
        device's locks, plans again under them and only then asks, from its worker, in the
        dialog :meth:`ask_start` shows (the plan it runs, as the command line's
        ``replace-ssd`` does: ops/replace.py run). A second admin's change or a second
        replacement of the same SSD while the question waits is refused (exit 3, naming
        this run); one made between the plan shown and the locks is in the plan asked
        (and said). No to the question: nothing was changed (the command's refusal, exit
        3, its words)."""
        self.execute(j, ask=True)

    def ask_start(self, j: replace.Journal, ctl: Control, plan: Plan) -> bool:
        """From the run's worker, its locks held: the plan it runs, and its question."""
        kind = replace.kind_of(j.kind)
        tail = (f"{kind.stays_up} Every step is journaled: an interrupted run resumes (r) "
                f"or, before '{kind.point_of_no_return}', rolls back (u).")
        self.app.call_from_thread(setattr, self, "plan_text", list(plan.lines))
        body = "\n".join(plan.lines) + "\n\n" + tail
        app: Any = self.app
        answer = app.ask_from_thread(ConfirmDialog(
            f"Replace the SSD of {kind.name} {kind.short(j.cset)}", body,
            [("go", "Start replacement", "error")]), ctl.cancel)
        return bool(answer == "go")

    def execute(self, j: replace.Journal, *, ask: bool = False) -> None:
        """Run (or resume) ``j`` in an operation; ``ask``: a fresh run's question
        (:meth:`ask_start`), put by the run once it holds its devices."""
        self.journal = j
        app: Any = self.app

        def fn(ctl: Control) -> Result:
            ctl.say = lambda line: app.call_from_thread(self.say, line)
            ctl.prompt = lambda text: bool(app.ask_from_thread(SwapPrompt(text), ctl.cancel))
            if ask:
                ctl.confirm = partial(self.ask_start, j, ctl)
            return replace.run(app.sysfs, j, ctl=ctl, command=f"replace-ssd {j.cset}")

        self.query_one("#oplog", RichLog).write(
            literal(f"run id {j.id} (resume with: cachemgr replace-ssd --resume {j.id})"))
        self.op = app.start_op(f"replace-ssd {replace.kind_of(j.kind).short(j.cset)}", fn)

    def action_cancel(self) -> None:
        if self.op is not None and self.op.id in self.app.ops:  # type: ignore[attr-defined]
            self.op.ctl.cancel.set()
            self.query_one("#oplog", RichLog).write("cancelling at the next step report...")

    # ---------------------------------------------------------------- resume / rollback

    def _pick_run(self, title: str, then: Any) -> None:
        # finished and rolled-back runs can be neither resumed nor rolled back
        runs = replace.runs(unfinished=True)
        choices = [(j.id, f"{j.id}  {j.status}  "
                    f"{replace.kind_of(j.kind).label(j.cset, short=True)}  last: "
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
        kind = replace.kind_of(j.kind)

        def fn(ctl: Control) -> Result:
            ctl.say = lambda m: app.call_from_thread(self.say, m)
            return replace.rollback(app.sysfs, j.id, ctl=ctl)

        done = [name for name in kind.step_names if name in j.done]
        failed = j.error.split(":", 1)[0] if j.status == "failed" and j.error else None
        past = kind.point_of_no_return in j.done
        body = (f"Run {j.id} on the {kind.name} {j.cset} ({j.status}): {len(done)} of "
                f"{len(kind.steps)} steps done. {kind.undoes} Rollback is "
                f"{kind.rollback_words()}"
                + (f"; this run is past '{kind.point_of_no_return}': resume it (r)."
                   if past else ".") + "\n\n"
                + step_lines(done, None, failed, kind.steps, kind.point_of_no_return,
                             "  (point of no return)"))
        app.push_screen(ConfirmDialog(f"Roll back {j.id}", body,
                                      [("go", "Roll back", "warning")]),
                        when(lambda b: app.start_op(f"replace-ssd rollback {j.id}", fn)))


