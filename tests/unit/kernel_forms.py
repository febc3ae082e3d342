"""What kernels other than the lab's two print, as other projects captured it: each sample
names its source (docs/kernel-notes.md, "dm-cache status by kernel version" and "bch_hprint
sizes"). Used by test_kernel_forms.py and test_properties.py."""

from __future__ import annotations

# dm-cache status lines without the trailing <rw|ro> <needs_check|-> (kernels before 4.2),
# with the mq policy's five tunables (3.15 to 4.1), as (source, line without the name):
OLD_STATUS_LINES = [
    # influxdata/telegraf, plugins/inputs/dmcache/dmcache_linux_test.go (device cs-1)
    ("telegraf cs-1",
     "0 4883791872 cache 8 1018/1501122 512 7/464962 139 352643 15 46 0 7 0 1 writeback 2 "
     "migration_threshold 2048 mq 10 random_threshold 4 sequential_threshold 512 "
     "discard_promote_adjustment 1 read_promote_adjustment 4 write_promote_adjustment 8"),
    # the same file (device cs-2)
    ("telegraf cs-2",
     "0 4294967296 cache 8 72352/1310720 128 26/24327168 2409 286 265 524682 0 0 0 1 "
     "writethrough 2 migration_threshold 2048 mq 10 random_threshold 4 sequential_threshold "
     "512 discard_promote_adjustment 1 read_promote_adjustment 4 write_promote_adjustment 8"),
    # lvmcache-statistics.sh by Armin Hammer, initial version of 2014-12-20 (comment
    # "dmsetup status /dev/vg00/lvol1"; e.g. github.com/marcosviniciusb/lvmcache-statistics)
    ("lvmcache-statistics 2014",
     "0 934174720 cache 8 5178/1310720 128 963/1638400 24453 7501 5164 492458 0 8 0 1 "
     "writeback 2 migration_threshold 2048 mq 10 random_threshold 4 sequential_threshold 512 "
     "discard_promote_adjustment 1 read_promote_adjustment 4 write_promote_adjustment 8"),
]

# 4.2 and later with the mq policy (mq kept its tunables until 4.6 made it smq's alias):
# lvmcache-statistics.sh v2.0 (2015-12; e.g. github.com/aeszter/lvmcache-statistics)
MQ_42_LINE = ("0 3892379648 cache 8 5204/393216 128 1228751/1740800 16000290 96139299 7608331 "
              "58288757 0 367718 0 1 writeback 2 migration_threshold 2048 mq 10 "
              "random_threshold 4 sequential_threshold 512 discard_promote_adjustment 1 "
              "read_promote_adjustment 4 write_promote_adjustment 8 rw -")
# the same script's smq sample
SMQ_42_LINE = ("0 3892379648 cache 8 5204/393216 128 1694509/1740800 16064464 96291237 "
               "8382251 58523837 0 0 5 1 writeback 2 migration_threshold 2048 smq 0 rw -")

# The 3.9 to 3.13 form (Documentation/device-mapper/cache.txt of 3.9: no metadata or cache
# block size, no total of cache blocks, no policy name; mq printed 4 arguments). Made from
# that documentation and the numbers above, not captured: cachemgr does not read it, and a
# device printing it is listed as "unknown".
PRE_314_LINE = ("0 934174720 cache 5178/1310720 24453 7501 5164 492458 0 8 963 0 0 2 "
                "migration_threshold 2048 4 random_threshold 4 sequential_threshold 512")


def old_hprint(v: int) -> str:
    """bch_hprint() of drivers/md/bcache/util.c before 4.14 (3.10 to 4.13), in Python::

        for (u = 0; v >= 1024 || v <= -1024; u++) {
                t = v & ~(~0 << 10);
                v >>= 10;
        }
        if (!u)
                return sprintf(buf, "%llu", v);
        if (v < 100 && v > -100)
                snprintf(dec, sizeof(dec), ".%i", t / 100);
        return sprintf(buf, "%lli%s%c", v, dec, units[u]);

    (t is 0..1023, so t / 100 reaches 10: "1.10k"; ``>>=`` floors a negative value.)"""
    u, t = 0, 0
    while v >= 1024 or v <= -1024:
        t = v & 1023
        v >>= 10
        u += 1
    if not u:
        return str(v % (1 << 64))
    dec = f".{t // 100}" if -100 < v < 100 else ""
    return f"{v}{dec}{'?kMGTPEZY'[u]}"
