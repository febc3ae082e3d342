#!/bin/bash
# Record `smartctl --json` of the qemu lab's emulated NVMe controller into
# tests/fixtures/smartctl/ (the SMART/health log that backends/smart.py reads).
#
#   scripts/record-smartctl.sh        (on the host; one qemu boot, a minute or two)
#
# On the host it boots one qemu guest (Debian 12's kernel, smartctl from the host's
# smartmontools package, which scripts/setup.sh installs) with one plain disk and one NVMe
# namespace, and runs itself inside, where it writes a little to the namespace (so the
# data-units counters are not zero) and records `smartctl --json -a` of the controller
# (/dev/nvme0: qemu-nvme.json) and of its namespace (/dev/nvme0n1: qemu-nvme-ns.json, the
# node cachemgr asks about, since that is the disk a cache sits on).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
out=$here/tests/fixtures/smartctl
if [ "${CACHEMGR_IN_LAB:-}" != 1 ]; then
    exec "$py" -m cachemgr lab run --backend qemu --disks 256M,nvme:512M -- \
        bash "$here/scripts/record-smartctl.sh"
fi
ns=$(ls /dev/nvme*n1 | head -n1)
ctrl=${ns%n1}
dd if=/dev/urandom of="$ns" bs=1M count=64 oflag=direct status=none
mkdir -p "$out"
# smartctl's exit status is a bit mask (smartctl(8), "RETURN VALUES"): keep the output of a
# run that set only the bits about the answer, fail on bits 0-2 (no or partial answer)
for pair in "$ctrl:qemu-nvme" "$ns:qemu-nvme-ns"; do
    dev=${pair%%:*} name=${pair#*:} rc=0
    smartctl --json -a "$dev" > "$out/$name.json" || rc=$?
    if (( rc & 7 )); then echo "smartctl -a $dev: exit $rc" >&2; exit 1; fi
    echo "recorded $out/$name.json from $dev ($(uname -r))" >&2
done
