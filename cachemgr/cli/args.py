"""argparse ``type=`` validators for every numeric option: finite (``nan``, ``inf`` and
``1e999`` are refused) and in range, each refused as argparse's usage error (exit 2) with the
words of :mod:`cachemgr.core.checks`, which the TUI and the command layer use too."""

from __future__ import annotations

from cachemgr.core.checks import argtype

# durations that must pass: intervals, timeouts, runtimes (> 0)
seconds = argtype("seconds", above=0)
# durations that may be 0: a ramp, a settle time (>= 0)
seconds_or_zero = argtype("seconds_or_zero", minimum=0)
# counts: queue depth, jobs, repetitions (>= 1)
count = argtype("count", integer=True, minimum=1)
# whole numbers that may be 0: a seed
whole = argtype("whole", integer=True, minimum=0)
# a percentage (0..100)
percent = argtype("percent", integer=True, minimum=0, maximum=100)
# a positive finite number (Zipf's theta)
positive = argtype("positive", above=0)
# a non-negative finite number (a tolerance)
non_negative = argtype("non_negative", minimum=0)
# a latency bound in milliseconds (drain --max-latency): above 0, at most a minute
milliseconds = argtype("milliseconds", above=0, maximum=60_000)
