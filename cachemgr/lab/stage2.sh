#!/bin/bash
# cachemgr lab, guest stage 2 (common to every backend).
#
# Runs as PID 1 (after the backend's stage 1 built the root: host / read-only under an
# overlay with a tmpfs upper, the project and the run directory mounted read-write at their
# host paths, /proc /sys /dev mounted). It loads the lab's modules, optionally starts udevd,
# runs the command with stdout, stderr and a control channel on separate serial lines, and
# powers the guest off. Settings come from $labrun/lab.env (written by cachemgr.lab.core).
set -u
labrun=${labrun:?labrun= missing from the kernel command line}
. "$labrun/lab.env"

ctl() { printf '%s\n' "$*" >"$LAB_TTY_CTL"; }
poweroff_now() {
    sync
    # give the serial lines a moment to drain to the host before the power goes
    sleep 0.2
    echo o >/proc/sysrq-trigger
    sleep 10
}
trap poweroff_now EXIT

mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /run /tmp
mountpoint -q /dev/pts || mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mountpoint -q /dev/shm || mount -t tmpfs -o mode=1777 tmpfs /dev/shm
# Without these bash process substitution silently yields nothing (../shared/FACTS.md).
ln -sfn /proc/self/fd /dev/fd
ln -sfn /proc/self/fd/0 /dev/stdin
ln -sfn /proc/self/fd/1 /dev/stdout
ln -sfn /proc/self/fd/2 /dev/stderr
mountpoint -q /sys/kernel/config 2>/dev/null || mount -t configfs configfs /sys/kernel/config 2>/dev/null
mountpoint -q /sys/kernel/debug 2>/dev/null || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
hostname "$LAB_HOSTNAME" 2>/dev/null
ip link set lo up 2>/dev/null

# Raw serial lines: no \n -> \r\n translation, no echo; the bytes reach the host unchanged.
for t in "$LAB_TTY_OUT" "$LAB_TTY_ERR" "$LAB_TTY_CTL"; do
    stty -F "$t" raw -echo 2>/dev/null
done
ctl "booted $(uname -r)"

for m in $LAB_MODULES_LOAD; do
    modprobe "$m" 2>>"$labrun/modprobe.err" || ctl "modprobe-failed $m"
done

if [ "$LAB_UDEV" = 1 ]; then
    udevd=""
    for c in /lib/systemd/systemd-udevd /usr/lib/systemd/systemd-udevd /sbin/udevd; do
        [ -x "$c" ] && { udevd=$c; break; }
    done
    if [ -z "$udevd" ]; then
        ctl "udev-missing"
    else
        mkdir -p /run/udev
        "$udevd" --daemon
        udevadm trigger --action=add --type=subsystems
        udevadm trigger --action=add --type=devices
        udevadm settle --timeout=30
        ctl "udev-started"
    fi
else
    # libdevmapper would otherwise wait for udev to create /dev/mapper nodes (FACTS.md)
    export DM_DISABLE_UDEV=1
fi

# the command's environment: what the host passed, plus the lab's own variables
while IFS= read -r -d '' kv; do export "$kv"; done <"$labrun/env"
export CACHEMGR_IN_LAB=1 LAB_BACKEND LAB_DISKS LAB_RUNDIR="$labrun" HOME=${HOME:-/root}

mapfile -d '' -t ARGV <"$labrun/argv"
cd "$LAB_CWD" || { ctl "rc=127"; exit; }

if [ "$LAB_INTERACTIVE" = 1 ]; then
    stty -F "$LAB_TTY_TERM" sane rows "$LAB_ROWS" cols "$LAB_COLS" 2>/dev/null
    export TERM=${TERM:-xterm-256color}
    timeout -k 5 "$LAB_TIMEOUT" setsid -w -c "${ARGV[@]}" \
        <"$LAB_TTY_TERM" >"$LAB_TTY_TERM" 2>"$LAB_TTY_TERM"
    rc=$?
else
    timeout -k 5 "$LAB_TIMEOUT" "${ARGV[@]}" <"$LAB_STDIN" >"$LAB_TTY_OUT" 2>"$LAB_TTY_ERR"
    rc=$?
fi
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    ctl "timeout $LAB_TIMEOUT"
fi
ctl "rc=$rc"
exit "$rc"
