#!/bin/bash
# cachemgr lab, User-Mode Linux stage 1: runs as init on the host's / (hostfs, read-only).
# Builds the guest root: host / read-only (hostfs) under an overlay whose upper layer is a
# tmpfs, mounts the project and run directory read-write at their host paths and the kernel's
# modules at /lib/modules, then continues with the common stage 2 inside that root.
set -u
labrun=${labrun:?labrun= missing from the kernel command line}
. "$labrun/lab.env"
die() { echo "lab stage1: $*" >/dev/console; echo o >/proc/sysrq-trigger; sleep 10; }

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=755 tmpfs /run || die "tmpfs on /run"
L=/run/lab
mkdir -p $L/lower $L/rw $L/root
mount -t hostfs -o ro,/ hostfs $L/lower || die "hostfs /"
mount -t tmpfs -o mode=755,size=${LAB_UPPER_SIZE} tmpfs $L/rw
mkdir -p $L/rw/upper $L/rw/work
insmod "$LAB_MODULES/$(uname -r)/kernel/fs/overlayfs/overlay.ko" || die "insmod overlay"
mount -t overlay overlay -o lowerdir=$L/lower,upperdir=$L/rw/upper,workdir=$L/rw/work $L/root \
    || die "overlay root"
R=$L/root
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mount -t tmpfs -o mode=1777 tmpfs $R/tmp
mount -t tmpfs -o mode=755 tmpfs $R/run
mkdir -p $R/lib/modules
mount -t hostfs -o "ro,$LAB_MODULES" hostfs $R/lib/modules || die "modules"
for p in $LAB_RW_PATHS; do
    mkdir -p "$R$p"
    mount -t hostfs -o "$p" hostfs "$R$p" || die "hostfs $p"
done
exec chroot $R /bin/bash "$LAB_STAGE2"
