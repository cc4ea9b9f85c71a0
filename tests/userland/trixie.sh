#!/usr/bin/env bash
# The Debian 13 userland (rdma-core 56, perftest 25.01) on ferroce's libraries: a trixie root
# made with debootstrap (cached in $TRIXIE_ROOT between runs on one machine), ferroce's
# libibverbs.so.1 and librdmacm.so.1 copied in, then its unmodified programs run in it over
# loopback, each pair checked by its own success output: ibv_devinfo, the four pingpongs,
# every perftest program (and -R, through rdma_cm), rping, ucmatose, udaddy, rdma_server and
# rdma_client, rstream, riostream. (rdma-core 56's own pyverbs suite: tests/userland/trixie-guest.sh.) Needs
# root (chroot, mounts) and the Debian mirror; fails on the first program that fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${TRIXIE_ROOT:-/var/tmp/ferroce-trixie-root}
stamp="$root/.ferroce-userland-1"
pkgs=ibverbs-utils,perftest,rdmacm-utils,python3-pyverbs,rdma-core,iproute2

say() { printf '%s\n' "$*"; }

if [ ! -f "$stamp" ]; then
    say "userland: building the trixie root in $root (debootstrap; cached afterwards)"
    rm -rf "$root"
    mkdir -p "$root"
    debootstrap --variant=minbase --include="$pkgs" trixie "$root" http://deb.debian.org/debian \
        >"$root.log" 2>&1 || { tail -n 20 "$root.log"; exit 1; }
    touch "$stamp"
fi
say "userland: $(chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' libibverbs1 perftest rdmacm-utils | tr '\n' ' ')"

# The libraries, linked as the tests link them.
cargo build -q --release -p ferroce-ibverbs -p ferroce-librdmacm --lib
mkdir -p "$root/opt/ferroce"
ibverbs/link.sh target/release/libferroce_ibverbs.a "$root/opt/ferroce/libibverbs.so.1"
librdmacm/link.sh target/release/libferroce_librdmacm.a "$root/opt/ferroce/libibverbs.so.1" \
    "$root/opt/ferroce/librdmacm.so.1"

mounted=()
mnt() { # mnt TYPE-or-bind SRC DST
    mountpoint -q "$3" && return 0
    mkdir -p "$3"
    if [ "$1" = bind ]; then mount --bind "$2" "$3"; else mount -t "$1" "$2" "$3"; fi
    mounted+=("$3")
}
cleanup() {
    for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
}
trap cleanup EXIT
mnt proc proc "$root/proc"
mnt sysfs sys "$root/sys"
mnt bind /dev "$root/dev"
mnt bind /dev/shm "$root/dev/shm"

addr=127.0.90.1
in_root() { chroot "$root" env LD_LIBRARY_PATH=/opt/ferroce FERROCE_DEVICES="$addr" "$@"; }

fails=0
# pair NAME CHECK SERVER-ARGS... -- CLIENT-ARGS...: the server, then the client (retried while
# the server is not up yet), both to their end; the client's output must match CHECK.
pair() {
    local name=$1 check=$2
    shift 2
    local server=() client=()
    while [ "$1" != -- ]; do server+=("$1"); shift; done
    shift
    client=("$@")
    local out ok=0
    for try in 1 2 3 4 5 6 7 8 9 10; do
        in_root timeout 60 "${server[@]}" >/tmp/userland-server.log 2>&1 &
        local spid=$!
        sleep 0.5
        if out=$(in_root timeout 60 "${client[@]}" 2>&1); then
            wait "$spid" && ok=1
        else
            # $spid is the shell running in_root; the server is its child (chroot's exec chain
            # ends in timeout, which passes the signal on). Killing only $spid left the server
            # listening for up to 60 s, holding the next program's rdma_cm port.
            pkill -TERM -P "$spid" 2>/dev/null || true
            kill "$spid" 2>/dev/null || true
            wait "$spid" 2>/dev/null || true
        fi
        if [ $ok = 1 ] || ! grep -qiE 'reject|refused|connect' <<<"$out"; then break; fi
    done
    if [ $ok = 1 ] && grep -qE "$check" <<<"$out"; then
        say "PASS $name"
    else
        say "FAIL $name"
        say "--- client"; say "$out"; say "--- server"; cat /tmp/userland-server.log
        fails=$((fails + 1))
    fi
}

if in_root ibv_devinfo | grep -q 'hca_id:.*ferroce0'; then say "PASS ibv_devinfo"; else say "FAIL ibv_devinfo"; fails=$((fails + 1)); fi
for pp in ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong; do
    pair "$pp" 'iters in' "$pp" -d ferroce0 -g 1 -n 200 -- "$pp" -d ferroce0 -g 1 -n 200 "$addr"
done
for p in ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat; do
    pair "$p" '^ [0-9]' "$p" -d ferroce0 -x 1 -n 200 -- "$p" -d ferroce0 -x 1 -n 200 "$addr"
done
pair ibv_xsrq_pingpong 'success' ibv_xsrq_pingpong -d ferroce0 -g 1 -n 50 -- \
    ibv_xsrq_pingpong -d ferroce0 -g 1 -n 50 "$addr"
for p in ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw ib_send_lat; do
    pair "$p -c XRC" '^ [0-9]' "$p" -c XRC -d ferroce0 -x 1 -n 200 -- "$p" -c XRC -d ferroce0 -x 1 -n 200 "$addr"
done
for p in ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat ib_send_lat; do
    pair "$p -R" '^ [0-9]' "$p" -R -d ferroce0 -n 200 -- "$p" -R -d ferroce0 -n 200 "$addr"
done
pair rping 'ping data: rdma-ping-9' rping -s -a "$addr" -v -C 10 -- rping -c -a "$addr" -v -C 10
pair ucmatose 'return status 0' ucmatose -c 2 -C 10 -- ucmatose -s "$addr" -c 2 -C 10
pair udaddy 'return status 0' udaddy -- udaddy -s "$addr"
pair rdma_client 'rdma_client: end 0' rdma_server -s "$addr" -- rdma_client -s "$addr"
pair rstream 'Gb/sec' rstream -b "$addr" -S 65536 -C 100 -T v -- rstream -s "$addr" -S 65536 -C 100 -T v
pair riostream 'Gb/sec' riostream -b "$addr" -S 65536 -C 50 -T v -- riostream -s "$addr" -S 65536 -C 50 -T v

# rdma-core 56's pyverbs suite runs in a lab guest (tests/userland/trixie-guest.sh): it finds
# a device's interface with iproute2's `rdma link show`, which needs the kernel's RDMA netlink.

if [ "$fails" -gt 0 ]; then
    say "userland: $fails FAILED"
    exit 1
fi
say "userland: every program passed"
