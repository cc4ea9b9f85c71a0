#!/bin/bash
# ferroce against kernel Soft-RoCE (rdma_rxe) in QEMU guests: one line per scenario, then
# "N passed, N failed". ferroce runs on the host side of the lab's bridge (10.77.0.1, inside the
# lab's namespace); kernel rxe in guest g1 (10.77.0.11). A failing scenario keeps its pcap under
# $FERROCE_LAB_OUT (default /tmp/ferroce-interop) and `ferroce pcap` decodes it.
#   tests/interop/suite.sh            build (or reuse) the image, run every scenario
#   SCENARIOS="pingpong matrix loss programs shared cm rsockets fuzz bench"  a subset of these groups (default: all)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
OUT=${FERROCE_LAB_OUT:-/tmp/ferroce-interop}
mkdir -p "$OUT"
FERROCE=${FERROCE_BIN:-$TOP/target/release/ferroce}
[ -x "$FERROCE" ] || (cd "$TOP" && cargo build -q --release --bin ferroce) || { echo "cannot build ferroce"; exit 2; }
"$HERE/build.sh" || { echo "interop: cannot build the guest image"; exit 2; }
# The C peer: built here against Debian's libibverbs-dev, run unmodified in the guest.
PEER_BIN=$OUT/rdma_peer
if ! [ -f /usr/include/infiniband/verbs.h ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs-dev >/dev/null 2>&1 || true
fi
cc -O2 -Wall -o "$PEER_BIN" "$HERE/peer/rdma_peer.c" -libverbs 2>"$OUT/rdma_peer.build.log" || PEER_BIN=
# The reject peer of the cm group (a librdmacm program; librdmacm-dev's header).
REJECT_BIN=$OUT/cm_reject
if ! [ -f /usr/include/rdma/rdma_cma.h ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq librdmacm-dev >/dev/null 2>&1 || true
fi
cc -O2 -Wall -o "$REJECT_BIN" "$HERE/peer/cm_reject.c" -lrdmacm -libverbs 2>"$OUT/cm_reject.build.log" || REJECT_BIN=
# The bench group's late-listen server (an LD_PRELOAD library for the server only).
LATE_SO=$OUT/late_listen.so
cc -O2 -Wall -shared -fPIC -o "$LATE_SO" "$HERE/peer/late_listen.c" -ldl 2>"$OUT/late_listen.build.log" || LATE_SO=
# The ferroce side of the operation matrix (tests/tests/rxe_interop.rs).
MATRIX_BIN=$(cd "$TOP" && cargo test -q --release -p ferroce-tests --test rxe_interop --no-run 2>&1 | grep -o '/[^ ]*target/release/deps/rxe_interop-[0-9a-f]*' | head -n 1)
[ -n "$MATRIX_BIN" ] || MATRIX_BIN=$(ls -t "$TOP"/target/release/deps/rxe_interop-* 2>/dev/null | grep -v '\.d$' | head -n 1)
# shellcheck source=lab.sh
source "$HERE/lab.sh"
trap 'lab_down' EXIT
PASS=0; FAIL=0
result() { # NAME OK DETAIL
  if [ "$2" = 1 ]; then PASS=$((PASS+1)); echo "PASS $1"
  elif [ "$AGAIN" = 1 ] && guest_gone; then GONE_SEEN=1; echo "LOST $1 $3 (a guest or its network is gone: the scenario runs again)"
  else FAIL=$((FAIL+1)); echo "FAIL $1 $3"; fi
}
# A guest whose kernel died fails the scenario it was in and every later one of its lab: seen
# on 6.12 under TCG, kernel rxe double-faulting in rxe_requester's skb allocation with ferroce
# as the peer, once in some ten runs. A scenario run through `again` that fails while a guest is
# gone (its emulator exited: -no-reboot) is reported LOST, not counted; the consoles go to
# $OUT/gone.txt, the lab boots again as it was (its guests, MTU, the files and addresses the
# scenarios expect) and the scenario runs once more, where a failure counts. At most
# AGAIN_MAX (3) such reboots a run: a kernel that keeps dying fails the run.
# A guest whose network died is gone too: under TCG its virtio-net transmit queue can stall
# for good (docs/interop.md), and then every later scenario of its lab fails (as it seemed
# in a CI run of 2026-12-07 on 6.1: rxe's rstream client stopped sending in the middle of a
# WRITE, and no rdma_cm connect reached the guest after it). Told by the guest's own ping of
# the host (the host has no ping; the guest's jobs come through its share, not the network),
# which a guest whose network works answers within seconds, whatever the scenario did to
# RDMA; its state is kept in $OUT/deaf-gK.txt.
AGAIN=0; GONE_SEEN=0; AGAIN_REBOOTS=0; AGAIN_MAX=${AGAIN_MAX:-3}
guest_gone() {
  local p k
  for p in "${QPIDS[@]}"; do kill -0 "$p" 2>/dev/null || return 0; done
  for k in $(seq 1 "$LAB_N"); do
    if ! gexec "$k" "ping -c 3 -W 3 10.77.0.1 >/dev/null" 30 >/dev/null 2>&1; then
      echo "[lab] g$k no longer reaches the host (its ping of 10.77.0.1 failed): its network is gone" >&2
      gstate "$k" "$OUT/deaf-g$k.txt"
      return 0
    fi
  done
  return 1
}
# lab_up, and the files the one-guest scenarios expect in g1's share: cm_reject (the cm
# group's reject peer and the fuzzer's CM listener).
lab_boot() { # N MTU
  lab_up "$1" "$2" || return 1
  if [ -n "$REJECT_BIN" ]; then cp "$REJECT_BIN" "$RUN/g1/cm_reject"; fi
}
# The guest's IPv6 address and rxe0's GID for it (the cm group's IPv6 scenarios).
lab_ipv6() {
  ip -n "$NS" -6 addr replace fd77::1/64 dev br0 nodad \
    && gexec 1 "ip -6 addr replace fd77::11/64 dev eth0 nodad; for i in \$(seq 1 50); do grep -qs ^fd77 /sys/class/infiniband/rxe0/ports/1/gids/* && exit 0; sleep 0.1; done; exit 1" 30 >/dev/null
}
again() { # SCENARIO ARGS...
  local p=$PASS f=$FAIL k
  AGAIN=1; GONE_SEEN=0
  "$@"
  AGAIN=0
  [ $GONE_SEEN = 1 ] || return 0
  AGAIN_REBOOTS=$((AGAIN_REBOOTS + 1))
  for k in $(seq 1 "$LAB_N"); do
    { echo "== g$k in $*: qemu $(kill -0 "${QPIDS[$((k-1))]}" 2>/dev/null && echo alive || echo exited); console tail:"
      tail -n 80 "$RUN/g$k/console.log"; } >> "$OUT/gone.txt" 2>&1
  done
  if [ $AGAIN_REBOOTS -gt "$AGAIN_MAX" ]; then
    result "$1: a guest died or lost its network in it, and $AGAIN_MAX reboots were spent already (consoles: $OUT/gone.txt)" 0 ""
    return
  fi
  local why; why=$(grep -m1 -hE 'Kernel panic|BUG:|Oops|double fault' "$RUN"/g*/console.log)
  echo "RETRY $1: a guest died or lost its network in it (${why:-no panic on its console}; consoles: $OUT/gone.txt); the lab boots again" >&2
  PASS=$p; FAIL=$f
  lab_down
  if ! lab_boot "$LAB_N" "$LAB_MTU"; then result "lab boot again after a guest died or lost its network in $1" 0 ""; return; fi
  if [ -n "${CM_GUEST:-}" ] && ! lab_ipv6; then result "$1: IPv6 again after a reboot" 0 ""; return; fi
  "$@"
}
G=10.77.0.11
SCENARIOS=${SCENARIOS:-pingpong matrix loss programs shared cm rsockets fuzz bench}
want() { [[ " $SCENARIOS " == *" $1 "* ]]; }

# perftest times its cycle counter against the clock and refuses to report when the two
# correlate poorly ("Correlation coefficient r^2: ... < 0.9", "Can't produce a report"): an
# emulated guest under load, on either stack, after the transfer, before any figure. Such a
# run is made once more, and says so (RETRY); a second refusal fails.
clock_refused() { # FILE OUTPUT
  grep -q "Can't produce a report" "$1" 2>/dev/null || echo "$2" | grep -q "Can't produce a report"
}
# ferroce's libibverbs.so.1 (ibverbs/build.sh) for the unmodified-programs group.
IBV_DIR=
if want programs || want cm || want rsockets || want bench; then
  IBV_DIR=$OUT/ibverbs
  # Both drop-in libraries: libibverbs.so.1 and librdmacm.so.1 (the cm group's programs).
  "$TOP/librdmacm/build.sh" "$IBV_DIR" >"$OUT/ibverbs.build.log" 2>&1 || IBV_DIR=
fi

# ibv_rc_pingpong between ferroce (host) and rxe (guest). ROLE: ferroce-server | rxe-server.
pingpong() { # ROLE SIZE MTU ITERS PORT [TAG]
  local role=$1 size=$2 mtu=$3 iters=$4 port=$5 name="rc_pingpong ${1} s=$2 mtu=$3${6:+ $6}"
  local opts="-g 1 -p $port -s $size -m $mtu -n $iters" fo="$OUT/pp.$$.ferroce" go ok=0
  local pcap="$OUT/$(echo "$name" | tr ' =' '_-').pcap"
  cap_start "$pcap"
  if [ "$role" = ferroce-server ]; then
    nsexec env ${FERROCE_ENV:-FERROCE_LAB=1} timeout 300 "$FERROCE" rc-pingpong -d 10.77.0.1 $opts >"$fo" 2>&1 &
    local fp=$!
    sleep 0.5
    go=$(gexec 1 "timeout 280 ibv_rc_pingpong -d rxe0 $opts 10.77.0.1" 300); local grc=$?
    # A guest that is gone leaves the server waiting for nobody: ended now, not at its timeout.
    [ $grc = 125 ] && pkill -f -- "rc-pingpong -d 10.77.0.1 $opts\$"
    wait $fp; local frc=$?
  else
    local id; id=$(gspawn 1 "timeout 280 ibv_rc_pingpong -d rxe0 $opts")
    gexec 1 "for i in \$(seq 1 100); do ss -Htln 'sport = :$port' | grep -q . && exit 0; sleep 0.1; done" 30 >/dev/null
    nsexec env ${FERROCE_ENV:-FERROCE_LAB=1} timeout 300 "$FERROCE" rc-pingpong -d 10.77.0.1 $opts $G >"$fo" 2>&1; local frc=$?
    go=$(gwait 1 "$id" 300); local grc=$?
  fi
  cap_stop
  local bytes=$((size * iters * 2))
  # Every packet on the bridge, rxe's and ferroce's, must decode with a right ICRC (the capture
  # has the IP header, so all 32 bits are checked).
  local pc; pc=$("$FERROCE" pcap --strict "$pcap" 2>&1 | tail -n 1)
  if [ $frc = 0 ] && [ $grc = 0 ] && grep -q "^$iters iters in" "$fo" && echo "$go" | grep -q "^$iters iters in" \
     && grep -q "^$bytes bytes in" "$fo" && echo "$go" | grep -q "^$bytes bytes in" \
     && echo "$pc" | grep -Eq '^[1-9][0-9]* packets, [0-9]+ icrc ok, 0 icrc bad, 0 malformed$'; then
    ok=1; rm -f "$pcap"
  else
    { echo "== ferroce (rc=$frc)"; cat "$fo"; echo "== rxe (rc=$grc)"; echo "$go"; echo "== ferroce pcap"; "$FERROCE" pcap "$pcap" | tail -n 5
      echo "== ferroce pcap --strict: $pc"; "$FERROCE" pcap --strict "$pcap" 2>&1 | grep -Ei 'bad|malformed|error|truncat' | head -n 20; } > "${pcap%.pcap}.txt" 2>&1
  fi
  rm -f "$fo"
  result "$name" $ok "(see ${pcap%.pcap}.txt)"
}

# An unmodified rdma-core or perftest program on ferroce (through ferroce's libibverbs.so.1,
# device ferroce0 = 10.77.0.1) against the same program on rxe0. ROLE: ferroce-server |
# rxe-server. Passes when both exit 0 with their own success output (the passive side of
# ib_read_lat prints no figures) and every packet of the run has a right ICRC.
program() { # ROLE PROG PORT ARGS...
  local all=("$@")
  local role=$1 prog=$2 port=$3; shift 3
  local args="$* -p $port" name fo="$OUT/prog.$$.ferroce" go ok=0
  name="$prog $role${*:+ $*}"
  if [ -z "$IBV_DIR" ]; then result "$name" 0 "(ferroce's libibverbs did not build: $OUT/ibverbs.build.log)"; return; fi
  local pcap="$OUT/$(echo "$name" | tr ' =' '_-').pcap"
  local fenv="LD_LIBRARY_PATH=$IBV_DIR FERROCE_DEVICES=10.77.0.1"
  cap_start "$pcap"
  if [ "$role" = ferroce-server ]; then
    nsexec env $fenv timeout 300 "$prog" -d ferroce0 $args >"$fo" 2>&1 &
    local fp=$!
    for i in $(seq 1 100); do nsexec ss -Htln "sport = :$port" | grep -q . && break; sleep 0.1; done
    go=$(gexec 1 "timeout 280 $prog -d rxe0 $args 10.77.0.1" 300); local grc=$?
    wait $fp; local frc=$?
  else
    local id; id=$(gspawn 1 "timeout 280 $prog -d rxe0 $args")
    gexec 1 "for i in \$(seq 1 100); do ss -Htln 'sport = :$port' | grep -q . && exit 0; sleep 0.1; done" 30 >/dev/null
    nsexec env $fenv timeout 300 "$prog" -d ferroce0 $args $G >"$fo" 2>&1; local frc=$?
    go=$(gwait 1 "$id" 300); local grc=$?
  fi
  cap_stop
  local pc; pc=$("$FERROCE" pcap --strict "$pcap" 2>&1 | tail -n 1)
  reported() { # OUTPUT PASSIVE
    case $prog in
      ibv_*) echo "$1" | grep -q ' iters in ' ;;
      ib_read_lat) [ "$2" = 1 ] || echo "$1" | grep -A1 '#bytes' | tail -n 1 | grep -Eq '^ *[0-9]+ +[0-9]+' ;;
      *) echo "$1" | grep -A1 '#bytes' | tail -n 1 | grep -Eq '^ *[0-9]+ +[0-9]+' ;;
    esac
  }
  local fpassive=0 gpassive=0
  [ "$role" = ferroce-server ] && fpassive=1 || gpassive=1
  if [ $frc = 0 ] && [ $grc = 0 ] && reported "$(cat "$fo")" $fpassive && reported "$go" $gpassive \
     && echo "$pc" | grep -Eq '^[1-9][0-9]* packets, [0-9]+ icrc ok, 0 icrc bad, 0 malformed$'; then
    ok=1; rm -f "$pcap"
  else
    { echo "== ferroce (rc=$frc)"; cat "$fo"; echo "== rxe (rc=$grc)"; echo "$go"; echo "== ferroce pcap"; "$FERROCE" pcap "$pcap" | tail -n 5; } > "${pcap%.pcap}.txt" 2>&1
  fi
  if [ $ok = 0 ] && [ -z "${RETRYING:-}" ] && clock_refused "$fo" "$go"; then
    echo "RETRY $name: perftest could not time its cycle counter (r^2 < 0.9); once more"
    rm -f "$fo"; RETRYING=1 program "${all[@]}"; return
  fi
  rm -f "$fo"
  result "$name" $ok "(see ${pcap%.pcap}.txt)"
}

# An unmodified rdma_cm program on ferroce (its librdmacm.so.1 and libibverbs.so.1) against the
# same program on rxe0 under the kernel's rdma_cm, ROLE ferroce-server | rxe-server. SARGS are
# the server's arguments (@ stands for its own address), CARGS the client's (@ for the
# server's); CM_HOST/CM_GUEST replace the two IPv4 addresses (the IPv6 runs) and CM_TAG names
# the run. Passes when both exit 0, the output shows WANT, and every packet of the run,
# CM MADs included, decodes with a right ICRC (`ferroce pcap --strict`).
cm_pair() { # ROLE PROG WANT SARGS CARGS   (PROG: one program, or SERVER|CLIENT)
  local role=$1 prog=$2 want=$3 sargs=$4 cargs=$5 fo="$OUT/cm.$$.ferroce" go ok=0
  local sprog=${prog%%|*} cprog=${prog##*|}
  local name="rdma_cm ${prog//|//} $role${CM_TAG:-}" H=${CM_HOST:-10.77.0.1} GA=${CM_GUEST:-$G}
  if [ -z "$IBV_DIR" ]; then result "$name" 0 "(ferroce's libraries did not build: $OUT/ibverbs.build.log)"; return; fi
  local pcap="$OUT/$(echo "$name" | tr ' =/:' '_-__')-mtu$mtu.pcap"
  local fenv="LD_LIBRARY_PATH=$IBV_DIR FERROCE_DEVICES=$H"
  cap_start "$pcap"
  if [ "$role" = ferroce-server ]; then
    local fs=${sargs//@/$H} gc=${cargs//@/$H}
    nsexec env $fenv timeout 120 $sprog ${fs//DEV/ferroce0} >"$fo" 2>&1 &
    local fp=$!
    sleep 1.5
    go=$(gexec 1 "timeout 100 $cprog ${gc//DEV/rxe0}" 120); local grc=$?
    wait $fp; local frc=$?
  else
    local gs=${sargs//@/$GA} fc=${cargs//@/$GA} try frc
    local id; id=$(gspawn 1 "timeout 100 $sprog ${gs//DEV/rxe0}")
    sleep 2
    # rdma_cm listeners are not in ss: a REQ before the guest's (slow, emulated) server
    # listens is rejected (8) by its kernel CM, a SIDR_REQ answered with status 1 (no such
    # service: UNREACHABLE, error 1; rconnect's ECONNREFUSED), and the client is tried again.
    for try in 1 2 3 4 5 6 7 8 9 10; do
      nsexec env $fenv timeout 120 $cprog ${fc//DEV/ferroce0} >"$fo" 2>&1; frc=$?
      { [ $frc != 0 ] && grep -Eq 'REJECTED|UNREACHABLE, error: 1$|Connection refused' "$fo"; } || break
      sleep 1
    done
    go=$(gwait 1 "$id" 120); local grc=$?
  fi
  cap_stop
  # rdma-core 44's rping: its event thread calls rdma_get_cm_event once more after the main
  # thread destroyed the channel and exits 255 on the EBADF, on either stack (fixed upstream
  # in rping, rdma-core 61); the data lines are checked below all the same. The message is
  # rping's stderr, written at once, and its data lines stdout, buffered until exit: it may
  # stand anywhere in the output.
  if [ "${cprog##*/}" = rping ]; then
    [ "$frc" = 255 ] && grep -qx "rdma_get_cm_event: Bad file descriptor" "$fo" && frc=0
    [ "$grc" = 255 ] && echo "$go" | grep -qx "rdma_get_cm_event: Bad file descriptor" && grc=0
  fi
  local pc; pc=$("$FERROCE" pcap --strict "$pcap" 2>&1 | tail -n 1)
  local mads; mads=$("$FERROCE" pcap "$pcap" 2>/dev/null | grep -c '^  CM ')
  if [ $frc = 0 ] && [ $grc = 0 ] && grep -q -- "$want" "$fo" && echo "$go" | grep -q -- "$want" \
     && [ "$mads" -ge 2 ] && echo "$pc" | grep -Eq '^[1-9][0-9]* packets, [0-9]+ icrc ok, 0 icrc bad, 0 malformed$'; then
    ok=1; rm -f "$pcap"
  else
    { echo "== ferroce (rc=$frc)"; cat "$fo"; echo "== rxe (rc=$grc)"; echo "$go"; echo "== ferroce pcap ($mads CM MADs)"; "$FERROCE" pcap "$pcap" | tail -n 20; } > "${pcap%.pcap}.txt" 2>&1
  fi
  if [ $ok = 0 ] && [ -z "${RETRYING:-}" ] && clock_refused "$fo" "$go"; then
    echo "RETRY $name mtu $mtu: perftest could not time its cycle counter (r^2 < 0.9); once more"
    rm -f "$fo"; RETRYING=1 cm_pair "$@"; return
  fi
  rm -f "$fo"
  result "$name mtu $mtu" $ok "(see ${pcap%.pcap}.txt)"
}

# Multicast: mckey, unmodified, receiving on one side and sending on the other, through the
# kernel's rdma_cm and rxe's groups in the guest (the kernel joins the IP group on eth0) and
# ferroce's group sockets on the host. The sender starts once the receiver's host lists the
# group in /proc/net/igmp. ROLE ferroce-receiver | rxe-receiver. Passes when both exit 0 with
# "data transfers complete", the capture holds the receiver's messages sent to the group, and
# every packet decodes with a right ICRC. mckey destroys its QP right after posting its
# unsignaled sends: ferroce sends all 10 before, rxe 6.12 sometimes only the first (its send
# queue runs from a work queue), so a ferroce receiver waits for 1 of rxe's 10; and now and then
# (4 runs in 40) none: its destroy marks the QP invalid before the queued work runs, and
# rxe_requester then sends nothing. That run is told by rxe's own counter (sent_pkts the same
# before and after the sender), says RETRY with the counter, ends the ferroce receiver at once
# (there is nothing on the wire for it to wait for) and goes again; at most five tries.
mc_pair() { # ROLE
  local role=$1 name="rdma_cm mckey $1" fo="$OUT/mc.$$.ferroce" H=10.77.0.1 grp=239.77.0.9 go ok=0 frc grc need=10
  if [ -z "$IBV_DIR" ]; then result "$name" 0 "(ferroce's libraries did not build: $OUT/ibverbs.build.log)"; return; fi
  local fenv="LD_LIBRARY_PATH=$IBV_DIR FERROCE_DEVICES=$H"
  # /proc/net/igmp prints a group as its address's bytes read as a little-endian word.
  local key=09004DEF
  local pcap="$OUT/$(echo "$name" | tr ' =/:' '_-__')-mtu$mtu.pcap"
  cap_start "$pcap"
  if [ "$role" = ferroce-receiver ]; then
    need=1
    local try fp s0 s1 sent=/sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts
    for try in 1 2 3 4 5; do
      nsexec env $fenv timeout 60 mckey -m $grp -b $H -C 1 >"$fo" 2>&1 &
      fp=$!
      for _ in $(seq 1 400); do nsexec grep -q $key /proc/net/igmp && break; sleep 0.05; done
      s0=$(gexec 1 "cat $sent" 30)
      go=$(gexec 1 "timeout 50 mckey -m $grp -b $G -s -C 10" 60); grc=$?
      s1=$(gexec 1 "cat $sent" 30)
      if [ $try -lt 5 ] && [ $grc = 0 ] && [ -n "$s0" ] && [ "$s0" = "$s1" ]; then
        echo "RETRY $name mtu $mtu: rxe's mckey posted its sends and destroyed its QP before rxe sent any (sent_pkts $s0 before and after); once more"
        kill "$fp" 2>/dev/null; wait "$fp" 2>/dev/null
        continue
      fi
      wait "$fp"; frc=$?
      break
    done
  else
    local id; id=$(gspawn 1 "timeout 60 mckey -m $grp -b $G -C 10")
    gexec 1 "for i in \$(seq 1 400); do grep -q $key /proc/net/igmp && exit 0; sleep 0.05; done; exit 1" 40 >/dev/null
    nsexec env $fenv timeout 50 mckey -m $grp -b $H -s -C 10 >"$fo" 2>&1; frc=$?
    go=$(gwait 1 "$id" 60); grc=$?
  fi
  cap_stop
  local pc; pc=$("$FERROCE" pcap --strict "$pcap" 2>&1 | tail -n 1)
  local sends; sends=$("$FERROCE" pcap "$pcap" 2>/dev/null | grep -c "→ $grp ")
  if [ $frc = 0 ] && [ $grc = 0 ] && grep -q "data transfers complete" "$fo" \
     && echo "$go" | grep -q "data transfers complete" && [ "$sends" -ge "$need" ] \
     && echo "$pc" | grep -Eq '^[1-9][0-9]* packets, [0-9]+ icrc ok, 0 icrc bad, 0 malformed$'; then
    ok=1; rm -f "$pcap"
  else
    { echo "== ferroce (rc=$frc)"; cat "$fo"; echo "== rxe (rc=$grc)"; echo "$go"; echo "== pcap ($sends to $grp): $pc"; "$FERROCE" pcap "$pcap" | tail -n 20; } > "${pcap%.pcap}.txt" 2>&1
  fi
  rm -f "$fo"
  result "$name mtu $mtu" $ok "(see ${pcap%.pcap}.txt)"
}

# A reject with private data: the server (cm_reject, a plain librdmacm program) refuses the
# request with its own string; the client must see REJECTED 28 with the whole 148-byte REJ
# area and the string in it. ROLE ferroce-server | rxe-server.
cm_reject() { # ROLE
  local role=$1 out ok=0 name="rdma_cm reject with private data, $1" fo="$OUT/cmr.$$.ferroce"
  if [ -z "$IBV_DIR" ] || [ -z "$REJECT_BIN" ]; then result "$name" 0 "(no libraries or cm_reject: $OUT/cm_reject.build.log)"; return; fi
  local fenv="LD_LIBRARY_PATH=$IBV_DIR FERROCE_DEVICES=10.77.0.1" try
  if [ "$role" = ferroce-server ]; then
    nsexec env $fenv timeout 60 "$REJECT_BIN" server 10.77.0.1 7900 ferroce-says-no >"$fo" 2>&1 &
    local fp=$!
    sleep 1.5
    out=$(gexec 1 "timeout 50 /host/cm_reject client 10.77.0.1 7900" 60)
    wait $fp
    echo "$out" | grep -q 'REJECTED status 28 len 148 data ferroce-says-no' && ok=1
  else
    local id; id=$(gspawn 1 "timeout 60 /host/cm_reject server $G 7901 rxe-says-no")
    sleep 2
    for try in 1 2 3 4 5 6 7 8 9 10; do
      nsexec env $fenv timeout 50 "$REJECT_BIN" client $G 7901 >"$fo" 2>&1
      grep -q 'status 8 ' "$fo" || break
      sleep 1
    done
    out=$(cat "$fo")
    gwait 1 "$id" 60 >/dev/null
    echo "$out" | grep -q 'REJECTED status 28 len 148 data rxe-says-no' && ok=1
  fi
  rm -f "$fo"
  result "$name mtu $mtu" $ok "(client said: $out)"
}

# A REQ for a port nobody listens on: the other side's CM answers REJ "invalid service ID"
# (8) at once, and the client reports REJECTED 8. CLIENT_SIDE ferroce | rxe; on ferroce's
# address a ferroce rping server on another port keeps a CM running there.
# ferroce doctor on the host against the guest's kernel rxe: the kernel's MAD layer must answer
# the CM ClassPortInfo Get (no agent serves a Get: GetResp, status 0x000C), and a packet of the
# path MTU must reach the guest. The same answer ferroce's QP1 gives (transport/tests/cm.rs,
# qp1_stand_in.rs), checked here against the kernel it copies.
doctor_rxe() {
  local out rc name="doctor: kernel rxe answers the CM MAD probe mtu $mtu"
  out=$(nsexec timeout 60 "$FERROCE" doctor 10.77.0.1 $G 2>&1); rc=$?
  echo "$out" > "$OUT/doctor-mtu$mtu.txt"
  if echo "$out" | grep -q "^ok   $G answers on UDP 4791: a RoCE stack (.*GetResp status 0x000c" \
     && ! echo "$out" | grep -q '^FAIL'; then
    result "$name" 1 ""
  else
    result "$name" 0 "(exit $rc; see $OUT/doctor-mtu$mtu.txt)"
  fi
}

cm_closed_port() { # CLIENT_SIDE
  local side=$1 fo="$OUT/cmc.$$.ferroce" out ok=0 name="rdma_cm REQ to a closed port, $1 client"
  if [ -z "$IBV_DIR" ]; then result "$name" 0 "(no libraries)"; return; fi
  local pcap="$OUT/cm_closed_port_$side-mtu$mtu.pcap"
  local fenv="LD_LIBRARY_PATH=$IBV_DIR FERROCE_DEVICES=10.77.0.1"
  cap_start "$pcap"
  sleep 1
  if [ "$side" = ferroce ]; then
    nsexec env $fenv timeout 60 rping -c -a $G -p 7999 -C 1 >"$fo" 2>&1
    out=$(cat "$fo")
  else
    nsexec env $fenv timeout 60 rping -s -a 10.77.0.1 -p 7998 -C 1 >"$fo" 2>&1 &
    local fp=$!
    sleep 1.5
    out=$(gexec 1 "timeout 50 rping -c -a 10.77.0.1 -p 7999 -C 1" 60)
    kill $fp 2>/dev/null; wait $fp 2>/dev/null
  fi
  cap_stop
  local rej; rej=$("$FERROCE" pcap "$pcap" 2>/dev/null | grep -c ' reason=8')
  if echo "$out" | grep -q 'REJECTED, error 8' && [ "$rej" -ge 1 ]; then
    ok=1; rm -f "$pcap"
  else
    { echo "== client"; echo "$out"; echo "== pcap"; "$FERROCE" pcap "$pcap" | tail -n 20; } > "${pcap%.pcap}.txt" 2>&1
  fi
  rm -f "$fo"
  result "$name mtu $mtu" $ok "(see ${pcap%.pcap}.txt)"
}

# Two ferroce processes sharing the host's address at once, each with its own rxe program in
# the guest: pair A is a ferroce server with an rxe client, pair B an rxe server with a ferroce
# client, every byte checked (-c) at all four ends. Their QPNs' slot bytes differ, which shows
# both processes were members of the address's group at the same time.
shared() { # MTU
  local mtu=$1 opts="-g 1 -s 4096 -m $1 -n 200 -c" fa="$OUT/sh.$$.a" fb="$OUT/sh.$$.b" ok=0 i
  local name="two ferroce processes on 10.77.0.1 with two rxe programs at once mtu=$mtu"
  local pcap="$OUT/shared_address_mtu-$mtu.pcap"
  cap_start "$pcap"
  nsexec env FERROCE_LAB=1 timeout 300 "$FERROCE" rc-pingpong -d 10.77.0.1 $opts -p 18720 >"$fa" 2>&1 &
  local fpa=$!
  local idb; idb=$(gspawn 1 "timeout 280 ibv_rc_pingpong -d rxe0 $opts -p 18721")
  for i in $(seq 1 100); do nsexec ss -Htln "sport = :18720" | grep -q . && break; sleep 0.1; done
  gexec 1 "for i in \$(seq 1 100); do ss -Htln 'sport = :18721' | grep -q . && exit 0; sleep 0.1; done" 30 >/dev/null
  local ida; ida=$(gspawn 1 "timeout 280 ibv_rc_pingpong -d rxe0 $opts -p 18720 10.77.0.1")
  nsexec env FERROCE_LAB=1 timeout 300 "$FERROCE" rc-pingpong -d 10.77.0.1 $opts -p 18721 $G >"$fb" 2>&1 &
  local fpb=$!
  wait $fpa; local frca=$?
  wait $fpb; local frcb=$?
  local goa gob; goa=$(gwait 1 "$ida" 300); local grca=$?
  gob=$(gwait 1 "$idb" 300); local grcb=$?
  cap_stop
  local pc; pc=$("$FERROCE" pcap --strict "$pcap" 2>&1 | tail -n 1)
  # The slot byte of each ferroce process's QPN (bits 23:16).
  slot() { local q; q=$(grep -o 'local address: .*QPN 0x[0-9a-f]*' "$1" | grep -o '0x[0-9a-f]*$' | head -n 1); [ -n "$q" ] && echo $(( q >> 16 )); }
  local sa sb; sa=$(slot "$fa"); sb=$(slot "$fb")
  local bytes=$((4096 * 200 * 2)) done="^200 iters in"
  if [ $frca = 0 ] && [ $frcb = 0 ] && [ $grca = 0 ] && [ $grcb = 0 ] \
     && grep -q "$done" "$fa" && grep -q "$done" "$fb" && echo "$goa" | grep -q "$done" && echo "$gob" | grep -q "$done" \
     && grep -q "^$bytes bytes in" "$fa" && grep -q "^$bytes bytes in" "$fb" \
     && [ -n "$sa" ] && [ -n "$sb" ] && [ "$sa" != "$sb" ] \
     && echo "$pc" | grep -Eq '^[1-9][0-9]* packets, [0-9]+ icrc ok, 0 icrc bad, 0 malformed$'; then
    ok=1; rm -f "$pcap"
  else
    { echo "== ferroce A (rc=$frca, slot $sa)"; cat "$fa"; echo "== ferroce B (rc=$frcb, slot $sb)"; cat "$fb"
      echo "== rxe A (rc=$grca)"; echo "$goa"; echo "== rxe B (rc=$grcb)"; echo "$gob"; echo "== pcap"; echo "$pc"; } > "${pcap%.pcap}.txt" 2>&1
  fi
  rm -f "$fa" "$fb"
  result "$name (slots $sa, $sb)" $ok "(see ${pcap%.pcap}.txt)"
}

# Every operation both ways against the C peer, data and completions checked at both ends.
matrix() { # MTU TAG [ENV...]
  local mtu=$1 tag=$2; shift 2
  if [ -z "$PEER_BIN" ] || [ -z "$MATRIX_BIN" ]; then
    result "operation matrix vs rdma_peer mtu=$mtu $tag" 0 "(rdma_peer or the matrix test did not build: $OUT/rdma_peer.build.log)"
    return
  fi
  cp "$PEER_BIN" "$RUN/g1/rdma_peer"
  local pid i n=0 bad=0 verdict rest
  pid=$(gspawn 1 "/host/rdma_peer 18600 9437184")
  for i in $(seq 1 100); do grep -q LISTENING "$RUN/g1/out/$pid.out" 2>/dev/null && break; sleep 0.1; done
  # One capture for the whole matrix; kept, with its decoding, when any scenario in it fails.
  local pcap; pcap="$OUT/matrix_mtu-$mtu$(echo "${tag:+_$tag}" | sed 's/[ =%]/-/g').pcap"
  cap_start "$pcap"
  nsexec env FERROCE_RXE_PEER=$G:18600 FERROCE_RXE_LOCAL=10.77.0.1 FERROCE_RXE_MTU=$mtu FERROCE_RXE_TAG="$tag" "$@" \
    timeout 900 "$MATRIX_BIN" --ignored --exact rxe_peer_matrix --nocapture >"$OUT/matrix.$$.txt" 2>&1
  local mrc=$?
  while read -r verdict rest; do
    n=$((n+1))
    if [ "$verdict" = PASS ]; then result "$rest" 1 ""; else bad=1; result "${rest%%:*}" 0 "(${rest#*: }; capture: $pcap)"; fi
  done < <(grep -E '^(PASS|FAIL) ' "$OUT/matrix.$$.txt")
  [ $n -gt 0 ] || bad=1
  [ $n -gt 0 ] || result "operation matrix vs rdma_peer mtu=$mtu $tag" 0 "(no result: $(tail -n 3 "$OUT/matrix.$$.txt" | tr '\n' ' '))"
  # A matrix that stopped before its end (a panic, the timeout) fails here, whatever passed
  # before: the scenarios after the point it stopped did not run.
  if [ $n -gt 0 ] && ! grep -q '^MATRIX END ' "$OUT/matrix.$$.txt"; then
    bad=1; result "operation matrix vs rdma_peer mtu=$mtu $tag ran to its end" 0 "(rc=$mrc after $n scenarios: $(grep -v '^\[' "$OUT/matrix.$$.txt" | tail -n 3 | tr '\n' ' '))"
    # rdma_peer is still where the stall left it: what the guest was doing, beside the capture.
    gstate 1 "${pcap%.pcap}.guest.txt"; echo "[lab] the guest's state at the stop: ${pcap%.pcap}.guest.txt" >&2
  fi
  cap_stop
  # Every RoCE packet of the whole matrix, rxe's and ferroce's, must decode with a right ICRC.
  local pc; pc=$("$FERROCE" pcap --strict "$pcap" 2>&1 | tail -n 1)
  if echo "$pc" | grep -Eq '^[1-9][0-9]* packets, [0-9]+ icrc ok, 0 icrc bad, 0 malformed$'; then
    result "operation matrix capture mtu=$mtu${tag:+ $tag}: $pc" 1 ""
  else
    bad=1; result "operation matrix capture mtu=$mtu $tag" 0 "($pc; capture kept: $pcap)"
  fi
  if [ $bad = 0 ]; then rm -f "$pcap" "$pcap.log"; else "$FERROCE" pcap "$pcap" > "${pcap%.pcap}.txt" 2>&1; fi
  gwait 1 "$pid" 30 >/dev/null
  # The matrix's own output (with FERROCE_LOG, the engine's reasons) stays beside a kept capture.
  if [ $bad = 0 ]; then rm -f "$OUT/matrix.$$.txt"; else mv "$OUT/matrix.$$.txt" "${pcap%.pcap}.out"; fi
}

# ferroce fuzz against kernel rxe: rdma_peer in the guest is the agent (a fresh QP and a 64 KiB
# region for every case), every campaign (FUZZ_CAMPAIGN: a list) for FUZZ_SECONDS (default 90)
# from 10.77.0.1 (FUZZ_SEED, default 1), the
# guest's console watched for oopses, warnings and hangs. rxe's known deviations
# (FUZZ_KNOWN_RXE, docs/interop.md) are reported, not failed; anything else, a hang, a crash or a
# console splat fails the scenario.
# The kernel's CM answers a REQ MAD cut short now and then (REJ 12, invalid GID: the missing
# tail read as the fields past the datagram's end) where MADs are 256 bytes (docs/interop.md).
FUZZ_KNOWN_RXE=${FUZZ_KNOWN_RXE:-a MAD shorter than 256 bytes is dropped silently}
fuzz_rxe() {
  if [ -z "$PEER_BIN" ]; then result "fuzz: campaigns against rxe" 0 "(rdma_peer did not build)"; return; fi
  cp "$PEER_BIN" "$RUN/g1/rdma_peer"
  local pid rc out="$OUT/fuzz-rxe.txt" pcap="$OUT/fuzz-rxe.pcap" lines0 splat last unknown
  lines0=$(wc -l < "$RUN/g1/console.log")
  # The fuzzer's own address on the bridge: its plain UDP socket cannot share 10.77.0.1:4791
  # with ferroce processes of earlier scenarios that may still be running (they share it as
  # one reuseport group).
  local F=10.77.0.2
  ip -n "$NS" addr add $F/24 dev br0 2>/dev/null || true
  # The cm campaign's rdma_cm listener (rejects every request, reason 28).
  local cmpid=""
  if [ -n "$REJECT_BIN" ]; then
    cmpid=$(gspawn 1 "timeout $(( ${FUZZ_SECONDS:-90} + 200 )) /host/cm_reject serve $G 7471 fuzz")
  fi
  pid=$(gspawn 1 "/host/rdma_peer 18800 65536")
  gexec 1 "for i in \$(seq 1 100); do ss -Htln 'sport = :18800' | grep -q . && exit 0; sleep 0.1; done" 30 >/dev/null
  nsexec timeout $(( ${FUZZ_SECONDS:-90} + 120 )) "$FERROCE" fuzz --target $G --local $F --agent-port 18800 --campaign "${FUZZ_CAMPAIGN:-all}" \
    --seconds "${FUZZ_SECONDS:-90}" --seed "${FUZZ_SEED:-1}" -q --pcap "$pcap" >"$out" 2>&1; rc=$?
  gwait 1 "$pid" 30 >/dev/null
  [ -n "$cmpid" ] && { gexec 1 "pkill -x cm_reject; true" 20 >/dev/null; gwait 1 "$cmpid" 30 >/dev/null; }
  sleep 1
  splat=$(tail -n +"$((lines0 + 1))" "$RUN/g1/console.log" | grep -E "BUG:|WARNING:|Oops|Call Trace|general protection|hung_task|soft lockup|rcu_sched detected" | head -n 5)
  last=$(tail -n 1 "$out")
  # Deviations whose rule is not a known rxe one.
  unknown=$(grep -E '^    [0-9]+ × ' "$out" | sed 's/^ *[0-9]* × //' | sort -u | while read -r rule; do
    case "|$FUZZ_KNOWN_RXE|" in *"|$rule|"*) ;; *) echo "$rule";; esac; done)
  sed -n '/^campaign /,$p' "$out"
  [ -n "$splat" ] && { echo "guest console:"; echo "$splat"; }
  # The RC campaigns again with every connection made through the kernel's rdma_cm
  # (cm_reject accept: a QP and a region per connection, named in the REP).
  local vres="" vout="$OUT/fuzz-via-cm.txt"
  if [ -n "$REJECT_BIN" ]; then
    local apid vpid
    apid=$(gspawn 1 "timeout 300 /host/cm_reject accept $G 7472")
    vpid=$(gspawn 1 "/host/rdma_peer 18801 65536")
    gexec 1 "for i in \$(seq 1 100); do ss -Htln 'sport = :18801' | grep -q . && exit 0; sleep 0.1; done" 30 >/dev/null
    nsexec timeout 300 "$FERROCE" fuzz --target $G --local $F --agent-port 18801 --via-cm \
      --campaign psn,rkey,opcode,header,atomic,read,havoc --seconds 45 --seed "${FUZZ_SEED:-1}" -q \
      --pcap "$OUT/fuzz-via-cm.pcap" >"$vout" 2>&1
    gwait 1 "$vpid" 30 >/dev/null
    gexec 1 "pkill -x cm_reject; true" 20 >/dev/null; gwait 1 "$apid" 30 >/dev/null
    vres=$(tail -n 1 "$vout")
    result "fuzz: the RC campaigns over connections made by rxe's rdma_cm (--via-cm, 45 s): $vres" \
      $(echo "$vres" | grep -Eq '^[1-9][0-9]* cases, [0-9]+ conform, 0 deviate, 0 hangs, 0 crashes$' && echo 1 || echo 0) "(see $vout)"
  fi
  # As the client of unmodified ibv_rc_pingpong servers: one case per server run, six runs.
  local ppid grc ppout="$OUT/fuzz-pingpong.txt"
  ppid=$(gspawn 1 "for i in 1 2 3 4 5 6; do timeout 90 ibv_rc_pingpong -d rxe0 -g 1 -n 1 -s 64 -p 18900 || exit 1; done")
  nsexec timeout 600 "$FERROCE" fuzz --pingpong "$G:18900" --local $F --cases 6 --seed "${FUZZ_SEED:-1}" \
    --pcap "$OUT/fuzz-pingpong.pcap" >"$ppout" 2>&1
  gwait 1 "$ppid" 120 >/dev/null; grc=$?
  result "fuzz: 6 cases against unmodified ibv_rc_pingpong servers on rxe (one per run): $(tail -n 1 "$ppout")" \
    $(tail -n 1 "$ppout" | grep -Eq '^6 cases, 6 conform, 0 deviate, 0 hangs, 0 crashes$' && [ $grc = 0 ] && echo 1 || echo 0) \
    "(servers rc=$grc; see $ppout)"
  result "fuzz: every campaign against kernel rxe for ${FUZZ_SECONDS:-90} s: $last" \
    $(echo "$last" | grep -Eq '^[1-9][0-9]* cases, [0-9]+ conform, [0-9]+ deviate, 0 hangs, 0 crashes$' && [ -z "$splat" ] && [ -z "$unknown" ] && echo 1 || echo 0) \
    "(rc=$rc; unknown deviations: ${unknown:-none}; see $out, $pcap)"
}

for mtu_link in 1500 4200; do
  # The one-guest groups (bench boots a lab of its own).
  { want pingpong || want matrix || want loss || want programs || want shared || want cm || want rsockets || want fuzz; } || break
  mtu=1024; [ $mtu_link = 4200 ] && mtu=4096
  if ! lab_boot 1 $mtu_link; then result "lab boot (bridge MTU $mtu_link)" 0 ""; lab_down; continue; fi
  log "guest: kernel $(gexec 1 'uname -r' 30), $(gexec 1 "dpkg-query -W -f '\${Package} \${Version}' ibverbs-providers" 30)"
  gexec 1 "ibv_devinfo -d rxe0 | grep -q 'active_mtu:.*$mtu'" 30 >/dev/null; result "rxe0 active MTU $mtu on bridge MTU $mtu_link" $([ $? = 0 ] && echo 1 || echo 0) ""
  port=18515
  for role in ferroce-server rxe-server; do
    want pingpong || break
    for size in 1 4096 65536; do
      iters=20; [ $size = 65536 ] && iters=4
      again pingpong $role $size $mtu $iters $port
      port=$((port+1))
    done
  done
  # The first READ response ferroce receives (the zero-length READ's) is dropped: rxe must replay it.
  want matrix && again matrix $mtu "" FERROCE_FAULTS=droprx=0x10
  [ $mtu_link = 1500 ] && want shared && again shared $mtu
  if [ $mtu_link = 4200 ] && want programs; then
    port=18700
    for role in ferroce-server rxe-server; do
      for p in "ibv_rc_pingpong -g 1 -n 20" "ibv_uc_pingpong -g 1 -n 20" "ibv_ud_pingpong -g 1 -n 20" \
               "ibv_srq_pingpong -g 1 -n 20 -q 4" "ibv_rc_pingpong -g 1 -n 20 -e" \
               "ib_write_bw -x 1 -n 50 -s 65536" "ib_read_bw -x 1 -n 50 -s 65536" "ib_send_bw -x 1 -n 50 -s 65536" \
               "ib_atomic_bw -x 1 -n 50" "ib_send_lat -x 1 -n 50" "ib_write_lat -x 1 -n 50" "ib_read_lat -x 1 -n 50"; do
        # shellcheck disable=SC2086
        again program $role ${p%% *} $port ${p#* }
        port=$((port+1))
      done
    done
  fi
  if want cm; then
    for role in ferroce-server rxe-server; do
      again cm_pair $role rping "ping data: rdma-ping-19" "-s -a @ -v -C 20 -S 64" "-c -a @ -v -C 20 -S 64"
      again cm_pair $role ucmatose "return status 0" "-c 2 -C 10" "-s @ -c 2 -C 10"
      again cm_pair $role udaddy "return status 0" "" "-s @"
      # perftest's -R client opens its data connection right after the exchange on its
      # control one; the emulated guest's server listens for it only ~1 s later, so from the
      # host's native speed the guest's CM answers REJ 8, and Debian 12's perftest (4.5-0.17)
      # cannot try again: its retry reuses the ids it has just destroyed (a use-after-free,
      # fixed upstream in perftest 3d9d8d0, Dec 2025; the bench group's late_listen shows the
      # kernel's rdma_cm client crash the same way). So ferroce serves perftest here, and
      # the bench group runs both roles between two emulated guests (bench_cm).
      if [ $role = ferroce-server ]; then
        again cm_pair $role ib_write_bw "#bytes" "-R -d DEV -n 50" "-R -d DEV -n 50 @"
        again cm_pair $role ib_send_lat "#bytes" "-R -d DEV -n 50" "-R -d DEV -n 50 @"
      fi
      again cm_pair $role "rdma_server|rdma_client" ": end 0" "-s @" "-s @"
      again cm_reject $role
    done
    again cm_closed_port ferroce
    again cm_closed_port rxe
    again doctor_rxe
    again mc_pair ferroce-receiver
    again mc_pair rxe-receiver
    # IPv6: an address of fd77::/64 on each end (rxe0 gets a GID for the guest's), the RC and
    # UD flows again, with IPv6 GRHs (the ICRC's masked fields are IPv6's) and AF_INET6 CM ids.
    if lab_ipv6; then
      for role in ferroce-server rxe-server; do
        CM_HOST=fd77::1 CM_GUEST=fd77::11 CM_TAG=" ipv6" \
          again cm_pair $role rping "ping data: rdma-ping-19" "-s -a @ -v -C 20 -S 64" "-c -a @ -v -C 20 -S 64"
        CM_HOST=fd77::1 CM_GUEST=fd77::11 CM_TAG=" ipv6" again cm_pair $role udaddy "return status 0" "-b @" "-s @"
      done
    else
      result "rdma_cm ipv6 mtu $mtu" 0 "(no IPv6 address or no rxe0 GID for it)"
    fi
  fi
  if want rsockets; then
    for role in ferroce-server rxe-server; do
      # rsockets: ferroce's against rdma-core's own (librdmacm's rsocket.c in the guest), data
      # verified by the programs (-T v); rstream's credits and buffer grants over a 1 MB
      # transfer, riostream's riomap entries and direct writes. (Not udpong: rdma-core's
      # datagram rsockets fail on RoCE even between two of its own, see docs/interop.md.)
      again cm_pair $role rstream "Gb/sec" "-b @ -S 4096 -C 100 -T v" "-s @ -S 4096 -C 100 -T v"
      CM_TAG=" 1 MB blocking" again cm_pair $role rstream "Gb/sec" "-b @ -S 1000000 -C 4 -T b -T v" "-s @ -S 1000000 -C 4 -T b -T v"
      again cm_pair $role riostream "Gb/sec" "-b @ -S 65536 -C 20 -T v" "-s @ -S 65536 -C 20 -T v"
    done
  fi
  # Not through `again`: a guest that dies under the fuzzer is what the fuzzer is for.
  [ $mtu_link = 1500 ] && want fuzz && fuzz_rxe
  if [ $mtu_link = 1500 ] && want loss; then
    # Loss: 5 % each way, all of it injected by ferroce at its socket (FERROCE_FAULTS' loss is
    # end to end, half on send and half on receive in probability: 0.0975 is 5 % each way).
    # Not netem in the guest: under TCG the guest's virtio-net transmit queue stalled twice
    # behind netem's backlog in the lossy matrix ("NETDEV WATCHDOG: transmit queue 0 timed out",
    # hundreds of packets held, the guest unable to ping the host: docs/interop.md), and a drop
    # at ferroce's receiving socket is, for rxe, the same loss as one on the wire. The operation
    # matrix, not rc_pingpong: ibv_rc_pingpong cannot finish under loss when its peer leaves
    # first (the last ACK may be lost and nobody is left to answer), whereas rdma_peer stays
    # until told.
    again matrix $mtu "loss=5%" FERROCE_FAULTS=loss=0.0975 FERROCE_RXE_LOSSY=1
  fi
  lab_down
done
# The guests the bench has taken rxe out of (a rebooted lab takes it out again).
BENCH_NO_RXE=""
# A guest that is gone: seen on 6.12 under TCG, kernel rxe between the
# two rxe guests (no ferroce in it) panicking in rxe_receiver's ACK allocation (slab
# corruption, "Fatal exception in interrupt"). What the consoles say goes to
# $OUT/bench.stalls.txt and the figures' line; the lab boots again as it was.
BENCH_REBOOTS=0
bench_reboot() { # LABEL
  local k
  BENCH_REBOOTS=$((BENCH_REBOOTS + 1))
  for k in 1 2; do
    { echo "== g$k in bench $1: qemu $(kill -0 "${QPIDS[$((k-1))]}" 2>/dev/null && echo alive || echo exited); console tail:"
      tail -n 60 "$RUN/g$k/console.log"; } >> "$OUT/bench.stalls.txt" 2>&1
  done
  echo "bench $1: a guest is gone (consoles in $OUT/bench.stalls.txt); the lab boots again" >&2
  lab_down
  lab_up 2 1500 || return 1
  for k in 1 2; do mkdir -p "$RUN/g$k/ibv"; cp "$IBV_DIR"/lib*.so.1 "$RUN/g$k/ibv/"; done
  for k in $BENCH_NO_RXE; do gexec "$k" "rdma link delete rxe0 && modprobe -r rdma_rxe" 60 >/dev/null || return 1; done
}

# perftest between two emulated guests on equal footing: first on kernel rxe, then on ferroce's
# libibverbs.so.1 in the same guests with rxe0 and its module removed (ferroce's socket takes
# UDP 4791). Prints the figures and ferroce's ratios to rxe; a run that fails is a failure, the
# ratios are figures (speed is measured here, not asserted).
bench_run() { # LABEL ENV DEV PROG ARGS; the client's result row into $OUT/bench.LABEL.row
  local label=$1 env=$2 dev=$3 prog=$4 args=$5 try out sid rc reboots=0 refused=0
  for try in 1 2 3 4 5; do
    sid=$(gspawn 1 "${env//@/$(gip 1)} timeout 150 $prog -d $dev $args")
    sleep 4
    out=$(gexec 2 "${env//@/$(gip 2)} timeout 120 $prog -d $dev $args $(gip 1)" 140); rc=$?
    gwait 1 "$sid" 150 >"$OUT/bench.server.txt"; local src=$?
    # 125 is gwait's "the guest is gone" (a job that hangs in a live guest fails as it is).
    if [ $rc = 125 ] || [ $src = 125 ]; then
      [ $reboots -lt 3 ] || break
      reboots=$((reboots + 1)); bench_reboot "$label" || break; continue
    fi
    if [ $rc = 0 ] && [ $src = 0 ]; then
      # perftest converts cycles to time with the clock rate it measures; in an emulated guest
      # that measurement sometimes fails and every figure prints as inf: measure again.
      echo "$out" | awk '$1 ~ /^[0-9]+$/ && NF >= 4 {row=$0} END {print row}' | grep -qw inf || break
      echo "bench $label: perftest printed inf (its clock-rate measurement failed); again" >&2
      continue
    fi
    # perftest could not time its cycle counter (clock_refused, above), on either end and on
    # either stack (the rxe baseline too): once more, as the other groups do.
    if [ $refused = 0 ] && clock_refused "$OUT/bench.server.txt" "$out"; then
      refused=1
      echo "RETRY bench $label: perftest could not time its cycle counter (r^2 < 0.9); once more"
      continue
    fi
    # The client may have come before the (slow, emulated) server listened.
    echo "$out" | grep -qE "Couldn't connect|Unable to init the socket" || break
  done
  echo "$out" > "$OUT/bench.$label.txt"
  [ $rc = 0 ] && [ $src = 0 ] || { result "bench $label" 0 "(see $OUT/bench.$label.txt)"; return 1; }
  echo "$out" | awk '$1 ~ /^[0-9]+$/ && NF >= 4 {row=$0} END {print row}' > "$OUT/bench.$label.row"
}

# perftest -R (rdma_cm) between the two guests with one on kernel rxe and the other on ferroce:
# both emulated, so the client comes to the server's second listener as late as it would from
# another rxe guest (from the host's native speed it comes before the guest listens, and
# Debian 12's perftest cannot try again: see the cm group).
bench_cm() { # SERVER_G SERVER_ENV SERVER_DEV CLIENT_G CLIENT_ENV CLIENT_DEV PROG LABEL
  local sg=$1 senv=$2 sdev=$3 cg=$4 cenv=$5 cdev=$6 prog=$7 label=$8 try out sout sid rc src
  local name="rdma_cm $prog -R $label (two guests)"
  for try in 1 2 3 4; do
    sid=$(gspawn "$sg" "${senv//@/$(gip "$sg")} timeout 100 $prog -R -d $sdev -n 50")
    sleep 5
    out=$(gexec "$cg" "${cenv//@/$(gip "$cg")} timeout 90 $prog -R -d $cdev -n 50 $(gip "$sg")" 110); rc=$?
    # A client that came before the server listened again (REJ 8, then perftest's broken
    # retry): the server waits for it in vain, so it is stopped and both ends go again.
    [ $rc = 0 ] || gexec "$sg" "pkill -x $prog; true" 20 >/dev/null
    sout=$(gwait "$sg" "$sid" 120); src=$?
    [ $rc = 0 ] && [ $src = 0 ] && break
    echo "$out" | grep -q "RDMA_CM_EVENT_REJECTED; error: 8" || break
    sleep 1
  done
  { echo "== attempt $try"; echo "== server g$sg (rc=$src)"; echo "$sout"; echo "== client g$cg (rc=$rc)"; echo "$out"; } > "$OUT/bench-cm.$prog.$sg.txt"
  result "$name" $([ $rc = 0 ] && [ $src = 0 ] && echo "$out" | grep -q '#bytes' && echo "$sout" | grep -q '#bytes' && echo 1 || echo 0) \
    "(see $OUT/bench-cm.$prog.$sg.txt)"
}

# ECN between two ferroce guests: netem on the client's eth0 marks 5 % of its packets CE
# instead of dropping them (netem's ecn: every ferroce packet is ECN-capable); the server
# (the notification point) must answer with CNPs and the client's QP (the reaction point) must
# take them, and ib_write_bw must still pass. Each side's counters come from its closing log.
bench_ecn() { # FE_ENV
  local fe_env="$1 FERROCE_LOG=info" out sout sid rc src
  local m1=52:54:00:77:00:0b m2=52:54:00:77:00:0c
  if ! gexec 2 "ip neigh replace $(gip 1) lladdr $m1 dev eth0 nud permanent && modprobe sch_netem && tc qdisc add dev eth0 root netem loss 5% ecn" 30 >/dev/null \
     || ! gexec 1 "ip neigh replace $(gip 2) lladdr $m2 dev eth0 nud permanent" 30 >/dev/null; then
    result "ecn: netem marking set-up" 0 ""; return
  fi
  sid=$(gspawn 1 "${fe_env//@/$(gip 1)} timeout 100 ib_write_bw -d ferroce0 -x 1 -s 65536 -D 3")
  sleep 4
  out=$(gexec 2 "${fe_env//@/$(gip 2)} timeout 90 ib_write_bw -d ferroce0 -x 1 -s 65536 -D 3 $(gip 1)" 110); rc=$?
  sout=$(gwait 1 "$sid" 120); src=$?
  gexec 2 "tc qdisc del dev eth0 root" 30 >/dev/null
  { echo "== server g1 (rc=$src)"; echo "$sout"; echo "== client g2 (rc=$rc)"; echo "$out"; } > "$OUT/bench-ecn.txt"
  local sent handled marked
  sent=$(echo "$sout" | grep -o 'cnp_sent=[0-9]*' | tail -n 1 | cut -d= -f2)
  marked=$(echo "$sout" | grep -o 'ecn_marked_pkts=[0-9]*' | tail -n 1 | cut -d= -f2)
  handled=$(echo "$out" | grep -o 'cnp_handled=[0-9]*' | tail -n 1 | cut -d= -f2)
  echo "ecn (netem loss 5% ecn on g2): ${marked:-0} packets marked CE at g1, ${sent:-0} CNPs sent, ${handled:-0} handled at g2" | tee -a "$OUT/bench-ecn.txt"
  result "ecn: CE marks answered with CNPs that reach the sender, ib_write_bw passes" \
    $([ $rc = 0 ] && [ $src = 0 ] && [ "${sent:-0}" -gt 0 ] && [ "${handled:-0}" -gt 0 ] && echo 1 || echo 0) "(see $OUT/bench-ecn.txt)"
}

# Issue 23 item 9: Debian 12's perftest -R client after a REJ 8 of its data connection (a
# server whose second listen comes late: late_listen.so in the server, which is kernel rxe in
# g1). On the kernel's rdma_cm (client in g2) it crashes: its retry uses the IDs it has just
# destroyed (rdma_resolve_addr on a freed ID; fixed upstream in perftest 3d9d8d0, Dec 2025).
# On ferroce's libraries (client in the host's namespace) it must see the same REJ 8 and fail
# too; how it fails is up to perftest's use of freed IDs (a signal, or an error exit when
# ferroce's checks refuse a call on a destroyed object).
late_listen() {
  local name="rdma_cm ib_send_lat -R after a late data listen: REJ 8 and a failed client on the kernel's rdma_cm and on ferroce"
  if [ -z "$LATE_SO" ] || [ -z "$IBV_DIR" ]; then result "$name" 0 "(late_listen.so or the libraries did not build)"; return; fi
  cp "$LATE_SO" "$RUN/g1/late_listen.so"
  local sid kout krc fout frc
  sid=$(gspawn 1 "LD_PRELOAD=/host/late_listen.so timeout 60 ib_send_lat -R -d rxe0 -n 50")
  sleep 5
  kout=$(gexec 2 "timeout 50 ib_send_lat -R -d rxe0 -n 50 $(gip 1) 2>&1; echo rc=\$?" 70)
  gexec 1 "pkill -x ib_send_lat; true" 20 >/dev/null; gwait 1 "$sid" 70 >/dev/null
  sid=$(gspawn 1 "LD_PRELOAD=/host/late_listen.so timeout 60 ib_send_lat -R -d rxe0 -n 50")
  sleep 5
  fout=$(nsexec env LD_LIBRARY_PATH="$IBV_DIR" FERROCE_DEVICES=10.77.0.1 timeout 50 ib_send_lat -R -d ferroce0 -n 50 $(gip 1) 2>&1); frc=$?
  gexec 1 "pkill -x ib_send_lat; true" 20 >/dev/null; gwait 1 "$sid" 70 >/dev/null
  krc=$(echo "$kout" | sed -n 's/^rc=//p' | tail -n 1)
  { echo "== kernel client g2 (rc=$krc)"; echo "$kout"; echo "== ferroce client (rc=$frc)"; echo "$fout"; } > "$OUT/late-listen.txt"
  echo "late listen: kernel rdma_cm client rc=$krc, ferroce client rc=$frc (see $OUT/late-listen.txt)"
  result "$name" $(echo "$kout" | grep -q "RDMA_CM_EVENT_REJECTED; error: 8" && echo "$fout" | grep -q "RDMA_CM_EVENT_REJECTED; error: 8" \
    && [ "${krc:-0}" -gt 128 ] && [ "$frc" != 0 ] && echo 1 || echo 0) "(see $OUT/late-listen.txt)"
}

bench() {
  if ! lab_up 2 1500; then result "bench lab boot (2 guests)" 0 ""; lab_down; return; fi
  local k; for k in 1 2; do mkdir -p "$RUN/g$k/ibv"; cp "$IBV_DIR"/lib*.so.1 "$RUN/g$k/ibv/"; done
  local rxe_env="" fe_env="LD_LIBRARY_PATH=/host/ibv FERROCE_DEVICES=@"
  local rw rl fw fl
  bench_run rxe-write "$rxe_env" rxe0 ib_write_bw "-x 1 -s 65536 -D 5" || { lab_down; return; }
  bench_run rxe-send-lat "$rxe_env" rxe0 ib_send_lat "-x 1 -n 500" || { lab_down; return; }
  late_listen
  # g2 moves to ferroce first: perftest -R with each role on each stack.
  gexec 2 "rdma link delete rxe0 && modprobe -r rdma_rxe" 60 >/dev/null \
    || { result "bench: rxe0 and rdma_rxe removed in g2" 0 ""; lab_down; return; }
  BENCH_NO_RXE="2"
  # rxe serves (the cm group has ferroce serving rxe's client already, from the host). The
  # other way round between two guests is a race perftest loses: rxe's client, kernel-fast,
  # comes before an emulated ferroce server listens again, and perftest cannot retry.
  for p in ib_write_bw ib_send_lat; do
    bench_cm 1 "$rxe_env" rxe0 2 "$fe_env" ferroce0 $p "rxe-server ferroce-client"
  done
  gexec 1 "rdma link delete rxe0 && modprobe -r rdma_rxe" 60 >/dev/null \
    || { result "bench: rxe0 and rdma_rxe removed in g1" 0 ""; lab_down; return; }
  BENCH_NO_RXE="1 2"
  bench_run ferroce-write "$fe_env" ferroce0 ib_write_bw "-x 1 -s 65536 -D 5" || { lab_down; return; }
  bench_run ferroce-send-lat "$fe_env" ferroce0 ib_send_lat "-x 1 -n 500" || { lab_down; return; }
  bench_ecn "$fe_env"
  lab_down
  rw=$(cat "$OUT/bench.rxe-write.row"); rl=$(cat "$OUT/bench.rxe-send-lat.row")
  fw=$(cat "$OUT/bench.ferroce-write.row"); fl=$(cat "$OUT/bench.ferroce-send-lat.row")
  # ib_write_bw: #bytes #iterations BW-peak BW-average MsgRate; ib_send_lat: #bytes
  # #iterations t_min t_max t_typical ...
  local rbw fbw rlat flat
  rbw=$(echo "$rw" | awk '{print $4}'); fbw=$(echo "$fw" | awk '{print $4}')
  rlat=$(echo "$rl" | awk '{print $5}'); flat=$(echo "$fl" | awk '{print $5}')
  echo "bench (two emulated guests, 1 vCPU each, MTU 1024): ib_write_bw 64 KiB average rxe $rbw MiB/s, ferroce $fbw MiB/s ($(awk -v a="$fbw" -v b="$rbw" 'BEGIN{printf "%.2f", a/b}')x); ib_send_lat typical rxe $rlat us, ferroce $flat us ($(awk -v a="$flat" -v b="$rlat" 'BEGIN{printf "%.2f", a/b}')x)$([ $BENCH_REBOOTS = 0 ] || echo "; the lab rebooted $BENCH_REBOOTS time(s) for a guest that was gone: $OUT/bench.stalls.txt")" | tee "$OUT/bench.txt"
  result "bench: perftest on rxe, then on ferroce, between the same two guests" \
    $([ -n "$rbw" ] && [ -n "$fbw" ] && [ -n "$rlat" ] && [ -n "$flat" ] && echo 1 || echo 0) "(figures: $OUT/bench.txt)"
}

want bench && bench
echo "$PASS passed, $FAIL failed"
[ $FAIL = 0 ]
