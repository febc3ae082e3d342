# cachemgr lab, guest: the scratch disks a command sees as $LAB_DISKS (sourced by stage2.sh;
# tests/unit/test_lab_unit.py runs it on a captured /sys tree).
#
# lab_disks prints, on one line: the plain disks as the host named them in LAB_DISKS
# (/dev/ubdX on UML, /dev/vdX on qemu: the fresh --disks ones, then the --disk-image ones),
# then every NVMe namespace of the qemu lab (`--disks nvme:SIZE[+SIZE...]`): controller by
# controller in the order of LAB_NVME_SERIALS (the order of --disks), each controller's
# namespaces by nsid (LAB_NVME_NAMESPACES: how many each controller has). A namespace's kernel
# name (nvme0n1...) follows the driver's probe order, which is asynchronous, so each one is
# found by its controller's serial and its nsid, waiting up to LAB_NVME_WAIT seconds (30)
# for the probe. One that never appears is left out, named on stderr, and lab_disks returns 1.
# LAB_SYSFS (default /sys) is where it looks.

# nvme_node SYSFS SERIAL NSID: /dev/NAME of namespace NSID of the controller with SERIAL
# (fails when there is none yet)
nvme_node() {
    local b dir
    for b in "$1"/block/nvme*n*; do
        [ -r "$b/nsid" ] && [ "$(cat "$b/nsid")" = "$3" ] || continue
        # block/nvme0n1 -> ../devices/.../nvme/nvme0/nvme0n1: the controller is its parent
        dir=$(readlink -f "$b") || continue
        [ "$(tr -d ' \n' <"${dir%/*}/serial" 2>/dev/null)" = "$2" ] || continue
        echo "/dev/${b##*/}"
        return 0
    done
    return 1
}

lab_disks() {
    local sys=${LAB_SYSFS:-/sys} sn nsid n i=0 node rc=0 deadline
    local out=${LAB_DISKS:-}
    local -a counts=()
    read -r -a counts <<<"${LAB_NVME_NAMESPACES:-}"
    deadline=$((SECONDS + ${LAB_NVME_WAIT:-30}))
    for sn in ${LAB_NVME_SERIALS:-}; do
        n=${counts[i]:-1}
        i=$((i + 1))
        for ((nsid = 1; nsid <= n; nsid++)); do
            until node=$(nvme_node "$sys" "$sn" "$nsid"); do
                if [ "$SECONDS" -ge "$deadline" ]; then
                    node=""
                    break
                fi
                sleep 0.1
            done
            if [ -n "$node" ]; then
                out="${out:+$out }$node"
            else
                echo "lab: namespace $nsid of NVMe controller $sn did not appear" >&2
                rc=1
            fi
        done
    done
    printf '%s\n' "$out"
    return "$rc"
}
