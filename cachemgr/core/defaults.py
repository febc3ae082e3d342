"""Values the command line's parser shows (choices, defaults, help text) that the command
layer uses too. They live here, in a module that imports nothing, so that building the
parser (cachemgr/cli/main.py) does not import the command layer to read them; the modules
that use them import them from here.
"""

from __future__ import annotations

# cachemgr vm-cache MODE: the cache= modes of a libvirt disk (cachemgr/core/model.py)
VM_CACHE_MODES = ("none", "writethrough", "writeback", "directsync", "unsafe", "default")

# cachemgr bench: fio's read/write patterns (--rw; cachemgr/procedures/bench/job.py)
RW_MODES = ("randread", "randwrite", "randrw", "read", "write", "rw")
# cachemgr bench compare --tolerance: the relative change called noise
# (cachemgr/procedures/bench/comparison.py)
DEFAULT_TOLERANCE = 0.2
# --reference's word for each cache's own SSD, read apart (cachemgr/procedures/bench/reference.py)
CACHE_SSD = "cache-ssd"

# cachemgr sizing: blocks the trace recorder counts at most, about 27 MiB of Python dict
# (measured; cachemgr/procedures/trace.py), and the default --rate
COUNT_TABLE = 1 << 18
SIZING_DEFAULT_RATE = 0.01
