"""Core: the model (frozen dataclasses and enums every layer shares), the one /sys root, the
one runner for external programs, errors and exit codes, state files and locks, and the
wait-for-clean loop. Imports nothing above it (tests/unit/test_layers.py)."""
