"""Procedures: multi-step work over the backends (the cached-device interface, the fast
drain, the journaled SSD replacement, autoattach decisions and policy, benchmarks, metrics).
Imports backends and core, never the command layer or a face."""
