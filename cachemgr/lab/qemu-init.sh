#!/bin/busybox sh
# cachemgr lab, qemu stage 1: /init of the busybox initramfs that cachemgr.lab.qemu builds.
# Loads the drivers listed in /modules.load (virtio PCI, virtio-blk, 9p, overlay...; built
# in dependency order), mounts the host's / (9p share "hostroot", read-only) as the lower
# layer of an overlay with a tmpfs upper, mounts the read-write paths (9p shares rw0, rw1...
# in the order of LAB_RW_PATHS) at their host paths and the kernel's modules at /lib/modules,
# then continues with the common stage 2 inside that root, exactly like uml-init.sh.
/bin/busybox mkdir -p /usr/bin /usr/sbin /sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
die() {
    echo "lab stage1: $*" >/dev/console
    echo o >/proc/sysrq-trigger
    sleep 10
}

mkdir -p /proc /sys /dev /run
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
labrun=${labrun:?labrun= missing from the kernel command line}
while read -r m; do
    insmod "/modules/$m" || die "insmod $m"
done </modules.load

opts9p="trans=virtio,version=9p2000.L,msize=512000"
mount -t tmpfs -o mode=755 tmpfs /run || die "tmpfs on /run"
L=/run/lab
mkdir -p $L/lower $L/rw $L/root
mount -t 9p -o "ro,$opts9p,cache=loose" hostroot $L/lower || die "9p hostroot"
[ -r "$L/lower$labrun/lab.env" ] || die "no $labrun/lab.env on the host share"
. "$L/lower$labrun/lab.env"
mount -t tmpfs -o "mode=755,size=$LAB_UPPER_SIZE" tmpfs $L/rw
mkdir -p $L/rw/upper $L/rw/work
mount -t overlay overlay -o lowerdir=$L/lower,upperdir=$L/rw/upper,workdir=$L/rw/work $L/root \
    || die "overlay root"
R=$L/root
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mount -t tmpfs -o mode=1777 tmpfs $R/tmp
mount -t tmpfs -o mode=755 tmpfs $R/run
mkdir -p $R/lib/modules
# a bind of the read-only host share: read-only too
mount -o bind "$L/lower$LAB_MODULES" $R/lib/modules || die "modules"
i=0
for p in $LAB_RW_PATHS; do
    mkdir -p "$R$p"
    mount -t 9p -o "rw,$opts9p,cache=mmap" "rw$i" "$R$p" || die "9p rw$i at $p"
    i=$((i + 1))
done
# the scratch disks (virtio-blk) are probed synchronously by insmod; check they are there
for d in $LAB_DISKS; do
    [ -b "$d" ] || die "scratch disk $d missing"
done
# Keep the interactive terminal open: a tty forgets its window size (stage 2's stty rows/cols)
# when its last file descriptor closes, before the command opens it again.
if [ "$LAB_INTERACTIVE" = 1 ] && [ -c "$LAB_TTY_TERM" ]; then
    exec 9<>"$LAB_TTY_TERM"
fi
exec chroot $R /bin/bash "$LAB_STAGE2"
