#!/bin/bash
# Builds (or reuses) the kernel-rxe guest image of ferroce's interop lab:
#   $CACHE/vmlinuz            the Debian release's kernel, extracted from its .deb (not installed)
#   $CACHE/rootfs.cpio.zst    debootstrap minbase + rdma-core userland + the modules rxe needs
#                             + guest-init.sh as /init, packed as an initramfs
# The release is $FERROCE_LAB_SUITE: bookworm (Debian 12: kernel 6.1, rdma-core 44; the default)
# or trixie (Debian 13: kernel 6.12, rdma-core 56 — the rxe of today's kernels). The cache
# ($FERROCE_LAB_CACHE, default /var/tmp/ferroce-rxe-lab, or /var/tmp/ferroce-rxe-lab-trixie)
# lives outside the checkout and is rebuilt when its inputs change: this script, guest-init.sh,
# the release and its kernel package name.
# Adapted from shared/rxe-vm/build.sh (the recipe checked on these machines).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SUITE=${FERROCE_LAB_SUITE:-bookworm}
case "$SUITE" in
  bookworm) D=${FERROCE_LAB_CACHE:-/var/tmp/ferroce-rxe-lab} ;;
  trixie) D=${FERROCE_LAB_CACHE:-/var/tmp/ferroce-rxe-lab-trixie} ;;
  *) echo "build.sh: FERROCE_LAB_SUITE is bookworm or trixie, not $SUITE" >&2; exit 1 ;;
esac
# The Debian mirror is the one this machine's apt already uses (its bookworm main source, in
# deb822 .sources or one-line .list form; trixie is on the same mirror); FERROCE_LAB_MIRROR
# overrides it.
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
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >"$D/apt-host.log" 2>&1 || true
  apt-get install -y --no-install-recommends "${need[@]}" >>"$D/apt-host.log" 2>&1
fi

# The libraries come as the tools' dependencies (trixie renamed them for its 64-bit time_t).
PKGS=kmod,iproute2,ibverbs-providers,ibverbs-utils,perftest,rdmacm-utils,procps,iputils-ping
R=$D/rootfs
bootstrap() {
  log "debootstrap $SUITE minbase + $PKGS"
  rm -rf "$R"
  debootstrap --variant=minbase --include=$PKGS "$SUITE" "$R" "$MIRROR" >"$D/debootstrap.log" 2>&1
}
# The kernel is the release's own: its package name from the root's package lists, which
# debootstrap leaves (the packed image drops them, so it is recorded in $D/kpkg; a root
# without either is bootstrapped again), the .deb fetched from the same mirror.
kernel_package() {
  chroot "$R" apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'
}
[ -x "$R/usr/bin/ibv_devinfo" ] || bootstrap
KPKG=$(kernel_package || true)
[ -n "$KPKG" ] || KPKG=$(cat "$D/kpkg" 2>/dev/null || true)
if [ -z "$KPKG" ]; then
  bootstrap
  KPKG=$(kernel_package || true)
fi
[ -n "$KPKG" ] || { echo "build.sh: no linux-image-amd64 in the $SUITE root's package lists" >&2; exit 1; }
KV=${KPKG#linux-image-}
KEY=$( { cat "$HERE/build.sh" "$HERE/guest-init.sh"; echo "$SUITE $KPKG"; } | sha256sum | cut -c1-16)
if [ -f "$D/vmlinuz" ] && [ -f "$D/rootfs.cpio.zst" ] && [ "$(cat "$D/key" 2>/dev/null)" = "$KEY" ]; then
  log "cached image $D (key $KEY) is current"
  exit 0
fi
log "building image (key $KEY, $SUITE, kernel $KPKG) in $D"
rm -f "$D/key"
if [ ! -f "$D/kernel/boot/vmlinuz-$KV" ]; then
  url=$(chroot "$R" apt-get download --print-uris "$KPKG" 2>/dev/null | awk -F"'" '/\.deb/{print $2; exit}')
  [ -n "$url" ] || { bootstrap; url=$(chroot "$R" apt-get download --print-uris "$KPKG" 2>/dev/null | awk -F"'" '/\.deb/{print $2; exit}'); }
  [ -n "$url" ] || { echo "build.sh: no download address for $KPKG" >&2; exit 1; }
  (cd "$D/debs" && curl -fsSL -o "${KPKG}_$SUITE.deb" "$url") || { echo "build.sh: could not fetch $url" >&2; exit 1; }
  rm -rf "$D/kernel"; mkdir -p "$D/kernel"
  dpkg-deb -x "$D/debs/${KPKG}_$SUITE.deb" "$D/kernel"
fi
cp "$D/kernel/boot/vmlinuz-$KV" "$D/vmlinuz"

MODS="rdma_rxe sch_netem ib_uverbs rdma_ucm ib_umad virtio_pci virtio_net 9pnet_virtio 9p virtio_rng crc32_generic crc32c_generic crc32c-intel crc32-pclmul"
rm -rf "$R/lib/modules"; mkdir -p "$R/lib/modules"
# trixie's package keeps its modules under /usr (merged /usr), bookworm's under /lib.
KMODS=$D/kernel/lib/modules/$KV
[ -d "$KMODS" ] || KMODS=$D/kernel/usr/lib/modules/$KV
cp -a "$KMODS" "$R/lib/modules/"
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
echo "$KPKG" > "$D/kpkg"
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
