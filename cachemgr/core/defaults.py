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

# cachemgr replace-ssd: each kind's name and the step after which a run can no longer be
# rolled back (cachemgr/procedures/replace/bcache.py, lvm.py, dmcache.py read theirs here)
REPLACE_BCACHE_POINT_OF_NO_RETURN = "unregister"
REPLACE_LVM_POINT_OF_NO_RETURN = "remove-old-cache"
REPLACE_DMCACHE_POINT_OF_NO_RETURN = "release-old"
REPLACE_POINTS_OF_NO_RETURN = (
    ("bcache cache set", REPLACE_BCACHE_POINT_OF_NO_RETURN),
    ("LVM cache", REPLACE_LVM_POINT_OF_NO_RETURN),
    ("dm-cache device", REPLACE_DMCACHE_POINT_OF_NO_RETURN),
)
