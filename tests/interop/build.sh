#!/bin/bash
# Builds (or reuses) the kernel-rxe guest image of ferroce's interop lab:
#   $CACHE/vmlinuz            Debian bookworm's kernel, extracted from its .deb (not installed)
#   $CACHE/rootfs.cpio.zst    debootstrap minbase + rdma-core userland + the modules rxe needs
#                             + guest-init.sh as /init, packed as an initramfs
# The cache ($FERROCE_LAB_CACHE, default /var/tmp/ferroce-rxe-lab) lives outside the checkout and
# is rebuilt when its inputs change: this script, guest-init.sh and the kernel package name.
# Adapted from shared/rxe-vm/build.sh (the recipe checked on these machines).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
D=${FERROCE_LAB_CACHE:-/var/tmp/ferroce-rxe-lab}
# The Debian mirror is the one this machine's apt already uses (its bookworm main source, in
# deb822 .sources or one-line .list form); FERROCE_LAB_MIRROR overrides it.
apt_mirror() {
  local f u=""
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    u=$(awk 'BEGIN{RS=""} /Suites:[^\n]*bookworm( |$|\n)/ && /Components:[^\n]*main/ {
           if (match($0, /URIs:[ \t]*[^ \t\n]+/)) { u=substr($0, RSTART, RLENGTH); sub(/URIs:[ \t]*/, "", u); print u; exit } }' "$f")
    [ -n "$u" ] && { echo "$u"; return 0; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    u=$(awk '$1=="deb" && $3=="bookworm" && / main/ {print $2; exit}' "$f")
    [ -n "$u" ] && { echo "$u"; return 0; }
  done
  return 0
}
MIRROR=${FERROCE_LAB_MIRROR:-$(apt_mirror)}
[ -n "$MIRROR" ] || { echo "build.sh: no Debian bookworm source in /etc/apt; set FERROCE_LAB_MIRROR" >&2; exit 1; }
T0=$(date +%s)
log() { echo "[build +$(( $(date +%s) - T0 ))s] $*" >&2; }
mkdir -p "$D/debs"

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v tshark >/dev/null || need+=(tshark)
command -v zstd >/dev/null || need+=(zstd)
command -v cpio >/dev/null || need+=(cpio)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >"$D/apt-host.log" 2>&1 || true
  apt-get install -y --no-install-recommends "${need[@]}" >>"$D/apt-host.log" 2>&1
fi

KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[ -n "$KPKG" ] || { apt-get update -qq >/dev/null 2>&1; KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}'); }
KV=${KPKG#linux-image-}
KEY=$( { cat "$HERE/build.sh" "$HERE/guest-init.sh"; echo "$KPKG"; } | sha256sum | cut -c1-16)
if [ -f "$D/vmlinuz" ] && [ -f "$D/rootfs.cpio.zst" ] && [ "$(cat "$D/key" 2>/dev/null)" = "$KEY" ]; then
  log "cached image $D (key $KEY) is current"
  exit 0
fi
log "building image (key $KEY, kernel $KPKG) in $D"
rm -f "$D/key"
if [ ! -f "$D/kernel/boot/vmlinuz-$KV" ]; then
  (cd "$D/debs" && apt-get download "$KPKG" >/dev/null 2>&1)
  rm -rf "$D/kernel"; mkdir -p "$D/kernel"
  dpkg-deb -x "$D"/debs/"${KPKG}"_*.deb "$D/kernel"
fi
cp "$D/kernel/boot/vmlinuz-$KV" "$D/vmlinuz"

PKGS=kmod,iproute2,libibverbs1,ibverbs-providers,ibverbs-utils,perftest,rdmacm-utils,librdmacm1,procps,iputils-ping
if [ ! -x "$D/rootfs/usr/bin/ibv_devinfo" ]; then
  log "debootstrap minbase + $PKGS"
  rm -rf "$D/rootfs"
  debootstrap --variant=minbase --include=$PKGS bookworm "$D/rootfs" "$MIRROR" >"$D/debootstrap.log" 2>&1
fi
R=$D/rootfs
MODS="rdma_rxe sch_netem ib_uverbs rdma_ucm ib_umad virtio_pci virtio_net 9pnet_virtio 9p virtio_rng crc32_generic crc32c_generic crc32c-intel crc32-pclmul"
rm -rf "$R/lib/modules"; mkdir -p "$R/lib/modules"
cp -a "$D/kernel/lib/modules/$KV" "$R/lib/modules/"
chroot "$R" depmod "$KV"
keep=$(for m in $MODS; do chroot "$R" modprobe -S "$KV" --show-depends "$m"; done | awk '$1=="insmod"{print $2}' | sort -u)
mv "$R/lib/modules/$KV" "$R/lib/modules/$KV.full"
mkdir -p "$R/lib/modules/$KV"
cp -a "$R/lib/modules/$KV.full"/modules.{order,builtin,builtin.modinfo} "$R/lib/modules/$KV/"
for f in $keep; do
  rel=${f#/lib/modules/$KV/}
  mkdir -p "$R/lib/modules/$KV/$(dirname "$rel")"
  cp -a "$R/lib/modules/$KV.full/$rel" "$R/lib/modules/$KV/$rel"
done
rm -rf "$R/lib/modules/$KV.full"
chroot "$R" depmod "$KV"
rm -rf "$R"/usr/share/{doc,man,info,locale} "$R"/var/cache/apt/* "$R"/var/lib/apt/lists/*
mkdir -p "$R/var/lib/apt/lists/partial" "$R/host" "$R/run" "$R/tmp"
install -m 0755 "$HERE/guest-init.sh" "$R/init"
echo rxeguest > "$R/etc/hostname"
printf '127.0.0.1 localhost\n10.77.0.1 ferroce\n' > "$R/etc/hosts"
for i in $(seq 11 20); do echo "10.77.0.$i g$((i-10))" >> "$R/etc/hosts"; done
log "packing initramfs"
(cd "$R" && find . -xdev -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) | zstd -q -T0 -3 -f -o "$D/rootfs.cpio.zst"
echo "$KEY" > "$D/key"
log "done: $(du -sh "$D/rootfs.cpio.zst" | cut -f1) rootfs"
