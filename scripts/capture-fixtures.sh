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
all="bcache-writeback-dirty bcache-unattached bcache-missing-cache dmcache-writeback dmcache-states dmcache-failed scsi-ssd-in-use lvm-caches schedulers"

if [ "${CACHEMGR_IN_LAB:-}" != 1 ]; then
    backend=uml
    if [ "${1:-}" = --backend ]; then backend=$2; shift 2; fi
    for s in ${*:-$all}; do
        disks=1G,256M,16M b=$backend flags=()
        case $s in
        nvme-*) disks=256M,nvme:128M,nvme:64M b=qemu ;;
        vms) disks=512M,128M,512M,128M,16M,256M flags=(--libvirt) ;;
        vms-accounting) disks=768M,160M flags=(--libvirt) ;;
        vms-accounting-*) disks=768M,160M,16M flags=(--libvirt) ;;
        esac
        echo "== $s ($b)"
        "$py" -m cachemgr lab run --backend "$b" --disks "$disks" "${flags[@]}" -- \
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
    for i in $(seq 200); do [ -e "/sys/fs/bcache/$cset" ] || break; sleep 0.1; done
    for i in $(seq 200); do [ -e /sys/block/bcache0 ] || break; sleep 0.1; done
    for i in $(seq 200); do [ -e "/sys/block/$(basename "$hdd")/bcache" ] || break; sleep 0.1; done
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
dmcache-states)
    # four dm-cache devices over dm-linear slices of the three disks: writethrough clean
    # (metadata2, 128 KiB blocks, migration_threshold changed by message: status and table
    # differ), writeback dirty owned by "LVM" (a faked LVM- UUID), passthrough, and writeback
    # switched to the cleaner policy (writethrough) while dirty blocks remain. The last two
    # are written over 2 ms dm-delay origins, then at once their writes are slowed to 2 s and their
    # migration_threshold set to 64 (one block in flight): most of their dirty blocks are
    # still there when the capture runs.
    hs=$(( $(blockdev --getsz "$hdd") / 4 )); cs=$(( $(blockdev --getsz "$ssd") / 4 ))
    ms=$(( $(blockdev --getsz "$meta") / 4 ))
    for i in 0 1 2 3; do
        dmsetup create "o$i" --table "0 $hs linear $hdd $((i * hs))"
        dmsetup create "c$i" --table "0 $cs linear $ssd $((i * cs))"
        dmsetup create "m$i" --table "0 $ms linear $meta $((i * ms))"
        dd if=/dev/zero of="/dev/mapper/m$i" bs=4k count=1 oflag=direct 2>/dev/null
    done
    dmsetup create slow1 --table "0 $hs delay /dev/mapper/o1 0 2"
    dmsetup create slow3 --table "0 $hs delay /dev/mapper/o3 0 2"
    ct() { echo "0 $hs cache /dev/mapper/m$1 /dev/mapper/c$1 $2"; }
    dmsetup create wt --table "$(ct 0 /dev/mapper/o0) 256 2 metadata2 writethrough smq 0"
    dmsetup message wt 0 migration_threshold 4096
    dmsetup create --uuid LVM-fakeVGuuid0000000000000000000fakeLVuuid000000000000000000000 \
        vg0-lv0 --table "$(ct 1 /dev/mapper/slow1) 64 1 writeback smq 0"
    dmsetup create pt --table "$(ct 2 /dev/mapper/o2) 64 1 passthrough smq 0"
    dmsetup create flushing --table "$(ct 3 /dev/mapper/slow3) 64 1 writeback smq 0"
    write /dev/mapper/wt 4M
    write /dev/mapper/pt 4M
    fio --name=r --filename=/dev/mapper/wt --rw=randread --bs=4k --size=64M --io_size=4M \
        --direct=1 --random_distribution=zipf:1.2 --output-format=terse >/dev/null
    slow() {
        dmsetup message "$1" 0 migration_threshold 64
        dmsetup suspend "$2"
        # reads stay fast (blkid in the capture reads every device), writes take 2 s
        dmsetup load "$2" --table "0 $hs delay /dev/mapper/o$3 0 0 /dev/mapper/o$3 0 2000"
        dmsetup resume "$2"
    }
    write /dev/mapper/vg0-lv0 16M
    slow vg0-lv0 slow1 1
    write /dev/mapper/flushing 16M
    slow flushing slow3 3
    dmsetup suspend flushing
    dmsetup load flushing --table \
        "$(ct 3 /dev/mapper/slow3) 64 1 writethrough cleaner 2 migration_threshold 64"
    dmsetup resume flushing
    cap "four dm-cache devices over dm-linear slices: wt (writethrough, metadata2, 128 KiB blocks, migration_threshold 4096 set by message), vg0-lv0 (writeback, dirty, dm UUID LVM-...: LVM-owned), pt (passthrough), flushing (writethrough + cleaner policy, dirty blocks left); vg0-lv0 and flushing over dm-delay origins with 2 s writes, migration_threshold 64"
    ;;
vms)
    # libvirt domains on the caches (the kernel test's own set-up): vm-bc on bcache0 (over a
    # 20 ms dm-delay disk) cache=none, vm-dm on dm-cache vc cache=writeback, vm.bare on a file
    # on ext4 on the bare disk cache=unsafe; fio (QD1 random writes, 4 s) in vm-bc's scope
    # machine.slice/machine-qemu\x2d7\x2dvm\x2dbc.scope, so its io.stat counts IO
    # shellcheck disable=SC2086
    "$py" - $LAB_DISKS <<'PY'
import sys
from tests.kernel.test_vms_kernel import _fio_in, _scope, build
build(sys.argv[1:])
_fio_in(_scope("vm-bc", 7), "/dev/bcache0", 4).wait()
PY
    cap "three libvirt domains (not running) on a bcache device, a dm-cache device and a file on ext4 on a bare disk; VM cache modes none/writeback/unsafe; one qemu scope under machine.slice that did 4 s of QD1 random writes to bcache0"
    ;;
vms-accounting)
    # per-VM accounting (the kernel test's own set-up): three domains on LVs of one VG on
    # bcache0 over a 2 ms dm-delay disk, each LV's job run at once in a scope named like
    # libvirt's: a hot Zipf reader (its set cached), a uniform reader over 384 MiB (96 MiB
    # cached), a sequential backup
    # shellcheck disable=SC2086
    "$py" - $LAB_DISKS <<'PY'
import sys
from tests.kernel.test_vm_accounting_kernel import build_bcache, together
build_bcache(sys.argv[1:])
together()
PY
    cap "three libvirt domains (not running) on LVs of one VG on bcache0 over a 2 ms dm-delay disk; in scopes named like libvirt's, 8 s at once: a hot Zipf reader, a uniform reader over a large span, a sequential backup"
    ;;
vms-accounting-dmcache|vms-accounting-lvm)
    # the same three domains and jobs on a dm-cache made by cachemgr (writethrough) with the
    # VG on it, or on an LVM cache (lvconvert --type cache, writethrough) whose LV is the VG's
    # PV; smq warmed it, then the cleaner policy held it still (the kernel test's set-up)
    # shellcheck disable=SC2086
    "$py" - "${s#vms-accounting-}" $LAB_DISKS <<'PY'
import sys
from tests.kernel.test_vm_accounting_kernel import BUILD, together
BUILD[sys.argv[1]](sys.argv[2:])
together()
PY
    case $s in
    *dmcache) what="a dm-cache (writethrough, cleaner policy after smq warmed it) over a 2 ms dm-delay disk" ;;
    *) what="an LVM cache (vgc/big: cache pool, writethrough, cleaner policy after smq warmed it) of an LV on a 2 ms dm-delay disk, that LV the PV" ;;
    esac
    cap "three libvirt domains (not running) on LVs of one VG on $what; in scopes named like libvirt's, 8 s at once: a hot Zipf reader, a uniform reader over a large span, a sequential backup"
    ;;
lvm-caches)
    # lvm2's own caches in one VG: the origin PV a dm-delay "HDD" over the first disk (the raw
    # disk filtered out: it carries the same PV label), the caches on the second disk.
    # vg0/vm1: cache pool, writeback, written (lvm2's migration_threshold of 8 chunks lets the
    # idle cache write its dirty blocks back before the HDD is slowed: clean when captured);
    # vg0/vm2: cachevol, writethrough; vg0/vm3: writecache (high_watermark 60),
    # dirty blocks below the watermark (kept until then).
    hs=$(blockdev --getsz "$hdd")
    dmsetup create slow --table "0 $hs delay $hdd 0 2"
    printf 'devices { global_filter = [ "r|^%s$|" ] }\n' "$hdd" >> /etc/lvm/lvmlocal.conf
    lvm pvcreate -y /dev/mapper/slow "$ssd"
    lvm vgcreate vg0 /dev/mapper/slow "$ssd"
    for lv in vm1:128M vm2:64M vm3:64M; do
        lvm lvcreate -y -n "${lv%%:*}" -L "${lv#*:}" vg0 /dev/mapper/slow
    done
    lvm lvcreate -y -n pool -L 64M vg0 "$ssd"
    lvm lvconvert -y --type cache-pool --chunksize 64k vg0/pool
    lvm lvconvert -y --type cache --cachepool vg0/pool --cachemode writeback vg0/vm1
    lvm lvcreate -y -n fast2 -L 32M vg0 "$ssd"
    lvm lvconvert -y --type cache --cachevol vg0/fast2 --cachemode writethrough vg0/vm2
    lvm lvcreate -y -an -n fast3 -L 64M vg0 "$ssd"
    lvm lvconvert -y --type writecache --cachevol vg0/fast3 \
        --cachesettings high_watermark=60 vg0/vm3
    write /dev/vg0/vm1 16M
    write /dev/vg0/vm2 4M
    fio --name=r --filename=/dev/vg0/vm2 --rw=randread --bs=4k --size=64M --io_size=4M \
        --direct=1 --random_distribution=zipf:1.2 --output-format=terse >/dev/null
    fio --name=w --filename=/dev/vg0/vm3 --rw=randwrite --bs=4k --size=32M --io_size=8M \
        --direct=1 --output-format=terse >/dev/null
    dmsetup suspend slow
    dmsetup load slow --table "0 $hs delay $hdd 0 0 $hdd 0 2000"
    dmsetup resume slow
    cap "lvm2's caches in vg0 (origin PV a dm-delay over the first disk, writes slowed to 2 s after the fill; caches on the second disk): vg0/vm1 cache pool writeback (written, then idle: clean again by the capture), vg0/vm2 cachevol writethrough, vg0/vm3 writecache (high_watermark 60) with dirty blocks"
    ;;
schedulers)
    # IO schedulers on every kind of device: the first disk partitioned, its partition the
    # backing device of a bcache cache set on the second disk; the first disk on bfq with
    # slice_idle 0 (not the default), the second on kyber (bfq and kyber are modules on
    # Debian's kernel: the write loads them), the third on mq-deadline under a dm-linear
    # "lin". bcache0 and dm-0 are bio-based: no scheduler of their own.
    echo 'size=+,type=83' | sfdisk -q "$hdd"
    sleep 0.5
    make-bcache --bucket 128k -B "${hdd}1" -C "$ssd" >/dev/null
    reg "${hdd}1" "$ssd"
    dmsetup create lin --table "0 $(blockdev --getsz "$meta") linear $meta 0"
    q() { echo "/sys/block/$(basename "$1")/queue"; }
    echo bfq > "$(q "$hdd")/scheduler"
    echo 0 > "$(q "$hdd")/iosched/slice_idle"
    echo kyber > "$(q "$ssd")/scheduler"
    echo mq-deadline > "$(q "$meta")/scheduler"
    cap "IO schedulers: $hdd on bfq (slice_idle 0), its partition ${hdd}1 the backing device of bcache0 cached by $ssd (kyber); $meta on mq-deadline under dm-linear lin (dm-0); bcache0 and dm-0 bio-based"
    ;;
nvme-pair)
    # Not in $all: run it by name (qemu only: scripts/capture-fixtures.sh nvme-pair). Two
    # NVMe controllers, one namespace each: CMLABNVME00's namespace is the cache device of a
    # registered bcache cache set (the first disk its backing device); CMLABNVME01's is blank.
    for sn in $LAB_NVME_SERIALS; do
        for c in /sys/class/nvme/nvme*; do
            [ "$(tr -d ' ' < "$c/serial")" = "$sn" ] && echo "/dev/$(ls "$c" | grep -m1 '^nvme[0-9]*n1$')"
        done
    done > /tmp/nvme-nodes
    n0=$(sed -n 1p /tmp/nvme-nodes); n1=$(sed -n 2p /tmp/nvme-nodes)
    make-bcache --bucket 128k -B "$hdd" -C "$n0" >/dev/null
    reg "$hdd" "$n0"
    cap "two NVMe controllers on their own PCIe root ports (qemu q35): $n0 (serial CMLABNVME00) is the cache device of a registered bcache cache set with $hdd as its backing device; $n1 (serial CMLABNVME01) is blank"
    ;;
lvm-split)
    # Not in $all: run it by name (scripts/capture-fixtures.sh lvm-split). The states an
    # [lvm.NAME] auto-attach policy entry meets. vg0 over the first disk (the HDD) and two
    # dm-linear halves of the second (two "SSDs", the raw disk filtered out: it carries the
    # first half's PV label). vm1: its cache pool "pool" (on ssd-a) split off, whole;
    # vm2: cache pool "pool2" and vm4: cachevol "fast4", both on ssd-b, split off, and then
    # ssd-b removed (a missing PV: both partial); vm3: cached by "pool3" (ssd-a), writethrough;
    # "plain": a plain LV on ssd-a.
    half=$(( $(blockdev --getsz "$ssd") / 2 ))
    dmsetup create ssd-a --table "0 $half linear $ssd 0"
    dmsetup create ssd-b --table "0 $half linear $ssd $half"
    printf 'devices { global_filter = [ "r|^%s$|" ] }\n' "$ssd" >> /etc/lvm/lvmlocal.conf
    lvm pvcreate -y "$hdd" /dev/mapper/ssd-a /dev/mapper/ssd-b
    lvm vgcreate vg0 "$hdd" /dev/mapper/ssd-a /dev/mapper/ssd-b
    for lv in vm1 vm2 vm3 vm4; do lvm lvcreate -y -n $lv -L 64M vg0 "$hdd"; done
    for p in pool:ssd-a pool3:ssd-a pool2:ssd-b; do
        lvm lvcreate -y --type cache-pool --poolmetadataspare n --chunksize 64k \
            -n "${p%%:*}" -L 24M vg0 "/dev/mapper/${p#*:}"
    done
    lvm lvcreate -y -n fast4 -L 16M vg0 /dev/mapper/ssd-b
    lvm lvcreate -y -n plain -L 8M vg0 /dev/mapper/ssd-a
    lvm lvconvert -y --type cache --cachepool vg0/pool --cachemode writeback vg0/vm1
    lvm lvconvert -y --type cache --cachepool vg0/pool2 vg0/vm2
    lvm lvconvert -y --type cache --cachepool vg0/pool3 --cachemode writethrough vg0/vm3
    lvm lvconvert -y --type cache --cachevol vg0/fast4 vg0/vm4
    for lv in vm1 vm2 vm4; do lvm lvconvert -y --splitcache vg0/$lv; done
    lvm lvchange -an vg0/fast4
    dmsetup remove ssd-b
    cap "lvm2 caches split off and a missing PV (vg0 over the first disk and two dm-linear halves of the second): vm1 uncached, its cache pool vg0/pool whole; vm2 and vm4 uncached, their cache pool vg0/pool2 and cachevol vg0/fast4 on the removed PV ssd-b (partial); vm3 cached by vg0/pool3 in writethrough; vg0/plain a plain LV"
    ;;
dmcache-failed)
    # the metadata device (a dm-linear) starts failing every IO; the next writes make the
    # kernel abort the metadata transaction and fail the cache: status reads "Fail" (the
    # first status after the errors read "Error" in the lab)
    sz=$(blockdev --getsz "$hdd"); msz=$(blockdev --getsz "$meta")
    dmsetup create meta --table "0 $msz linear $meta 0"
    dd if=/dev/zero of=/dev/mapper/meta bs=4k count=1 oflag=direct 2>/dev/null
    dmsetup create failing --table "0 $sz cache /dev/mapper/meta $ssd $hdd 64 1 writeback smq 0"
    write /dev/mapper/failing 8M
    dmsetup suspend meta; dmsetup load meta --table "0 $msz error"; dmsetup resume meta
    write /dev/mapper/failing 4M
    for _ in $(seq 50); do
        dmsetup status failing | grep -q ' Fail' && break
        write /dev/mapper/failing 1M; sleep 0.1
    done
    cap "a writeback dm-cache device whose metadata device failed (every IO errors): dmsetup status reads Fail"
    ;;
scsi-ssd-in-use)
    # Not in $all: run it by name (scripts/capture-fixtures.sh scsi-ssd-in-use).
    # Two scsi_debug disks as the "SSDs". delay=0: the default one-jiffy delay makes bcache
    # bypass the cache (docs/kernel-notes.md, "scsi_debug in the lab"). Without
    # per_host_store both targets share one RAM store: sdb shows whatever is written to sda.
    # Without udevd nothing loads sd_mod: load it, then
    # wait for the block devices (the sd probe finishes after modprobe returns).
    modprobe scsi_debug delay=0 dev_size_mb=128 num_tgts=2 vpd_use_hostno=0
    modprobe sd_mod
    for _ in $(seq 100); do [ -b /dev/sda ] && [ -b /dev/sdb ] && break; sleep 0.1; done
    # sda: the cache device of a bcache set over the HDD; sdb: held by a dm linear device
    make-bcache --bucket 64k -B "$hdd" -C /dev/sda >/dev/null
    reg "$hdd" /dev/sda
    dmsetup create held --table "0 2048 linear /dev/sdb 0"
    # udevd only now (bcache-tools' rules would race the registration above), for the udev
    # database, by-id links and lsblk's view
    for u in /lib/systemd/systemd-udevd /usr/lib/systemd/systemd-udevd; do
        [ -x "$u" ] && break
    done
    mkdir -p /run/udev
    "$u" --daemon
    udevadm trigger --action=add --subsystem-match=block
    udevadm settle --timeout=30
    cap "two scsi_debug disks (one shared RAM store) seen by udevd: sda is the cache device of a bcache set over the HDD (registered, attached), sdb is held by a dm linear device (held); udev-db.txt, lsblk.json and blkid.txt alongside; scsi_host, bus/pseudo and scsi_device entries added by the scenario"
    # cachemgr capture misses these (yet): the SCSI host (scan), scsi_debug's adapter on the
    # pseudo bus, each disk's scsi_device/H:C:T:L directory, and the device/ attributes (wwid,
    # vpd_pg80, vpd_pg83, model, vendor, serial, delete) of disks it first reached through
    # another device's slaves/ link (bcache0/slaves/sda, dm-0/slaves/sdb)
    "$py" - "$out" <<'PY'
import sys
from pathlib import Path

from cachemgr.backends.capture import Capturer
from cachemgr.core.sysfs import Sysfs

sysfs = Sysfs()
c = Capturer(sysfs, Path(sys.argv[1]))
c.copy_tree("class/scsi_host", depth=1, follow=1)
c.copy_tree("bus/pseudo", depth=3, follow=1)
for name in sysfs.listdir("block"):
    dev = sysfs.resolve(f"block/{name}/device")
    if dev:
        c.copy_tree(dev, depth=1, follow=0)
    if dev and sysfs.is_dir(f"{dev}/scsi_device"):
        c.copy_tree(f"{dev}/scsi_device", depth=1, follow=0)
PY
    udevadm info --export-db | awk 'BEGIN { RS = ""; ORS = "\n\n" } /\nU: block\n/' \
        >"$out/udev-db.txt"
    lsblk -J -b -o NAME,SERIAL,WWN,MODEL,SIZE,FSTYPE,UUID >"$out/lsblk.json"
    blkid -p -o export /dev/sda /dev/sdb "$hdd" >"$out/blkid.txt" || true
    ;;
bcache-64-backing)
    # Not in $all: run it by name. 64 backing devices (dm-linear slices of the HDD, as
    # benchmarks/scan_bench.py builds them) on one cache set, every fourth in writeback with a
    # little dirty data held, for the TUI's responsiveness test. Stored packed
    # (tests/fixtures/bcache-64-backing-uml.tar.xz, ~10k small files); tests unpack it.
    n=64; total=$(blockdev --getsz "$hdd"); sl=$((total / n)); devs=()
    for i in $(seq 0 $((n - 1))); do
        name=$(printf vm%03d "$i")
        dmsetup create "$name" --table "0 $sl linear $hdd $((i * sl))"
        devs+=("/dev/mapper/$name")
    done
    make-bcache --bucket 128k -B "${devs[@]}" -C "$ssd" >/dev/null
    reg "$ssd" "${devs[@]}"
    for _ in $(seq 300); do
        [ "$(ls /sys/fs/bcache/*/ | grep -c '^bdev')" -ge "$n" ] && break; sleep 0.1
    done
    for i in $(seq 0 4 $((n - 1))); do
        b=/sys/block/bcache$i/bcache
        echo writeback > "$b/cache_mode"; echo 0 > "$b/writeback_running"
        fio --name=w --filename="/dev/bcache$i" --rw=randwrite --bs=4k --size=8M \
            --io_size=$(( (i / 4 + 1) * 64 ))k --direct=1 --output-format=terse >/dev/null
    done
    cap "64 backing devices (dm-linear slices of one disk) attached to one cache set; bcache0, 4, 8, ... 60 in writeback with dirty data held (writeback_running=0, 64k..1M), the rest writethrough and clean"
    tar -C "$(dirname "$out")" -cJf "$out.tar.xz" "$(basename "$out")"
    rm -rf "$out"
    ;;
dmcache-ssd-errors)
    # a writeback dm-cache whose cache SSD (a scsi_debug disk) fails reads: dirty blocks held
    # (migration_threshold 1: smq never sees the device idle), smartctl run first (it raises
    # the disk's ioerr_cnt and logs no failed request), then reads of cached blocks fail
    # (scsi_debug medium errors): the block layer logs each (kmsg.txt)
    modprobe scsi_debug dev_size_mb=160 delay=0 per_host_store=1
    for i in $(seq 100); do
        sd=$(ls /sys/bus/pseudo/drivers/scsi_debug/adapter0/host*/target*/*/block/ 2>/dev/null) \
            && [ -b "/dev/$sd" ] && break; sleep 0.1
    done
    sz=$(blockdev --getsz "$hdd")
    dd if=/dev/zero of="$meta" bs=1M count=1 oflag=direct 2>/dev/null
    dmsetup create vmcache --table "0 $sz cache $meta /dev/$sd $hdd 128 1 writeback smq 0"
    dmsetup message vmcache 0 migration_threshold 1
    dd if=/dev/urandom of=/dev/mapper/vmcache bs=64k count=64 oflag=direct status=none
    smartctl -a "/dev/$sd" >/dev/null || true
    p=/sys/module/scsi_debug/parameters
    echo 0 > $p/medium_error_start; echo 400000 > $p/medium_error_count; echo 2 > $p/opts
    dd if=/dev/mapper/vmcache of=/dev/null bs=64k count=8 iflag=direct status=none || true
    cap "a writeback dm-cache with dirty blocks whose cache SSD (scsi_debug) fails reads: smartctl ran before (ioerr_cnt raised), then reads of cached blocks failed (medium errors in the kernel log)"
    ;;
*) echo "unknown scenario $s" >&2; exit 2 ;;
esac
