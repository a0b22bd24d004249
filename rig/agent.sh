#!/bin/sh
# The rig's guest agent (runs as root in the guest's chroot of the host's root; PID 1 powers
# the guest off when it ends). Usage: agent.sh SHARE
#
# Boot: starts SHARE/cmd/warm.sh in the background where the host wrote one (output in
# SHARE/cmd/warm.out), binds the NVMe controllers one at a time in PCI address order, so
# their names follow the order QEMU was given them (nvme0, nvme1, ...); rig.poll=N,N,... on
# the kernel command line is nvme.poll_queues for each controller in that order. Waits until
# rig.paths= namespace paths and their device nodes exist, writes SHARE/rig-map (one line per
# namespace: serial nsid block-device generic-device controller) and says "ready" on
# /dev/ttyS1.
#
# Then, per line "ID TIMEOUT" read from /dev/ttyS1: runs SHARE/cmd/ID.sh with stdout and
# stderr into SHARE/cmd/ID.out and .err, killed after TIMEOUT seconds, and answers
# "done ID RC SECONDS". "quit" (or the host closing the line) ends the agent.
SHARE=$1
CTL=/dev/ttyS1
log() { echo "rig-agent: [$(cut -d' ' -f1 /proc/uptime)] $*"; }
log "control line $CTL"
stty -F "$CTL" raw -echo clocal
exec 3<>"$CTL"
log "control line open"
arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^rig\.$1=//p"; }
up() { cut -d' ' -f1 /proc/uptime; }
say() { printf '%s\n' "$*" >&3; }
POLL=$(arg poll | tr ',' ' ')
PATHS=$(arg paths)

# the host's start-up script (the batch interpreter) runs beside the binding below
[ -f "$SHARE/cmd/warm.sh" ] && /bin/sh "$SHARE/cmd/warm.sh" >"$SHARE/cmd/warm.out" 2>&1 \
  </dev/null 3>&- &
echo 0 >/sys/bus/pci/drivers_autoprobe
modprobe nvme || { say "failed modprobe nvme"; exit 1; }
# in the order of their places in the device tree (the root ports' slots), which is the
# order QEMU was given them; bus numbers need not follow it
for dev in /sys/bus/pci/devices/*; do
  [ "$(cat "$dev/class")" = 0x010802 ] && readlink -f "$dev"
done | sort | xargs -n1 basename >/tmp/rig-nvme-bdfs
# nvme.poll_queues is read when a controller resets (after bind returns): before changing it,
# wait until the controllers bound so far are live
live() {
  for c in /sys/class/nvme/nvme*/state; do [ ! -e "$c" ] || [ "$(cat "$c")" = live ] || return 1; done
}
set -- $POLL
cur=
while read -r bdf; do
  want=${1:-0}
  [ $# -gt 0 ] && shift
  if [ "$want" != "$cur" ]; then
    until live; do sleep 0.2; done
    echo "$want" >/sys/module/nvme/parameters/poll_queues
    cur=$want
  fi
  echo "$bdf" >/sys/bus/pci/drivers/nvme/bind || say "failed bind $bdf"
done </tmp/rig-nvme-bdfs
until live; do sleep 0.2; done
echo 0 >/sys/module/nvme/parameters/poll_queues
echo 1 >/sys/bus/pci/drivers_autoprobe
log "bound $(wc -l </tmp/rig-nvme-bdfs) NVMe controllers"

# one line per namespace path: serial nsid block generic controller (block and generic: the
# multipath head's where there is one)
nsmap() {
  for ns in /sys/class/nvme/nvme*/nvme*n*; do
    [ -e "$ns/nsid" ] || continue
    c=$(basename "$(dirname "$ns")")
    # a path nvmeXcYnZ of multipath head nvmeXnZ (the kernel's naming)
    blk=$(basename "$ns" | sed 's/c[0-9]*n/n/')
    gen=ng${blk#nvme}
    [ -b "/dev/$blk" ] && [ -c "/dev/$gen" ] || continue
    echo "$(cat "/sys/class/nvme/$c/serial") $(cat "$ns/nsid") /dev/$blk /dev/$gen $c"
  done
}
# namespaces appear as the controllers finish their (asynchronous) scans: count them with the
# shell's globbing alone, no process per look, so the waiting leaves the CPU to the kernel
deadline=$(($(cut -d. -f1 /proc/uptime) + 300))
until set -- /sys/class/nvme/nvme*/nvme*n*/nsid && [ $# -ge "${PATHS:-1}" ] \
    && [ "$(nsmap | wc -l)" -ge "${PATHS:-1}" ]; do
  if [ "$(cut -d. -f1 /proc/uptime)" -gt $deadline ]; then
    log "namespace paths found: $(nsmap | wc -l) of $PATHS:"; nsmap
    ls -d /sys/class/nvme/*/nvme* /dev/nvme* /dev/ng*
    say "failed: only $(nsmap | wc -l) of $PATHS NVMe namespace paths"
    exit 1
  fi
  sleep 0.2
done
nsmap >"$SHARE/rig-map"
log "namespaces ready"
say "ready $(up)"

while read -r id tmo <&3; do
  [ "$id" = quit ] && break
  t0=$(cut -d. -f1 /proc/uptime)
  timeout -k 10 "$tmo" /bin/sh "$SHARE/cmd/$id.sh" >"$SHARE/cmd/$id.out" 2>"$SHARE/cmd/$id.err" \
    </dev/null 3>&-
  rc=$?
  say "done $id $rc $(($(cut -d. -f1 /proc/uptime) - t0))"
done
sync
