#!/bin/bash
# Host set-up for the NVMe rig (Debian, as root); idempotent: skips what is present.
#   rig/setup.sh [KERNEL_PACKAGE]      (default linux-image-amd64: the release's kernel)
# Installs qemu-system-x86, busybox-static, kmod, zstd and xz-utils from Debian's packages
# (no recommends; the .debs kept in /var/cache/gpufio-rig/apt), and unpacks the guest
# kernel's package into $GPUFIO_RIG_KERNEL (default /var/cache/gpufio-rig/kernel) with
# dpkg-deb -x: nothing is installed into the host's /lib or
# /boot, no maintainer script runs. tests/rig.py finds the kernel there.
# The initramfs gets $GPUFIO_RIG_BUSYBOX (default /bin/busybox), which must be statically
# linked: Debian's `busybox` is not, and without its loader the guest cannot run /init.
set -euo pipefail
META=${1:-linux-image-amd64}
DEST=${GPUFIO_RIG_KERNEL:-/var/cache/gpufio-rig/kernel}
BUSYBOX=${GPUFIO_RIG_BUSYBOX:-/bin/busybox}
export DEBIAN_FRONTEND=noninteractive
# ldd (libc-bin, always there on Debian) says "not a dynamic executable" of a static binary
# and "statically linked" of a static PIE
# (exit status 1 for the former, so its output is read, not piped under pipefail)
static_busybox() {
  [ -x "$BUSYBOX" ] || return 1
  case "$(ldd "$BUSYBOX" 2>&1)" in
    *"not a dynamic executable"* | *"statically linked"*) return 0 ;;
    *) return 1 ;;
  esac
}
have_tools() {
  command -v qemu-system-x86_64 && static_busybox && "$BUSYBOX" --list | grep -qx cpio \
    && command -v depmod && command -v zstd && command -v xz
} >/dev/null 2>&1
# tests/rig.py also takes a kernel the reference recipe unpacked into /opt/guest-kernel
have_kernel() {
  for d in "$DEST" /opt/guest-kernel; do
    compgen -G "$d/boot/vmlinuz-*" && compgen -G "$d/lib/modules/*/modules.dep" && return 0
  done
  return 1
} >/dev/null
if have_tools && have_kernel; then
  echo "rig: QEMU, busybox-static, kmod and a guest kernel present"
  exit 0
fi
# busybox-static replaces Debian's dynamically linked busybox (the two conflict)
# the packages apt downloads are kept with the kernel: where /var/cache/gpufio-rig outlives
# the machine (a CI cache), a fresh one installs without downloading them again (and images
# that empty /var/cache/apt/archives after each install do not throw them away)
APT_CACHE=$(dirname "$DEST")/apt
mkdir -p "$APT_CACHE/partial"
apt-get update -qq
have_tools || apt-get install -y -qq --no-install-recommends \
  -o Dir::Cache::Archives="$APT_CACHE" qemu-system-x86 busybox-static kmod zstd xz-utils >/dev/null
static_busybox || { echo "rig: $BUSYBOX is missing or dynamically linked (ldd: $(ldd "$BUSYBOX" \
  2>&1 | tr -s '\t\n' '  ')); the guest could not run /init" >&2; exit 1; }
if ! have_kernel; then
  pkg=$(apt-cache depends "$META" | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$pkg" ] || { echo "rig: cannot resolve $META to a kernel package" >&2; exit 1; }
  compgen -G "$APT_CACHE/${pkg}_*.deb" >/dev/null \
    || (cd "$APT_CACHE" && apt-get download -q "$pkg" >/dev/null)
  mkdir -p "$DEST"
  dpkg-deb -x "$(compgen -G "$APT_CACHE/${pkg}_*.deb" | tail -1)" "$DEST"
  for k in "$DEST"/lib/modules/*/; do depmod -b "$DEST" "$(basename "$k")"; done
fi
echo "rig: $(qemu-system-x86_64 --version | head -1); guest kernel $(ls "$DEST/lib/modules" | tr '\n' ' ')in $DEST"
