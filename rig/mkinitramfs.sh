#!/bin/bash
# Build the rig's initramfs: busybox-static, the modules that mount the host's root over 9p
# (virtio-pci, 9pnet_virtio, 9p, overlay) and ./init.
# Usage: mkinitramfs.sh KVER MODBASE OUT
#   MODBASE: the directory holding lib/modules/KVER (setup.sh unpacks Debian's kernel there)
# Needs: busybox-static ($GPUFIO_RIG_BUSYBOX, default /bin/busybox: statically linked, the
# guest has no loader for a dynamic one; busybox on PATH packs the archive with its cpio),
# kmod (modprobe, depmod), xz, zstd, gzip.
set -euo pipefail
K=${1:?kernel version, e.g. 6.1.0-57-amd64}
BASE=${2:?module base directory}
OUT=${3:?output file}
HERE=$(cd "$(dirname "$0")" && pwd)
MODS="virtio_pci 9pnet_virtio 9p overlay"

ST=$(mktemp -d)
trap 'rm -rf "$ST"' EXIT
mkdir -p "$ST"/{bin,sbin,dev,proc,sys,mnt,newroot,lib/modules/$K}
cp "${GPUFIO_RIG_BUSYBOX:-/bin/busybox}" "$ST/bin/busybox"
ln -s busybox "$ST/bin/sh"
mknod -m 600 "$ST/dev/console" c 5 1
mknod -m 666 "$ST/dev/null" c 1 3
install -m 755 "$HERE/init" "$ST/init"
: > "$ST/modules.order"
for m in $MODS; do
  modprobe -d "$BASE" -S "$K" --show-depends "$m" | while read -r kind path _; do
    [ "$kind" = insmod ] || continue            # "builtin X" lines need nothing
    rel=${path#"$BASE/lib/modules/$K/"}
    dst=${rel%.xz}; dst=${dst%.zst}
    grep -qxF "$dst" "$ST/modules.order" && continue
    mkdir -p "$ST/lib/modules/$K/$(dirname "$dst")"
    case "$path" in
      *.xz)  xz -dc "$path"   > "$ST/lib/modules/$K/$dst" ;;
      *.zst) zstd -dc "$path" > "$ST/lib/modules/$K/$dst" ;;
      *)     cp "$path" "$ST/lib/modules/$K/$dst" ;;
    esac
    echo "$dst" >> "$ST/modules.order"
  done
done
mkdir -p "$(dirname "$OUT")"
(cd "$ST" && find . | busybox cpio -o -H newc | gzip -1) > "$OUT"

