"""The command layer: one function per command (target and options in, every check,
refusal, lock and journal inside, progress through one callback, one cancel token, one
result type out) under every face: the CLI, the TUI, the udev worker and (through the CLI's
JSON) the Ansible modules. See docs/architecture.md.

The names below load on first use (PEP 562): importing a module of this package runs this
file, and cachemgr.ops.udev (the udev RUN program's runtime) must load nothing else."""

from __future__ import annotations

TYPE_CHECKING = False  # typing's import is what the udev handler saves; mypy reads it as True
if TYPE_CHECKING:
    from cachemgr.ops.control import Control, Result, change_lines, progress_line

__all__ = ["Control", "Result", "change_lines", "progress_line"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from cachemgr.ops import control

        return getattr(control, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
