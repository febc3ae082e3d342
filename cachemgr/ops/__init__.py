"""The command layer: one function per command (target and options in, every check,
refusal, lock and journal inside, progress through one callback, one cancel token, one
result type out) under every face: the CLI, the TUI, the udev worker and (through the CLI's
JSON) the Ansible modules. See docs/architecture.md."""

from cachemgr.ops.control import Control, Result, change_lines, progress_line

__all__ = ["Control", "Result", "change_lines", "progress_line"]
