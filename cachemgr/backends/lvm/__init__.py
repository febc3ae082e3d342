"""LVM-owned caches (lvmcache(7): cache pools and cachevols; lvm writecache), run through
lvm2's own commands.

    command    the one lvm2 wrapper (lvs report source, lvchange, lvconvert), name checks
    report     lvs's JSON report -> LvmCachedLv (names, pool, PVs under each part, settings)
    manage     mode, drain (cleaner policy / writecache cleaner), split, uncache, attach, tune
"""

from cachemgr.backends.lvm.command import check_vg_lv, lvm
from cachemgr.backends.lvm.report import cached_lvs

__all__ = ["cached_lvs", "check_vg_lv", "lvm"]
