#!/bin/bash
# Capture real lab-kernel state into tests/fixtures/<scenario>-<kernel>/ for the unit tests.
#
#   scripts/capture-fixtures.sh [--backend uml|qemu] [SCENARIO...]   (on the host)
#
# On the host it boots one lab guest per scenario (fresh disks each time) and runs itself
# inside; inside the guest it builds the scenario and calls `cachemgr capture`.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
all="bcache-writeback-dirty bcache-unattached bcache-missing-cache dmcache-writeback"

if [ "${CACHEMGR_IN_LAB:-}" != 1 ]; then
    backend=uml
    if [ "${1:-}" = --backend ]; then backend=$2; shift 2; fi
    for s in ${*:-$all}; do
        echo "== $s ($backend)"
        "$py" -m cachemgr lab run --backend "$backend" --disks 1G,256M,16M -- \
            bash "$here/scripts/capture-fixtures.sh" "$s"
    done
    exit 0
fi

set -x
s=$1
read -r hdd ssd meta <<<"$LAB_DISKS"
rel=$(uname -r)
out="$here/tests/fixtures/$s-$LAB_BACKEND"
cap() { "$py" -m cachemgr capture "$s" --out "$out" --description "$1"; }
reg() { for d in "$@"; do echo "$d" > /sys/fs/bcache/register; done; sleep 0.5; }
write() {
    fio --name=w --filename="$1" --rw=randwrite --bs=4k --size=64M --io_size="$2" \
        --direct=1 --random_distribution=zipf:1.2 --output-format=terse >/dev/null
}
case $s in
bcache-writeback-dirty)
    make-bcache --bucket 128k -B "$hdd" -C "$ssd" >/dev/null
    reg "$hdd" "$ssd"
    echo writeback > /sys/block/bcache0/bcache/cache_mode
    echo 0 > /sys/block/bcache0/bcache/writeback_running
    write /dev/bcache0 24M
    fio --name=r --filename=/dev/bcache0 --rw=randread --bs=4k --size=64M --io_size=8M \
        --direct=1 --random_distribution=zipf:1.2 --output-format=terse >/dev/null
    cap "one backing device attached to one cache set, writeback mode, dirty data held (writeback_running=0), some read hits"
    ;;
bcache-unattached)
    make-bcache -B "$hdd" >/dev/null
    make-bcache --bucket 128k -C "$ssd" >/dev/null
    reg "$hdd" "$ssd"
    cap "a registered backing device attached to nothing (bcache0, state no cache) and a cache set with no backing device"
    ;;
bcache-missing-cache)
    make-bcache --bucket 128k -B "$hdd" -C "$ssd" >/dev/null
    reg "$hdd" "$ssd"
    echo writeback > /sys/block/bcache0/bcache/cache_mode
    echo 0 > /sys/block/bcache0/bcache/writeback_running
    write /dev/bcache0 8M
    cset=$(basename "$(readlink /sys/block/bcache0/bcache/cache)")
    # stop the set without flushing: the backing device stops with it (dirty data stays on
    # the SSD), then bring back only the backing device: its cache is missing
    echo 1 > "/sys/fs/bcache/$cset/stop"
    for i in $(seq 50); do [ -e "/sys/fs/bcache/$cset" ] || break; sleep 0.1; done
    for i in $(seq 50); do [ -e /sys/block/bcache0 ] || break; sleep 0.1; done
    reg "$hdd"
    cap "a backing device registered while its cache set (holding its dirty data) is missing"
    ;;
dmcache-writeback)
    sz=$(blockdev --getsz "$hdd")
    dd if=/dev/zero of="$meta" bs=1M count=1 oflag=direct 2>/dev/null
    dmsetup create slow --table "0 $sz delay $hdd 0 2"
    dmsetup create vmcache --table "0 $sz cache $meta $ssd /dev/mapper/slow 64 1 writeback smq 0"
    write /dev/mapper/vmcache 8M
    cap "a dm-cache device in writeback mode over a dm-delay origin, with dirty blocks"
    ;;
*) echo "unknown scenario $s" >&2; exit 2 ;;
esac
