# Sourced by suite.sh: the lab's life cycle and helpers. Adapted from shared/rxe-vm/run-guest.sh.
#   lab_up N MTU     namespace $NS with bridge br0 10.77.0.1/24 (MTU), N guests (gK = 10.77.0.(10+K))
#   lab_down         powers the guests off, kills what is left, deletes the namespace (also on EXIT)
#   gexec K 'cmd' [timeout] / gspawn K 'cmd' / gwait K ID [timeout]    run commands in guest K
#   nsexec cmd...    a host command inside the namespace (ferroce runs here, on 10.77.0.1)
#   gstate K FILE    what guest K's rxe, its programs and its NIC are doing (a stalled scenario)
#   cap_start FILE / cap_stop                                          dumpcap on br0
# Everything lives in the namespace; nothing touches the root namespace's network.
# The image build.sh made for $FERROCE_LAB_SUITE (bookworm: kernel 6.1; trixie: 6.12).
case "${FERROCE_LAB_SUITE:-bookworm}" in
  trixie) LAB_CACHE=${FERROCE_LAB_CACHE:-/var/tmp/ferroce-rxe-lab-trixie} ;;
  *) LAB_CACHE=${FERROCE_LAB_CACHE:-/var/tmp/ferroce-rxe-lab} ;;
esac
NS=${FERROCE_LAB_NS:-ferrocelab$$}
QPIDS=()
CAPPID=
T0=$(date +%s.%N)
ts() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%6.1f", b-a}'; }
log() { echo "[lab $(ts)s] $*" >&2; }
gip() { echo "10.77.0.$((10+$1))"; }

lab_down() {
  [ -n "$CAPPID" ] && cap_stop
  for g in "${RUN:-/nonexistent}"/g*; do [ -d "$g" ] && touch "$g/stop"; done
  local i p alive
  for i in $(seq 1 60); do
    alive=0; for p in "${QPIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.1
  done
  for p in "${QPIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  QPIDS=()
  if ip netns list | grep -qw "$NS"; then
    ip netns pids "$NS" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$NS"
  fi
}

lab_up() { # N MTU
  local n=$1 mtu=$2 k
  LAB_N=$n; LAB_MTU=$mtu
  RUN=$(mktemp -d /tmp/ferroce-lab.XXXXXX)
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip -n "$NS" link add br0 type bridge forward_delay 0 stp_state 0
  ip -n "$NS" link set br0 mtu "$mtu"
  ip -n "$NS" addr add 10.77.0.1/24 dev br0
  ip -n "$NS" link set br0 up
  local accel=tcg cpu="-cpu max"
  # /dev/kvm on these machines is kvm_pvm and cannot boot a stock kernel: TCG unless real KVM.
  if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_amd ] || [ -d /sys/module/kvm_intel ]; }; then accel=kvm; cpu="-cpu host"; fi
  for k in $(seq 1 "$n"); do
    ip -n "$NS" tuntap add "tap$k" mode tap
    ip -n "$NS" link set "tap$k" mtu "$mtu" master br0 up
    local G=$RUN/g$k; mkdir -p "$G/cmd" "$G/out"
    ip netns exec "$NS" qemu-system-x86_64 -machine q35,accel=$accel $cpu -m 768 -smp 1 \
      -display none -monitor none -serial "file:$G/console.log" -no-reboot \
      -kernel "$LAB_CACHE/vmlinuz" -initrd "$LAB_CACHE/rootfs.cpio.zst" \
      -append "console=ttyS0 quiet panic=-1 rxe.name=g$k rxe.ip=$(gip "$k")/24 rxe.mtu=$mtu rxe.rxe=1 rxe.life=1800" \
      -netdev tap,id=n0,ifname=tap$k,script=no,downscript=no -device virtio-net-pci,netdev=n0,mac=$(printf '52:54:00:77:00:%02x' $((10+k))) \
      -fsdev local,id=fs0,path="$G",security_model=none -device virtio-9p-pci,fsdev=fs0,mount_tag=hostshare \
      -device virtio-rng-pci >"$G/qemu.log" 2>&1 &
    QPIDS+=($!)
  done
  for k in $(seq 1 "$n"); do
    local i
    for i in $(seq 1 1800); do [ -f "$RUN/g$k/ready" ] && break; kill -0 "${QPIDS[$((k-1))]}" 2>/dev/null || break; sleep 0.1; done
    if [ ! -f "$RUN/g$k/ready" ]; then log "guest $k did not boot"; tail -n 20 "$RUN/g$k/console.log" >&2; return 1; fi
  done
  log "lab up: $n guest(s) ($accel), bridge MTU $mtu, namespace $NS"
}

gspawn() { # K CMD -> job id
  local k=$1; shift; local n id
  n=$(( $(cat "$RUN/jobseq" 2>/dev/null || echo 0) + 1 )); echo $n > "$RUN/jobseq"; id=$(printf 'j%04d' $n)
  printf '%s\n' "$*" > "$RUN/g$k/cmd/$id.tmp" && mv "$RUN/g$k/cmd/$id.tmp" "$RUN/g$k/cmd/$id.sh"
  echo "$id"
}
gwait() { # K ID [TIMEOUT]; 124 when the job did not end in time, 125 when the guest is gone
  local k=$1 id=$2 to=${3:-120} i
  for i in $(seq 1 $((to*10))); do
    [ -f "$RUN/g$k/out/$id.rc" ] && break
    # A guest whose kernel panicked is gone (-no-reboot): no job of it will end.
    if [ $((i % 10)) = 0 ] && ! kill -0 "${QPIDS[$((k-1))]:-0}" 2>/dev/null; then
      cat "$RUN/g$k/out/$id.out" 2>/dev/null
      echo "[lab] g$k is gone (its emulator exited) before job $id ended: $(grep -m1 -E 'Kernel panic|BUG:|Oops' "$RUN/g$k/console.log")" >&2
      return 125
    fi
    sleep 0.1
  done
  cat "$RUN/g$k/out/$id.out" 2>/dev/null
  if [ -f "$RUN/g$k/out/$id.rc" ]; then return "$(cat "$RUN/g$k/out/$id.rc")"; fi
  echo "[lab] timeout waiting for g$k job $id" >&2; return 124
}
gexec() { local id; id=$(gspawn "$1" "$2"); gwait "$1" "$id" "${3:-120}"; }
nsexec() { ip netns exec "$NS" "$@"; }
# A scenario that stalls leaves its guest as it was: where each RDMA program waits (in the
# kernel or not, and on what), rxe's QPs as the kernel sees them (sq-psn is the requester's next
# PSN), rxe's counters, the NIC's queue and drops and whether it still transmits (a stuck
# transmit queue holds rxe's skbs, and rxe's requester waits for them to be freed), the softirqs
# run over one second (a CPU that spins in rxe's tasks shows there), and the kernel's stacks
# and warnings (sysrq w and l, a NETDEV WATCHDOG line; from dmesg).
gstate() { # K FILE
  local k=$1 file=$2
  gexec "$k" 'for p in $(pidof rdma_peer ib_write_bw ib_send_lat ib_send_bw rping); do
      echo "== $(cat /proc/$p/comm) $p: $(grep ^State /proc/$p/status) wchan=$(cat /proc/$p/wchan) syscall=$(cat /proc/$p/syscall)"
      cat /proc/$p/stack
    done
    echo "== rdma res show qp"; rdma res show qp
    echo "== rdma statistic show"; rdma statistic show
    echo "== tc -s qdisc show dev eth0"; tc -s qdisc show dev eth0
    echo "== ip -s link show eth0"; ip -s link show eth0
    echo "== eth0 transmits? (tx-0 timeouts, then a ping of the host and the counters after it)"
    cat /sys/class/net/eth0/queues/tx-0/tx_timeout
    ping -c 1 -W 2 10.77.0.1 | grep -E "transmitted|bytes from"; ip -s link show eth0 | tail -n 2
    echo "== /proc/softirqs, then one second later"; grep -E "NET_TX|NET_RX|TASKLET|TIMER" /proc/softirqs
    sleep 1; grep -E "NET_TX|NET_RX|TASKLET|TIMER" /proc/softirqs
    echo "== top"; top -b -n 1 | head -n 12
    echo w > /proc/sysrq-trigger; echo l > /proc/sysrq-trigger
    echo "== dmesg (sysrq w, l)"; dmesg | tail -n 120' 60 > "$file" 2>&1
}
cap_start() { # FILE
  CAPFILE=$1
  # dumpcap itself (tshark's capture child, installed with it), so that the process stopped
  # below is the one writing the file: a tshark killed while busy left its dumpcap writing on,
  # and the file was read half-written (a FAIL whose capture, read again later, was whole).
  ip netns exec "$NS" dumpcap -q -P -i br0 -f "udp port 4791 or tcp" -a duration:600 -w "$CAPFILE" >"$CAPFILE.log" 2>&1 &
  CAPPID=$!
  local i; for i in $(seq 1 50); do grep -q "Capturing on" "$CAPFILE.log" 2>/dev/null && break; sleep 0.1; done
}
cap_stop() {
  [ -z "$CAPPID" ] && return 0
  sleep 0.3; kill -INT "$CAPPID" 2>/dev/null
  # SIGINT: dumpcap writes what it holds and exits; it has 20 s on a loaded machine.
  local i; for i in $(seq 1 200); do kill -0 "$CAPPID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$CAPPID" 2>/dev/null; wait "$CAPPID" 2>/dev/null; CAPPID=; rm -f "$CAPFILE.log"
}
