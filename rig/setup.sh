#!/bin/bash
# Host set-up for the NVMe rig (Debian, as root); idempotent: skips what is present.
#   rig/setup.sh [KERNEL_PACKAGE]      (default linux-image-amd64: the release's kernel)
# Installs qemu-system-x86, busybox-static, kmod, zstd and xz-utils from Debian's packages
# (no recommends), and unpacks the guest kernel's package into $GPUFIO_RIG_KERNEL (default
# /var/cache/gpufio-rig/kernel) with dpkg-deb -x: nothing is installed into the host's /lib or
# /boot, no maintainer script runs. tests/rig.py finds the kernel there.
set -euo pipefail
META=${1:-linux-image-amd64}
DEST=${GPUFIO_RIG_KERNEL:-/var/cache/gpufio-rig/kernel}
export DEBIAN_FRONTEND=noninteractive
have_tools() {
  command -v qemu-system-x86_64 && [ -x /bin/busybox ] && /bin/busybox --list | grep -qx cpio \
    && command -v depmod && command -v zstd && command -v xz
} >/dev/null 2>&1
have_kernel() { compgen -G "$DEST/boot/vmlinuz-*" && compgen -G "$DEST/lib/modules/*/modules.dep"; } >/dev/null
if have_tools && have_kernel; then
  echo "rig: tools and guest kernel present ($(ls "$DEST/lib/modules" | tr '\n' ' ')in $DEST)"
  exit 0
fi
apt-get update -qq
have_tools || apt-get install -y -qq --no-install-recommends qemu-system-x86 busybox-static \
  kmod zstd xz-utils >/dev/null
if ! have_kernel; then
  pkg=$(apt-cache depends "$META" | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$pkg" ] || { echo "rig: cannot resolve $META to a kernel package" >&2; exit 1; }
  debs=$(mktemp -d)
  trap 'rm -rf "$debs"' EXIT
  (cd "$debs" && apt-get download -q "$pkg" >/dev/null)
  mkdir -p "$DEST"
  dpkg-deb -x "$debs"/"$pkg"_*.deb "$DEST"
  for k in "$DEST"/lib/modules/*/; do depmod -b "$DEST" "$(basename "$k")"; done
fi
echo "rig: $(qemu-system-x86_64 --version | head -1); guest kernel $(ls "$DEST/lib/modules" | tr '\n' ' ')in $DEST"
