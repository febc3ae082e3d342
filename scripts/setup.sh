#!/bin/bash
# cachemgr set-up: README's first command. As root on Debian 12, from a fresh clone:
#
#   scripts/setup.sh            install everything, then run the main job (the lab demo)
#   scripts/setup.sh --no-demo  install everything only (scripts/test.sh calls this)
#
# Installs the Debian packages cachemgr and its lab need, a virtualenv in .venv with the
# project and its test tools, and the lab kernels (User-Mode Linux from Debian testing with
# Debian 13's libc6, and Debian 12's own kernel for qemu) under /var/cache/cachemgr/lab.
# Nothing outside those places is changed (no /etc/apt edits; the lab's apt runs privately,
# with the mirror taken from this machine's own apt sources). Re-running is quick: each
# step skips what is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."
demo=1
for a in "$@"; do
    case $a in
    --no-demo) demo=0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "setup: unknown option $a" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" != 0 ]; then
    echo "setup: run as root (the lab and the caches need it)" >&2
    exit 2
fi
say() { echo "setup: $*" >&2; }

# 1. Debian packages -----------------------------------------------------------------------
pkgs=(python3 python3-venv python3-dev gcc pkg-config libblkid-dev
      bcache-tools fio dmsetup udev kmod util-linux e2fsprogs xz-utils
      patchelf qemu-system-x86 busybox-static tmux ca-certificates
      lvm2 thin-provisioning-tools fdisk
      prometheus prometheus-node-exporter smartmontools
      libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-dev
      blktrace groff-base man-db zsh htop stress-ng
      debhelper lintian)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
else
    say "Debian packages present"
fi

# 2. virtualenv with the project -------------------------------------------------------------
py=/usr/bin/python3
if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    "$py" -m venv .venv
fi
stamp=.venv/.cachemgr-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing cachemgr and its test tools into .venv"
    .venv/bin/pip install -q --disable-pip-version-check --upgrade pip >&2
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test]' >&2
    echo "$want" > "$stamp"
else
    say ".venv up to date"
fi

# 3. lab kernels -------------------------------------------------------------------------
.venv/bin/cachemgr lab setup >&2

# 4. the main job --------------------------------------------------------------------------
if [ "$demo" = 1 ]; then
    say "running the lab demo: bcache over a slow disk, then cachemgr status"
    exec .venv/bin/cachemgr lab demo
fi
