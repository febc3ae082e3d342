#!/bin/bash
# Install cachemgr's auto-attach hooks (udev/README.md), as root:
#
#   scripts/install-udev.sh                      # rule + boot unit, udev rules reloaded
#   scripts/install-udev.sh --policy /etc/x.toml # a policy somewhere else
#   scripts/install-udev.sh --metrics --textfile # also the metrics units (systemd/README.md)
#   scripts/install-udev.sh --smart              # also the SMART refresh timer
#   scripts/install-udev.sh --protect            # also the protect pass every minute
#   scripts/install-udev.sh --scrub              # also the weekly scrub of the caches
#   scripts/install-udev.sh --governor           # also the writeback governor
#   scripts/install-udev.sh --uninstall          # everything it installed
#
# With the rule comes libvirt's qemu hook, the live-migration guard
# (/etc/libvirt/hooks/qemu.d/cachemgr; docs/admin-guide.md, "Live migration over shared
# storage"), when /etc/libvirt exists (libvirt is installed) and neither --rules-dir nor
# --unit-dir moves the install elsewhere, or where --hooks-dir says; a running libvirtd is
# reloaded (SIGHUP) so that it runs the hook.
#
# Options: --python PATH (the interpreter with cachemgr; default: the one next to the
# `cachemgr` on PATH, else this checkout's .venv), --rules-dir DIR (/etc/udev/rules.d),
# --unit-dir DIR (/etc/systemd/system), --no-systemd (rule only), --no-reload, --metrics
# (enable cachemgr-metrics.service, /metrics on loopback :9563), --textfile (enable
# cachemgr-textfile.service: node_exporter's textfile rewritten every 15 s), --smart
# (enable cachemgr-smart.timer: the cache SSDs' SMART health read every 10 minutes),
# --protect (enable cachemgr-protect.timer: the policy's [protect] pass every minute),
# --scrub (enable cachemgr-scrub.timer: `cachemgr scrub --all` every week), --governor
# (enable cachemgr-governor.service: the policy's [writeback] bounds held while it runs),
# --hooks-dir DIR (libvirt's hooks directory, default /etc/libvirt/hooks),
# --no-libvirt-hook. Units are enabled with systemctl also when systemd is not running (an
# image or chroot being built); they are started only on a running systemd. The
# cachemgr-textfile.timer of earlier versions is disabled, stopped and removed by every run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rules_dir=/etc/udev/rules.d
unit_dir=/etc/systemd/system
hooks_dir=
python= policy= systemd=1 reload=1 uninstall=0 metrics=0 textfile=0 smart=0 protect=0 scrub=0 governor=0 hook=1
while [ $# -gt 0 ]; do
    case $1 in
    --python) python=$2; shift ;;
    --policy) policy=$2; shift ;;
    --rules-dir) rules_dir=$2; shift ;;
    --unit-dir) unit_dir=$2; shift ;;
    --hooks-dir) hooks_dir=$2; shift ;;
    --no-libvirt-hook) hook=0 ;;
    --no-systemd) systemd=0 ;;
    --no-reload) reload=0 ;;
    --uninstall) uninstall=1 ;;
    --metrics) metrics=1 ;;
    --textfile) textfile=1 ;;
    --smart) smart=1 ;;
    --protect) protect=1 ;;
    --scrub) scrub=1 ;;
    --governor) governor=1 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "install-udev: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
say() { echo "install-udev: $*" >&2; }
# the rule's TEST (udev(7)) takes a path relative to the device's sysfs directory
case $policy in
"" | /*) ;;
*) echo "install-udev: --policy needs an absolute path ($policy)" >&2; exit 2 ;;
esac
units="cachemgr-autoattach.service cachemgr-metrics.service cachemgr-textfile.service
    cachemgr-smart.service cachemgr-smart.timer cachemgr-protect.service cachemgr-protect.timer
    cachemgr-scrub.service cachemgr-scrub.timer cachemgr-governor.service"
# what earlier versions installed and this one does not: disabled, stopped and removed by an
# install (an upgrade) as by --uninstall. cachemgr-textfile.timer started the textfile
# service every 15 s; the service now runs on its own (--interval 15), and a timer left
# enabled would start it again every 15 s (a running service: nothing) and its unit file
# would outlive the install.
stale="cachemgr-textfile.timer"
# sd_booted(3): systemd is PID 1 (else systemctl only edits unit files, offline)
booted() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null; }
# libvirt's hooks: the qemu.d directory of --hooks-dir, or of /etc/libvirt/hooks when
# libvirt is installed and the rule and units go to their own directories too (an install
# into directories of your choosing, a test's or an image's, leaves the live /etc/libvirt
# alone unless --hooks-dir says); none otherwise
hook_path=
if [ "$hook" = 1 ]; then
    if [ -n "$hooks_dir" ]; then
        hook_path=$hooks_dir/qemu.d/cachemgr
    elif [ -d /etc/libvirt ] && [ "$rules_dir" = /etc/udev/rules.d ] &&
        [ "$unit_dir" = /etc/systemd/system ]; then
        hook_path=/etc/libvirt/hooks/qemu.d/cachemgr
    fi
fi
# the hook's policy option, the path single-quoted for its shell (checked before anything is
# written)
hook_args=""
if [ -n "$hook_path" ] && [ -n "$policy" ]; then
    case $policy in
    *"'"* | *"|"* | *"&"* | *\\*)
        echo "install-udev: libvirt's hook cannot name a policy path with ' | & or \\" \
            "($policy): give --no-libvirt-hook, or another path" >&2
        exit 2 ;;
    esac
    hook_args=" --policy '$policy'"
fi
# libvirt reads its hooks at start and on SIGHUP (its hooks page, hooks.html): a running
# daemon is reloaded, which leaves its VMs running
reload_libvirt() {
    booted || return 0
    for d in libvirtd.service virtqemud.service; do
        if systemctl -q is-active "$d" 2>/dev/null; then
            systemctl reload "$d" && say "reloaded $d (it runs the hook from now on)"
        fi
    done
    return 0
}

# reload_udev: udevd reads the rules files again before this returns. `udevadm control
# --reload` alone is not enough: udevd 252 ignores a control message that reaches it between
# its accept() and its setsockopt(SO_PASSCRED) ("Invalid sender uid 65534, ignoring message"
# in its log) while udevadm exits 0, and the next hot-added disk is handled with the old rules
# (docs/kernel-notes.md, "udevd can ignore udevadm control"). SIGHUP asks udevd for the same
# forced reload through a channel nothing drops; `udevadm control --ping` then returns once
# udevd has handled the signal (one event loop: the signal is dispatched before the ping's
# connection is read). Without a udevd process to signal (none by that name), the message.
reload_udev() {
    command -v udevadm >/dev/null || return 0
    local pid
    pid=$(pgrep -o -x systemd-udevd || pgrep -o -x udevd || true)
    if [ -n "$pid" ] && kill -HUP "$pid" 2>/dev/null; then
        udevadm control --ping
        say "udev rules reloaded (SIGHUP to udevd, pid $pid)"
    elif [ -S /run/udev/control ]; then
        udevadm control --reload
        say "udev rules reloaded"
    fi
}

# remove_unit NAME: disabled (and stopped on a running systemd), its file and links gone
remove_unit() {
    [ -e "$unit_dir/$1" ] || [ -L "$unit_dir/$1" ] ||
        compgen -G "$unit_dir/*.wants/$1" >/dev/null || return 0
    if booted; then
        systemctl disable --now "$1" >&2 || true
    elif command -v systemctl >/dev/null; then
        systemctl disable "$1" >&2 || true
    fi
    rm -f "$unit_dir/$1" "$unit_dir"/*.wants/"$1"
}

if [ "$uninstall" = 1 ]; then
    for u in $units $stale; do
        remove_unit "$u"
    done
    rm -f "$rules_dir/90-cachemgr.rules"
    if [ -n "$hook_path" ] && [ -e "$hook_path" ]; then
        rm -f "$hook_path"
        reload_libvirt
    fi
    booted && systemctl daemon-reload
    [ "$reload" = 1 ] && reload_udev || true
    say "removed"
    exit 0
fi

if [ -z "$python" ]; then
    if cm=$(command -v cachemgr) && [ -x "$(dirname "$(readlink -f "$cm")")/python" ]; then
        python=$(dirname "$(readlink -f "$cm")")/python
    elif [ -x "$here/.venv/bin/python" ]; then
        python=$here/.venv/bin/python
    else
        python=/usr/bin/python3
    fi
fi
if ! "$python" -c 'import cachemgr.cli.udev' 2>/dev/null; then
    echo "install-udev: $python cannot import cachemgr (give --python)" >&2
    exit 2
fi
cachemgr=$(dirname "$python")/cachemgr
[ -x "$cachemgr" ] || cachemgr="$python -m cachemgr.cli.main"
args=""
[ -n "$policy" ] && args=" --policy $policy"

mkdir -p "$rules_dir"
sed -e "s|@PYTHON@|$python|g" -e "s|@ARGS@|$args|g" \
    -e "s|TEST!=\"/etc/cachemgr/cachemgr.toml\"|TEST!=\"${policy:-/etc/cachemgr/cachemgr.toml}\"|" \
    "$here/udev/90-cachemgr.rules" >"$rules_dir/90-cachemgr.rules.tmp"
mv "$rules_dir/90-cachemgr.rules.tmp" "$rules_dir/90-cachemgr.rules"
say "installed $rules_dir/90-cachemgr.rules (handler: $python -m cachemgr.cli.udev)"

if [ -n "$hook_path" ]; then
    mkdir -p "$(dirname "$hook_path")"
    sed -e "s|@PYTHON@|$python|g" -e "s|@ARGS@|$hook_args|g" "$here/libvirt/qemu-hook" \
        >"$hook_path.tmp"
    chmod 0755 "$hook_path.tmp"
    mv "$hook_path.tmp" "$hook_path"
    say "installed $hook_path (libvirt's qemu hook: the live-migration guard)"
    reload_libvirt
fi

# install_unit NAME: systemd/NAME with @CACHEMGR@ (and @ARGS@, the policy) filled in
install_unit() {
    mkdir -p "$unit_dir"
    sed -e "s|@CACHEMGR@|$cachemgr|g" -e "s|@ARGS@|$args|g" \
        -e "s#ConditionPathExists=|/etc/cachemgr/cachemgr.toml#ConditionPathExists=|${policy:-/etc/cachemgr/cachemgr.toml}#" \
        "$here/systemd/$1" >"$unit_dir/$1.tmp"
    mv "$unit_dir/$1.tmp" "$unit_dir/$1"
    say "installed $unit_dir/$1"
}
enable=() start=()
# an earlier version's units (an upgrade): gone before the ones that replace them start
for u in $stale; do
    if [ -e "$unit_dir/$u" ] || compgen -G "$unit_dir/*.wants/$u" >/dev/null; then
        remove_unit "$u"
        if booted; then systemctl daemon-reload; fi
        say "removed $unit_dir/$u (an earlier version's timer: cachemgr-textfile.service" \
            "now runs on its own$([ "$textfile" = 1 ] || echo ", installed by --textfile"))"
    fi
done
if [ "$systemd" = 1 ]; then
    install_unit cachemgr-autoattach.service
    enable+=(cachemgr-autoattach.service)
fi
if [ "$metrics" = 1 ]; then
    install_unit cachemgr-metrics.service
    enable+=(cachemgr-metrics.service) start+=(cachemgr-metrics.service)
fi
if [ "$textfile" = 1 ]; then
    install_unit cachemgr-textfile.service
    enable+=(cachemgr-textfile.service) start+=(cachemgr-textfile.service)
fi
if [ "$smart" = 1 ]; then
    install_unit cachemgr-smart.service
    install_unit cachemgr-smart.timer
    enable+=(cachemgr-smart.timer) start+=(cachemgr-smart.timer)
fi
if [ "$protect" = 1 ]; then
    install_unit cachemgr-protect.service
    install_unit cachemgr-protect.timer
    enable+=(cachemgr-protect.timer) start+=(cachemgr-protect.timer)
fi
if [ "$scrub" = 1 ]; then
    install_unit cachemgr-scrub.service
    install_unit cachemgr-scrub.timer
    enable+=(cachemgr-scrub.timer) start+=(cachemgr-scrub.timer)
fi
if [ "$governor" = 1 ]; then
    install_unit cachemgr-governor.service
    enable+=(cachemgr-governor.service) start+=(cachemgr-governor.service)
fi
if [ ${#enable[@]} -gt 0 ] && command -v systemctl >/dev/null; then
    if booted; then
        systemctl daemon-reload
        systemctl enable "${enable[@]}" >&2
        # the boot pass is for boot; the listener, the textfile service and the timers
        # start now
        if [ ${#start[@]} -gt 0 ]; then
            systemctl restart "${start[@]}"
            say "started ${start[*]}"
        fi
    else
        systemctl enable "${enable[@]}" >&2
    fi
fi
if [ "$reload" = 1 ]; then
    reload_udev
fi
