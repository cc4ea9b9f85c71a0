#!/usr/bin/env bash
# rdma-core 56's own pyverbs suite on ferroce's libraries, in a guest of the interop lab.
# rdma-core 56's tests look up each device's network interface with iproute2's
# `rdma link show -j`, which talks to the kernel's RDMA netlink (ib_core): a kernel without
# it (this host's) fails every set-up. The lab's guest kernel has ib_core; no RDMA device is
# made in it (no rxe), so `rdma link show` lists nothing and the suite finds ferroce0 the way
# 44's does. The trixie root that tests/userland/trixie.sh built (ferroce's libraries in
# /opt/ferroce) is copied into the guest's share and the suite runs chrooted there, on
# ferroce0 over the guest's eth0 address. Prints the counts; fails if a test fails or errors.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${TRIXIE_ROOT:-/var/tmp/ferroce-trixie-root}
[ -x "$root/usr/bin/python3" ] || { echo "userland guest: no trixie root in $root (run trixie.sh)"; exit 1; }
bash tests/interop/build.sh
export FERROCE_LAB_NS=ferroce-trixie$$
# shellcheck source=../interop/lab.sh
source tests/interop/lab.sh
trap 'set +e; lab_down' EXIT
lab_up 1 1500
G=$RUN/g1
cp -a "$root" "$G/trixie"
rm -rf "$G/trixie/tmp/suite" && mkdir -p "$G/trixie/tmp/suite"
cp -r "$root/usr/share/doc/rdma-core/tests" "$G/trixie/tmp/suite/"
gunzip -f "$G"/trixie/tmp/suite/tests/*.gz
cargo build -q --release --bin ferroce
cp target/release/ferroce "$G/ferroce"
# Two runs: as is, then with `ferroce sysfs`'s tree bind-mounted over the root's
# /sys/class/infiniband (as a container would be given it): tests that read the kernel's
# sysfs by its path (test_get_pkey_index) and the rdma_cm tests, which look for the device's
# interface under device/net, find ferroce0 there.
run='chroot $R env LD_LIBRARY_PATH=/opt/ferroce FERROCE_DEVICES=10.77.0.11 timeout 1500 python3 /tmp/suite/tests/run_tests.py --dev ferroce0 --gid 1 -v 2>&1; echo "suite rc=$?"'
out=$(gexec 1 "
  rdma link delete rxe0 2>/dev/null; modprobe -r rdma_rxe 2>/dev/null
  modprobe ib_uverbs && modprobe rdma_ucm
  R=/host/trixie
  mount -t proc proc \$R/proc && mount --rbind /sys \$R/sys && mount --rbind /dev \$R/dev
  chroot \$R rdma link show -j; echo ' (rdma link show: '\$?')'
  echo '=== as is'
  $run
  FERROCE_DEVICES=10.77.0.11 /host/ferroce sysfs /tmp/fsys >/dev/null && mount --bind /tmp/fsys/class/infiniband \$R/sys/class/infiniband
  echo '=== with ferroce sysfs'
  $run" 3400) || true
log=${FERROCE_USERLAND_LOG:-/tmp/ferroce-pyverbs-56.log}
echo "$out" > "$log"
plain=$(sed -n '/^=== as is/,/^=== with/p' <<<"$out")
tree=$(sed -n '/^=== with ferroce sysfs/,$p' <<<"$out")
count() { grep -E '^(Ran|OK|FAILED)' <<<"$1" | tr '\n' ' '; }
echo "INFO pyverbs suite of rdma-core 56 in a lab guest (kernel ib_core for rdma link show), as is: $(count "$plain")"
grep -E '^(ERROR|FAIL):' <<<"$plain" | head -n 20 || true
echo "INFO the same with ferroce sysfs's tree over /sys/class/infiniband: $(count "$tree")"
grep -E '^(ERROR|FAIL):' <<<"$tree" | head -n 40 || true
echo "(whole output: $log)"
# With the tree the rdma_cm tests must have run, not skipped for want of an interface.
if grep -q "doesn't have net interface" <<<"$tree"; then
    echo "userland guest: the rdma_cm tests skipped with the sysfs tree in place"
    exit 1
fi
# ATOMIC WRITE and FLUSH (rdma-core 45's verbs), rdma_cm's multicast and XRC must run, not
# skip.
for t in test_qp_ex_rc_atomic_write test_qp_ex_rc_flush test_qp_ex_rc_flush_type_violate \
    test_rdmacm_async_multicast_traffic test_rdmacm_async_ex_multicast_traffic \
    test_rdmacm_async_ex_leave_multicast_traffic test_xrc_atomic_fetch_and_add \
    test_xrc_atomic_cmp_and_swap test_xrc_traffic_cq_ex test_qp_ex_xrc_send \
    test_qp_ex_xrc_send_imm test_odp_xrc_traffic test_ro_xrc_traffic; do
    # The verdict may follow warnings the test's forked players print on lines of their own.
    if ! awk -v t="$t" '$1 == t { f = 1 } f && /(\.\.\. |^)ok$/ { ok = 1; exit }
                        f && /(skipped|FAIL|ERROR)/ { exit } END { exit !ok }' <<<"$tree"; then
        echo "userland guest: $t did not pass: $(grep "^$t " <<<"$tree" | head -n 1)"
        exit 1
    fi
done
grep -q '^OK' <<<"$tree"
