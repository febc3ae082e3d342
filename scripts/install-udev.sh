#!/bin/bash
# Install cachemgr's auto-attach hooks (udev/README.md), as root:
#
#   scripts/install-udev.sh                      # rule + boot unit, udev rules reloaded
#   scripts/install-udev.sh --policy /etc/x.toml # a policy somewhere else
#   scripts/install-udev.sh --uninstall
#
# Options: --python PATH (the interpreter with cachemgr; default: the one next to the
# `cachemgr` on PATH, else this checkout's .venv), --rules-dir DIR (/etc/udev/rules.d),
# --unit-dir DIR (/etc/systemd/system), --no-systemd (rule only), --no-reload.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rules_dir=/etc/udev/rules.d
unit_dir=/etc/systemd/system
python= policy= systemd=1 reload=1 uninstall=0
while [ $# -gt 0 ]; do
    case $1 in
    --python) python=$2; shift ;;
    --policy) policy=$2; shift ;;
    --rules-dir) rules_dir=$2; shift ;;
    --unit-dir) unit_dir=$2; shift ;;
    --no-systemd) systemd=0 ;;
    --no-reload) reload=0 ;;
    --uninstall) uninstall=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "install-udev: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
say() { echo "install-udev: $*" >&2; }

if [ "$uninstall" = 1 ]; then
    rm -f "$rules_dir/90-cachemgr.rules" "$unit_dir/cachemgr-autoattach.service"
    [ -L "$unit_dir/sysinit.target.wants/cachemgr-autoattach.service" ] &&
        rm -f "$unit_dir/sysinit.target.wants/cachemgr-autoattach.service"
    [ "$reload" = 1 ] && command -v udevadm >/dev/null && udevadm control --reload || true
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
if ! "$python" -c 'import cachemgr.udev_cli' 2>/dev/null; then
    echo "install-udev: $python cannot import cachemgr (give --python)" >&2
    exit 2
fi
cachemgr=$(dirname "$python")/cachemgr
[ -x "$cachemgr" ] || cachemgr="$python -m cachemgr.cli"
args=""
[ -n "$policy" ] && args=" --policy $policy"

mkdir -p "$rules_dir"
sed -e "s|@PYTHON@|$python|g" -e "s|@ARGS@|$args|g" "$here/udev/90-cachemgr.rules" \
    >"$rules_dir/90-cachemgr.rules.tmp"
mv "$rules_dir/90-cachemgr.rules.tmp" "$rules_dir/90-cachemgr.rules"
say "installed $rules_dir/90-cachemgr.rules (handler: $python -m cachemgr.udev_cli)"

if [ "$systemd" = 1 ]; then
    mkdir -p "$unit_dir"
    sed -e "s|@CACHEMGR@|$cachemgr|g" -e "s|@ARGS@|$args|g" \
        -e "s|ConditionPathExists=/etc/cachemgr/cachemgr.toml|ConditionPathExists=${policy:-/etc/cachemgr/cachemgr.toml}|" \
        "$here/systemd/cachemgr-autoattach.service" >"$unit_dir/cachemgr-autoattach.service"
    say "installed $unit_dir/cachemgr-autoattach.service"
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        systemctl daemon-reload
        systemctl enable cachemgr-autoattach.service >&2
    fi
fi
if [ "$reload" = 1 ] && command -v udevadm >/dev/null && [ -S /run/udev/control ]; then
    udevadm control --reload
    say "udev rules reloaded"
fi
