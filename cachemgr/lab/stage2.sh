#!/bin/bash
# cachemgr lab, guest stage 2 (common to every backend).
#
# Runs as PID 1 (after the backend's stage 1 built the root: host / read-only under an
# overlay with a tmpfs upper, the project and the run directory mounted read-write at their
# host paths, /proc /sys /dev mounted). It loads the lab's modules, optionally starts udevd,
# runs the command with stdout, stderr and a control channel on separate serial lines, and
# powers the guest off. Settings come from $labrun/lab.env (written by cachemgr.lab.core).
# With LAB_SYSTEMD=1 it execs systemd instead (the host's enabled units and generators left
# out), which runs the command as lab-command.service (this script with --command) once
# multi-user.target is up. A setup command ($labrun/setup-argv) runs before either.
set -u
labrun=${labrun:?labrun= missing from the kernel command line}
. "$labrun/lab.env"
# lab_disks: $LAB_DISKS with the NVMe namespaces (qemu) after the plain disks
. "${LAB_STAGE2%/*}/lab-disks.sh"

ctl() { printf '%s\n' "$*" >"$LAB_TTY_CTL"; }
poweroff_now() {
    sync
    # give the serial lines a moment to drain to the host before the power goes
    sleep 0.2
    echo o >/proc/sysrq-trigger
    sleep 10
}
trap poweroff_now EXIT

# run_argv FILE: the NUL-separated argv in FILE, in the command's environment and directory,
# with stdout and stderr on their serial lines; sets rc.
run_argv() {
    local -a argv
    mapfile -d '' -t argv <"$1"
    (
        # the command's environment: what the host passed, plus the lab's own variables
        while IFS= read -r -d '' kv; do export "$kv"; done <"$labrun/env"
        LAB_DISKS=$(lab_disks) || ctl "nvme-missing (the console log names it)"
        export CACHEMGR_IN_LAB=1 LAB_BACKEND LAB_DISKS LAB_NVME_SERIALS LAB_RUNDIR="$labrun" HOME=${HOME:-/root}
        cd "$LAB_CWD" || exit 127
        if [ "$LAB_INTERACTIVE" = 1 ]; then
            stty -F "$LAB_TTY_TERM" sane rows "$LAB_ROWS" cols "$LAB_COLS" 2>/dev/null
            export TERM=${TERM:-xterm-256color}
            exec timeout -k 5 "$LAB_TIMEOUT" setsid -w -c "${argv[@]}" \
                <"$LAB_TTY_TERM" >"$LAB_TTY_TERM" 2>"$LAB_TTY_TERM"
        fi
        exec timeout -k 5 "$LAB_TIMEOUT" "${argv[@]}" <"$LAB_STDIN" >"$LAB_TTY_OUT" 2>"$LAB_TTY_ERR"
    )
    rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        ctl "timeout $LAB_TIMEOUT"
    fi
}

run_command() {
    run_argv "$labrun/argv"
    ctl "rc=$rc"
    exit "$rc"
}

# The setup command (LabSpec.setup) runs first, before systemd when there is one: what a host
# has on its disks and in /etc when it boots. Its failure ends the run with its exit code.
run_setup() {
    [ -s "$labrun/setup-argv" ] || return 0
    run_argv "$labrun/setup-argv"
    [ "$rc" = 0 ] || { ctl "setup-failed rc=$rc"; ctl "rc=$rc"; exit "$rc"; }
}

# Under systemd (LAB_SYSTEMD=1) the command runs as lab-command.service (ExecStart: this
# script with --command) once lab.target's dependencies are up; the guest was set up already.
if [ "${1:-}" = --command ]; then
    run_command
fi

mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /run /tmp
mountpoint -q /dev/pts || mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mountpoint -q /dev/shm || mount -t tmpfs -o mode=1777 tmpfs /dev/shm
# Without these bash process substitution silently yields nothing
# (docs/kernel-notes.md, "The lab guest").
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

# Under systemd the command waits for the boot (multi-user.target) as a service; systemd
# starts udevd itself. The setup command runs between prepare_systemd and start_systemd.
prepare_systemd() {
    [ -x /lib/systemd/systemd ] || { ctl "systemd-missing"; ctl "rc=125"; exit; }
    # the host's own configuration is not the guest's: none of the services the host enables,
    # no generators (fstab, getty, cryptsetup...: they would act on the host's setup)
    rm -f /etc/systemd/system/*.wants/* /etc/systemd/system/default.target
    mkdir -p /etc/systemd/system-generators
    for g in /lib/systemd/system-generators/* /usr/lib/systemd/system-generators/*; do
        [ -e "$g" ] && ln -sfn /dev/null "/etc/systemd/system-generators/${g##*/}"
    done
}
start_systemd() {
    # runtime units; /run/systemd/system appears only now (sd_booted(3) tests for it)
    local units=/run/systemd/system
    mkdir -p "$units"
    cat >"$units/lab.target" <<EOF
[Unit]
Description=cachemgr lab: the booted guest and its command
Requires=basic.target
Wants=multi-user.target lab-command.service
After=basic.target multi-user.target
AllowIsolate=yes
EOF
    cat >"$units/lab-command.service" <<EOF
[Unit]
Description=cachemgr lab: the command
After=multi-user.target

[Service]
Type=exec
Environment=labrun=$labrun
ExecStart=/bin/bash $LAB_STAGE2 --command
StandardInput=null
StandardOutput=journal+console
EOF
    ctl "systemd-exec"
    exec /lib/systemd/systemd --unit=lab.target --log-target=console --show-status=1
}

if [ "${LAB_SYSTEMD:-0}" = 1 ]; then
    prepare_systemd
    export DM_DISABLE_UDEV=1  # for the setup command: udevd is not running yet
    run_setup
    unset DM_DISABLE_UDEV
    start_systemd
elif [ "$LAB_UDEV" = 1 ]; then
    udevd=""
    for c in /lib/systemd/systemd-udevd /usr/lib/systemd/systemd-udevd /sbin/udevd; do
        [ -x "$c" ] && { udevd=$c; break; }
    done
    if [ -z "$udevd" ]; then
        ctl "udev-missing"
    else
        mkdir -p /run/udev
        # --debug keeps udevd's stderr (it is /dev/null otherwise) and logs to it: the
        # tests read /run/udevd.log when an event went wrong; back to info at once (a test
        # raises it with udevadm control --log-level=debug around what it watches)
        "$udevd" --daemon --debug 2>/run/udevd.log >&2 </dev/null
        udevadm control --log-level=info
        udevadm trigger --action=add --type=subsystems
        udevadm trigger --action=add --type=devices
        udevadm settle --timeout=30
        ctl "udev-started"
    fi
else
    # libdevmapper would otherwise wait for udev to create /dev/mapper nodes
    # (docs/kernel-notes.md, "device-mapper without udev")
    export DM_DISABLE_UDEV=1
    # lvm2 likewise: no udev sync or rules, its device list from /dev, no dmeventd, no
    # lvmpolld (docs/kernel-notes.md, "lvm2 in the lab"). The file is the guest's (overlay).
    if [ -d /etc/lvm ]; then
        cat >/etc/lvm/lvmlocal.conf <<'LVMCONF'
activation { udev_sync = 0 udev_rules = 0 monitoring = 0 }
devices { obtain_device_list_from_udev = 0 }
global { use_lvmpolld = 0 }
LVMCONF
    fi
fi

# A hypervisor's own parts (LAB_LIBVIRT=1): cgroup v2 with machine.slice as systemd makes it
# (io controller on, so a scope under it has io.stat; io.pressure where the kernel has PSI), and
# libvirt's daemon serving qemu:///system. Debian's libvirtd resolves its built-in qemu user
# (libvirt-qemu) before it reads qemu.conf; libvirt-daemon-system's postinst would create it,
# here it goes into the guest's /etc (the overlay). The qemu capabilities libvirtd probes at
# its first start (about a minute under UML) are kept on the host between guests
# (docs/kernel-notes.md, "libvirt in the lab").
start_libvirt() {
    if ! mountpoint -q /sys/fs/cgroup; then
        mount -t cgroup2 cgroup2 /sys/fs/cgroup || { ctl "cgroup2-failed"; return; }
    fi
    echo +io >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    mkdir -p /sys/fs/cgroup/machine.slice
    echo +io >/sys/fs/cgroup/machine.slice/cgroup.subtree_control 2>/dev/null
    command -v libvirtd >/dev/null || { ctl "libvirt-missing"; return; }
    getent group libvirt-qemu >/dev/null || echo 'libvirt-qemu:x:64055:' >>/etc/group
    getent passwd libvirt-qemu >/dev/null ||
        echo 'libvirt-qemu:x:64055:64055:Libvirt Qemu:/var/lib/libvirt:/usr/sbin/nologin' >>/etc/passwd
    getent group kvm >/dev/null || echo 'kvm:x:64056:' >>/etc/group
    mkdir -p /etc/libvirt /var/lib/libvirt /run/libvirt /var/log/libvirt /var/cache/libvirt
    cat >/etc/libvirt/qemu.conf <<'QEMUCONF'
user = "root"
group = "root"
dynamic_ownership = 0
security_driver = "none"
namespaces = [ ]
QEMUCONF
    if [ -n "${LAB_LIBVIRT_CACHE:-}" ] && [ -d "$LAB_LIBVIRT_CACHE" ]; then
        mount --bind "$LAB_LIBVIRT_CACHE" /var/cache/libvirt
    fi
    LIBVIRT_LOG_OUTPUTS="3:file:$labrun/libvirtd.log" libvirtd >>"$labrun/libvirtd.log" 2>&1 &
    local i
    for i in $(seq 1 600); do
        virsh -q -c qemu:///system version >/dev/null 2>&1 && { ctl "libvirt-started"; return; }
        sleep 0.5
    done
    ctl "libvirt-failed"
}
if [ "${LAB_LIBVIRT:-0}" = 1 ]; then
    start_libvirt
fi

run_setup
run_command
