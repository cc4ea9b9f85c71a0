#!/usr/bin/env bash
# tests/soak/soak.sh: a bounded soak of many hosts (issue #28). Eight network-namespace hosts
# on one bridge, loss, duplication, reordering and CE marks on four of them (ferroce's fault
# injection: this kernel may lack netem) and a slow token-bucket link on one, link cuts,
# several processes sharing each host's address, all through ferroce's libibverbs.so.1
# and librdmacm.so.1 with unmodified rdma-core programs:
#
#   witnesses  one loop per host against its neighbour, never disturbed on purpose: RDMA
#              READ and WRITE over rdma_cm connects and disconnects (rping -V) and four CM
#              connections at once (ucmatose) everywhere; RC SENDs (ibv_rc_pingpong -c) and SRQ
#              (ibv_srq_pingpong -c) between the hosts whose links neither drop nor get cut, UD
#              (ibv_ud_pingpong -c) between the two of them where nothing is killed (6 -> 7:
#              see the chaos loop); Open MPI over UCX, 4 ranks on host 7 and 4 ranks
#              across hosts 1, 6, 7, 8 launched through Open MPI's rsh agent (mpi_peer.c:
#              ping-pong, Allreduce, Bcast, Alltoall, Put/Get); every byte is checked by the
#              programs (-c, -V, mpi_peer), every run must pass
#   victims    one loop per host, started first on each address (so the role holder of every
#              address, the process that routes its QP1, is a victim): long RC and rping pairs
#   resident   one persistent rping server (-P) on host 1 for the whole run, its clients from
#              host 8 in turn: its memory, threads and descriptors must not grow after warm-up
#   chaos      every CHAOS_PERIOD: SIGKILL a victim on a host other than 6 and 7 (the
#              address's role holder when a victim holds it; otherwise any, mid-handshake or
#              mid-transfer as it falls), or cut a lossy host's bridge port for 150 ms (below
#              the witnesses' RC retry budget)
#
# Pass: every witness run succeeded (no wrong byte, no error status, no hang: each run is
# bounded), no program panicked, and afterwards no process, socket or /dev/shm file is left
# (a SIGKILLed last member's registry file stays until its address is used again: the check
# uses every address once more first, as the next user would).
#
#   SOAK_SECONDS=N   how long the traffic runs (default 150; the long form: 1800)
#   SOAK_OUT=DIR     logs (default /tmp/ferroce-soak); failed runs keep theirs
#   SOAK_SEED=N      the chaos loop's seed (default: the time), printed for a re-run
#
# Needs root, network namespaces, ibverbs-utils and rdmacm-utils: skipped loudly without them,
# a failure under CI=true.
set -uo pipefail
TOP=$(cd "$(dirname "$0")/../.." && pwd)
SECONDS_WANTED=${SOAK_SECONDS:-150}
OUT=${SOAK_OUT:-/tmp/ferroce-soak}
SEED=${SOAK_SEED:-$(date +%s)}
CHAOS_PERIOD=2
HOSTS=8
NET=10.79.0
P=fsk$$

skip() {
    if [ "${CI:-}" = true ]; then
        echo "soak: FAILED: cannot run under CI: $*"
        exit 1
    fi
    echo "SKIPPED: soak: $*"
    exit 0
}
[ "$(id -u)" = 0 ] || skip "not root (network namespaces)"
ip netns list >/dev/null 2>&1 || skip "no network namespaces"
for p in ibv_rc_pingpong ibv_srq_pingpong ibv_ud_pingpong; do
    command -v $p >/dev/null || skip "no $p: apt-get install ibverbs-utils"
done
for p in rping ucmatose; do
    command -v $p >/dev/null || skip "no $p: apt-get install rdmacm-utils"
done

rm -rf "$OUT"
mkdir -p "$OUT/lib" "$OUT/runs"
echo "soak: building the libraries and the tool (release)"
(cd "$TOP" && cargo build -q --release -p ferroce-ibverbs -p ferroce-librdmacm --lib &&
    cargo build -q --release --bin ferroce) || { echo "soak: FAILED: build"; exit 1; }
"$TOP/ibverbs/link.sh" "$TOP/target/release/libferroce_ibverbs.a" "$OUT/lib/libibverbs.so.1"
"$TOP/librdmacm/link.sh" "$TOP/target/release/libferroce_librdmacm.a" "$OUT/lib/libibverbs.so.1" \
    "$OUT/lib/librdmacm.so.1"
FERROCE=$TOP/target/release/ferroce
LIB=$OUT/lib
# MPI collectives (Open MPI over UCX's verbs transports, 4 ranks) on one host, beside the
# chaos there: tests/c/mpi_peer.c checks every byte of a ping-pong, Allreduce, Bcast, Alltoall
# and one-sided Put/Get. UCX takes a verbs device only beside its uverbs node.
MPI=""
if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
    mpicc.openmpi -O2 -o "$OUT/mpi_peer" "$TOP/ibverbs/tests/c/mpi_peer.c" ||
        { echo "soak: FAILED: mpicc.openmpi"; exit 1; }
    "$FERROCE" devnode >/dev/null || { echo "soak: FAILED: ferroce devnode"; exit 1; }
    MPI=$OUT/mpi_peer
elif [ "${CI:-}" = true ]; then
    echo "soak: FAILED: no Open MPI under CI (apt-get install openmpi-bin libopenmpi-dev)"
    exit 1
else
    echo "SKIPPED: soak: the MPI witness: apt-get install openmpi-bin libopenmpi-dev"
fi

# ---- the fabric ----
cleanup() {
    # Every process started here runs inside one of the namespaces.
    for i in $(seq 1 $HOSTS); do
        ip netns pids "$P-h$i" 2>/dev/null | xargs -r kill -9 2>/dev/null
    done
    sleep 0.5
    for i in $(seq 1 $HOSTS); do ip netns del "$P-h$i" 2>/dev/null; done
    ip netns del "$P-br" 2>/dev/null
}
trap cleanup EXIT
ns() { local h=$1; shift; ip netns exec "$P-h$h" "$@"; }

ip netns add "$P-br"
ip -n "$P-br" link add br0 type bridge
ip -n "$P-br" link set br0 up
for i in $(seq 1 $HOSTS); do
    ip netns add "$P-h$i"
    ip -n "$P-br" link add "p$i" type veth peer name eth0 netns "$P-h$i"
    ip -n "$P-br" link set "p$i" master br0 up
    ip -n "$P-h$i" addr add "$NET.$i/24" dev eth0
    ip -n "$P-h$i" link set eth0 up
    ip -n "$P-h$i" link set lo up
done
# Impairments on hosts 2-5 (1 and 6-8 are clean: the UD witnesses run there). This kernel may
# have no netem, so loss, duplication, reordering and CE marks are ferroce's own fault
# injection in every process of those hosts (FERROCE_FAULTS, seeded per process), and host 3's
# link is a token bucket: a slow link whose queue drops what bursts beyond it.
declare -A FAULTS=([2]="loss=0.02" [4]="loss=0.01,ce=0.03" [5]="dup=0.02,reorder=0.05,loss=0.01")
ip netns exec "$P-h3" tc qdisc add dev eth0 root tbf rate 200mbit burst 64kb latency 2ms ||
    { echo "soak: FAILED: tc tbf on host 3"; exit 1; }
LOSSY=(2 3 4 5)
echo "soak: $HOSTS hosts on a bridge ($NET.1-$HOSTS); h2 loss 2%, h3 a 200 Mbit/s token bucket," \
    "h4 loss 1% and CE marks 3%, h5 duplicates 2%, reordering 5%, loss 1%; ${SECONDS_WANTED}s," \
    "seed $SEED"

# A program on host $1 with the device of its address (and the host's faults).
prog() {
    local h=$1; shift
    ns "$h" env LD_LIBRARY_PATH="$LIB" FERROCE_DEVICES="$NET.$h" FERROCE_FAULTS="${FAULTS[$h]:-}" "$@"
}
# The same, replacing the calling (background) shell: its pid is the program's.
spawn() {
    local h=$1; shift
    exec ip netns exec "$P-h$h" env LD_LIBRARY_PATH="$LIB" FERROCE_DEVICES="$NET.$h" \
        FERROCE_FAULTS="${FAULTS[$h]:-}" "$@"
}

# Waits (bounded) until process $2 on host $1 listens on TCP port $3, or holds rdma_cm port $3.
wait_tcp() {
    for _ in $(seq 1 400); do
        ns "$1" ss -ltnp 2>/dev/null | grep -q ":$3 .*pid=$2," && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
wait_cm() {
    for _ in $(seq 1 400); do
        ns "$1" "$FERROCE" devinfo -d "$NET.$1" --services 2>/dev/null |
            grep -q "pid $2 rdma_cm port space 0x106 port $3\$" && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# What hosts $1 and $2 hold (every process's QPs and counters, the programs' kernel stacks),
# written when a run is about to be cut off: the failure's log says where it stood. $3: why.
diag() {
    local h
    echo "== $3"
    for h in "$1" "$2"; do
        echo "== host $h: devinfo --qps --counters"
        ns "$h" timeout -s KILL 10 "$FERROCE" devinfo -d "$NET.$h" --qps --counters
        echo "== host $h: processes and their threads' kernel stacks"
        ip netns pids "$P-h$h" | while read -r pid; do
            echo "-- $pid $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
            cat /proc/"$pid"/task/*/stack 2>/dev/null | grep -v '^\[<0>\] \(ret_from\|entry_SYSCALL\|do_syscall\)' | sort | uniq -c | sort -rn | head -8
        done
    done
}

# Whether an rping exit status $1 with output $2 passed: 0, or rping's own exit race (255
# with the EBADF of its event thread last, see pair).
exit_race() {
    [ "$1" = 0 ] || { [ "$1" = 255 ] &&
        [ "$(tail -n 1 "$2")" = "rdma_get_cm_event: Bad file descriptor" ]; }
}

# One run of a pair: the server on host $b, the client on host $a. Prints "ok BYTES" or "fail".
# $kind picks the program; $port is the run's port; $limit bounds it.
pair() {
    local kind=$1 a=$2 b=$3 port=$4 limit=$5 tag=$6 n=$7
    local log="$OUT/runs/$tag" sp srv=() cli=() bytes=0 waiter=wait_tcp witness=false
    # Witness runs (tags w*) must pass; a victim's long run meets its bound by design.
    [ "${tag#w}" != "$tag" ] && witness=true
    case $kind in
    rc)
        local size=$(((n * 997) % 8192 + 1))
        srv=(ibv_rc_pingpong -g 1 -e -c -n 100 -s $size -d ferroce0 -p $port)
        cli=("${srv[@]}" "$NET.$b")
        bytes=$((2 * 100 * size)) ;;
    rc-long)
        srv=(ibv_rc_pingpong -g 1 -e -c -n 1000000 -s 4096 -d ferroce0 -p $port)
        cli=("${srv[@]}" "$NET.$b") ;;
    srq)
        local size=$(((n * 389) % 4096 + 1))
        srv=(ibv_srq_pingpong -g 1 -e -c -n 50 -q 4 -s $size -d ferroce0 -p $port)
        cli=("${srv[@]}" "$NET.$b")
        bytes=$((2 * 4 * 50 * size)) ;;
    ud)
        srv=(ibv_ud_pingpong -g 1 -e -c -n 100 -s 1024 -d ferroce0 -p $port)
        cli=("${srv[@]}" "$NET.$b")
        bytes=$((2 * 100 * 1024)) ;;
    rping)
        local size=$(((n * 1231) % 16384 + 64))
        srv=(rping -s -a "$NET.$b" -p $port -V -C 50 -S $size)
        cli=(rping -c -a "$NET.$b" -p $port -V -C 50 -S $size)
        bytes=$((2 * 50 * size))
        waiter=wait_cm ;;
    rping-long)
        srv=(rping -s -a "$NET.$b" -p $port -V -C 1000000 -S 4096)
        cli=(rping -c -a "$NET.$b" -p $port -V -C 1000000 -S 4096)
        waiter=wait_cm ;;
    ucmatose)
        srv=(ucmatose -b "$NET.$b" -p $port -c 4 -C 20 -S 1000)
        cli=(ucmatose -s "$NET.$b" -p $port -c 4 -C 20 -S 1000)
        bytes=$((4 * 20 * 1000))
        waiter=wait_cm ;;
    esac
    # Line-buffered output (stdbuf): a run cut off by its bound shows how far it got.
    spawn "$b" timeout -s KILL "$limit" stdbuf -oL "${srv[@]}" >"$log.srv" 2>&1 &
    sp=$!
    # timeout runs the program as its child: that pid listens.
    local child="" i
    for i in $(seq 1 200); do
        child=$(pgrep -P "$sp" | head -1)
        [ -n "$child" ] && break
        sleep 0.02
    done
    if [ -z "$child" ] || ! $waiter "$b" "$child" "$port"; then
        kill -9 "$sp" $child 2>/dev/null
        wait "$sp" 2>/dev/null
        echo "fail (server never ready: $log.srv)"
        return
    fi
    prog "$a" timeout -s KILL "$limit" stdbuf -oL "${cli[@]}" >"$log.cli" 2>&1 &
    local cp=$! until=$(($(date +%s) + limit - 5))
    # A witness's client about to be cut off by its bound: what both hosts hold, for the
    # failure's log (a victim's long run meets its bound by design).
    (
        $witness || exit 0
        while [ "$(date +%s)" -lt "$until" ]; do
            sleep 1
            kill -0 "$cp" 2>/dev/null || exit 0
        done
        diag "$a" "$b" "client still running" >"$log.diag" 2>&1
    ) &
    local wd=$!
    wait "$cp"
    local crc=$?
    wait "$wd"
    # The server ends with its client: a bounded wait, then it counts as a hang.
    for i in $(seq 1 300); do
        kill -0 "$child" 2>/dev/null || break
        sleep 0.1
    done
    if $witness && kill -0 "$child" 2>/dev/null; then
        diag "$a" "$b" "server $child still running 30 s after its client" >>"$log.diag" 2>&1
    fi
    kill -9 "$child" 2>/dev/null
    wait "$sp"
    local src=$?
    if [ $crc = 0 ] && [ $src = 0 ]; then
        rm -f "$log.srv" "$log.cli" "$log.diag"
        echo "ok $bytes"
    elif [ "${kind#rping}" != "$kind" ] && exit_race "$crc" "$log.cli" &&
        exit_race "$src" "$log.srv"; then
        # rdma-core 44's rping: its event thread calls rdma_get_cm_event once more after the
        # main thread destroyed the channel, and exits 255 on the EBADF (on the kernel's
        # librdmacm too), on either side; upstream fixed it in rping (rdma-core 61,
        # f3ae6534a). The data checks (-V) had passed.
        echo "ok $bytes rping-exit-race"
    else
        echo "fail (client rc $crc, server rc $src: $log.{srv,cli,diag})"
    fi
}

# Open MPI's rsh agent for the namespace hosts, as ssh would be: "mpi-agent hN CMD..." runs
# CMD through a shell on host N, under the host name hN (the hosts are told apart by name),
# with the device of its address.
cat >"$OUT/mpi-agent" <<AGENT
#!/bin/bash
h=\${1#h}
shift
exec ip netns exec "$P-h\$h" unshare --uts sh -c "hostname h\$h; export LD_LIBRARY_PATH=$LIB \\
    FERROCE_DEVICES=$NET.\$h UCX_TLS=self,rc_verbs,ud_verbs; \$*"
AGENT
chmod +x "$OUT/mpi-agent"
printf 'h%s slots=1\n' 1 6 7 8 >"$OUT/mpi-hosts"

# One Open MPI run of 4 ranks across hosts 1, 6, 7 and 8, one each, launched from host 7
# through the rsh agent. Prints "ok" or "fail".
mpi_hosts_run() {
    local tag=$1 log="$OUT/runs/$1"
    prog 7 timeout -s KILL 240 mpirun.openmpi --allow-run-as-root -np 4 \
        --hostfile "$OUT/mpi-hosts" --mca plm_rsh_agent "$OUT/mpi-agent" \
        --mca oob_tcp_if_include "$NET.0/24" --mca pml ucx --mca osc ucx "$MPI" >"$log" 2>&1
    local rc=$?
    if [ $rc = 0 ] && grep -q "ok mpi 4 ranks on 4 hosts" "$log"; then
        rm -f "$log"
        echo "ok 0"
    else
        echo "fail (rc $rc: $log)"
    fi
}

# One Open MPI run of 4 ranks on host $1 (all on its address). Prints "ok" or "fail".
mpi_run() {
    local h=$1 tag=$2 log="$OUT/runs/$2"
    prog "$h" env UCX_TLS=self,rc_verbs,ud_verbs timeout -s KILL 240 mpirun.openmpi \
        --allow-run-as-root --oversubscribe -np 4 --mca pml ucx --mca osc ucx \
        -x LD_LIBRARY_PATH -x FERROCE_DEVICES -x FERROCE_FAULTS -x UCX_TLS "$MPI" >"$log" 2>&1
    local rc=$?
    if [ $rc = 0 ] && grep -q "ok mpi 4 ranks" "$log"; then
        rm -f "$log"
        echo "ok 0"
    else
        echo "fail (rc $rc: $log)"
    fi
}

END=$(($(date +%s) + SECONDS_WANTED))

# Victims first: the first process on each address holds its QP1 role.
victim() {
    local a=$1 b=$(((a + 2) % HOSTS + 1)) n=0
    while [ "$(date +%s)" -lt "$END" ]; do
        local kind=rc-long
        [ $((n % 2)) = 1 ] && kind=rping-long
        # Ended by the chaos loop, by a peer's death, or after 20 s by timeout.
        pair $kind "$a" "$b" $((21000 + a * 100 + n % 100)) 20 "v$a-$n" $n >>"$OUT/victims.txt" \
            2>>"$OUT/shell.txt"
        n=$((n + 1))
    done
}
for a in $(seq 1 $HOSTS); do
    victim "$a" &
done
sleep 2

# The resident: one persistent rping server (-P: a thread per connection) on host 1 for the
# whole run, beside the victims there and their SIGKILLs; its clients come from host 8 one after
# another. Every connection's state must be given back: the server's memory (VmRSS), threads and
# descriptors are sampled once it is warm (a quarter into the run) and at the end.
RES_PORT=29000
spawn 1 rping -s -P -a "$NET.1" -p $RES_PORT -V -S 4096 >"$OUT/resident.srv" 2>&1 &
RES_PID=$!
disown "$RES_PID" # ended by the last kill with the rest: no job report then
wait_cm 1 $RES_PID $RES_PORT || { echo "soak: FAILED: the resident rping -P server never listened"; }
# "VmRSS-kB threads fds" of the resident, or nothing if it is gone.
resident_sample() {
    local rss
    rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$RES_PID/status" 2>/dev/null) || return 0
    echo "$rss $(ls "/proc/$RES_PID/task" | wc -l) $(ls "/proc/$RES_PID/fd" | wc -l)"
}
resident() {
    local n=0 warm_at=$(($(date +%s) + SECONDS_WANTED / 4)) rc log
    while [ "$(date +%s)" -lt "$END" ]; do
        log="$OUT/runs/resident-$n.cli"
        prog 8 timeout -s KILL 60 rping -c -a "$NET.1" -p $RES_PORT -V -C 20 -S 4096 >"$log" 2>&1
        rc=$?
        if [ $rc = 0 ]; then
            echo "ok" >>"$OUT/resident.txt"
            rm -f "$log"
        elif [ $rc = 255 ] && [ "$(tail -n 1 "$log")" = "rdma_get_cm_event: Bad file descriptor" ]; then
            # rping 44's own exit race (see pair), here on the client's side.
            echo "ok rping-exit-race" >>"$OUT/resident.txt"
        else
            echo "fail (rc $rc: $log)" >>"$OUT/resident.txt"
        fi
        if [ ! -s "$OUT/resident.warm" ] && [ "$(date +%s)" -ge "$warm_at" ]; then
            sleep 0.3 # the last connection's thread gives its state back
            resident_sample >"$OUT/resident.warm"
        fi
        n=$((n + 1))
    done
    sleep 0.3
    resident_sample >"$OUT/resident.end"
}
resident &
rpid=$!

witness() {
    local a=$1 b=$((a % HOSTS + 1)) n=0 kinds=(rping ucmatose)
    # Between hosts whose links neither drop nor get cut: UD, which has no retransmission,
    # and the ibv_*_pingpong programs, which cannot end cleanly on a link that drops: the
    # side that receives the last message exits at once, and if its ACK of that message is
    # lost nobody is left to answer the retransmissions (as on any RoCE NIC). rping and
    # ucmatose end with a CM disconnect, so they run everywhere. UD runs only from host 6 to
    # host 7, where nothing is killed: a datagram the kernel's steering handed a process of
    # the address while the group's table changed (see docs/architecture.md, "Processes on
    # one address") is lost if that process is SIGKILLed before it sends it on; RC
    # retransmits it, UD cannot, and ibv_ud_pingpong then waits for ever.
    case $a in 6) kinds+=(rc srq ud) ;; 7 | 8) kinds+=(rc srq) ;; esac
    # Host 7 (clean) also runs Open MPI: 4 ranks on its own address, and 4 ranks across
    # hosts 1, 6, 7 and 8 (beside the victims and the role holders' deaths there).
    [ "$a" = 7 ] && [ -n "$MPI" ] && kinds+=(mpi mpi-hosts)
    while [ "$(date +%s)" -lt "$END" ]; do
        local kind=${kinds[$((n % ${#kinds[@]}))]}
        local r
        if [ "$kind" = mpi ]; then
            r=$(mpi_run "$a" "w$a-$n-mpi" 2>>"$OUT/shell.txt")
        elif [ "$kind" = mpi-hosts ]; then
            r=$(mpi_hosts_run "w$a-$n-mpi-hosts" 2>>"$OUT/shell.txt")
        else
            r=$(pair "$kind" "$a" "$b" $((20000 + a * 100 + n % 100)) 120 "w$a-$n-$kind" $n \
                2>>"$OUT/shell.txt")
        fi
        echo "$kind $a->$b $r" >>"$OUT/witnesses.txt"
        n=$((n + 1))
    done
}
wpids=()
for a in $(seq 1 $HOSTS); do
    witness "$a" &
    wpids+=($!)
done

# The chaos loop.
RANDOM=$SEED
KILLABLE=(1 2 3 4 5 8)
kills=0 role_kills=0 flaps=0
while [ "$(date +%s)" -lt "$END" ]; do
    sleep $CHAOS_PERIOD
    # Any host but 6 and 7 (the UD witness's, see witness).
    h=${KILLABLE[$((RANDOM % ${#KILLABLE[@]}))]}
    if [ $((RANDOM % 4)) = 0 ]; then
        l=${LOSSY[$((RANDOM % ${#LOSSY[@]}))]}
        # The bridge stops forwarding its port (the host keeps its carrier and its routes,
        # as when a switch port or a cable in the path fails).
        ip -n "$P-br" link set "p$l" type bridge_slave state 0
        sleep 0.15
        ip -n "$P-br" link set "p$l" type bridge_slave state 3
        flaps=$((flaps + 1))
        continue
    fi
    # Victim programs on host h: "rc_pingpong -n 1000000" or "rping ... -C 1000000".
    victims=$(ip netns pids "$P-h$h" | while read -r pid; do
        grep -qa -- "1000000" "/proc/$pid/cmdline" 2>/dev/null &&
            ! grep -qa '^timeout' "/proc/$pid/cmdline" && echo "$pid"
    done)
    [ -n "$victims" ] || continue
    # The role holder: the live member with the lowest slot.
    holder=$(ns "$h" "$FERROCE" devinfo -d "$NET.$h" --counters 2>/dev/null |
        sed -n 's/^\tprocess \([0-9]*\) (slot \([0-9]*\)).*/\2 \1/p' | sort -n | head -1 | cut -d' ' -f2)
    target=""
    if [ -n "$holder" ] && echo "$victims" | grep -qx "$holder"; then
        target=$holder
        role_kills=$((role_kills + 1))
    else
        set -- $victims
        shift $((RANDOM % $#))
        target=$1
    fi
    kill -9 "$target" 2>/dev/null && kills=$((kills + 1))
done
echo "soak: traffic window over; waiting for the witnesses' last runs"
wait "${wpids[@]}" $rpid
# The victims' long runs end here (another SIGKILL each).
for i in $(seq 1 $HOSTS); do
    ip netns pids "$P-h$i" | xargs -r kill -9 2>/dev/null
done
wait

fail=0
runs=$(wc -l <"$OUT/witnesses.txt")
oks=$(grep -c ' ok ' "$OUT/witnesses.txt")
bytes=$(awk '$3 == "ok" { s += $4 } END { print s + 0 }' "$OUT/witnesses.txt")
vruns=$(wc -l <"$OUT/victims.txt" 2>/dev/null || echo 0)
echo "soak: $runs witness runs ($(cut -d' ' -f1 "$OUT/witnesses.txt" | sort | uniq -c | tr -s ' ' |
    paste -sd, -)), $oks passed, $bytes bytes checked by the programs; $vruns victim runs," \
    "$kills SIGKILLs ($role_kills of a role holder), $flaps link flaps"
races=$(grep -c 'rping-exit-race' "$OUT/witnesses.txt")
[ "$races" = 0 ] || echo "soak: in $races rping runs a side exited 255 on rping's own exit race" \
    "(rdma_get_cm_event after its channel's destroy: EBADF; fixed upstream in rdma-core 61)"
if [ "$oks" != "$runs" ] || [ "$runs" = 0 ]; then
    echo "soak: FAILED: witness runs that did not pass:"
    grep -v ' ok ' "$OUT/witnesses.txt" | head -20
    fail=1
fi
# The resident: all its connections passed, and what it holds did not grow with them.
rruns=$(wc -l <"$OUT/resident.txt" 2>/dev/null || echo 0)
roks=$(grep -c '^ok' "$OUT/resident.txt" 2>/dev/null || echo 0)
wrss="" wthr=0 wfds=0 ersss="" ethr=0 efds=0
read -r wrss wthr wfds <"$OUT/resident.warm" 2>/dev/null
read -r ersss ethr efds <"$OUT/resident.end" 2>/dev/null
echo "soak: resident rping -P server on $NET.1: $roks of $rruns connections passed; VmRSS" \
    "${wrss:-?} kB warm, ${ersss:-?} kB at the end; threads ${wthr:-?} -> ${ethr:-?}," \
    "descriptors ${wfds:-?} -> ${efds:-?}"
if [ "$rruns" = 0 ] || [ "$roks" != "$rruns" ]; then
    echo "soak: FAILED: resident connections that did not pass:"
    grep -v '^ok' "$OUT/resident.txt" | head -5
    fail=1
fi
if [ -z "$ersss" ] || [ -z "$wrss" ]; then
    echo "soak: FAILED: the resident server did not live through the run ($OUT/resident.srv)"
    fail=1
elif [ $((ersss - wrss)) -gt 4096 ] || [ "$ethr" -gt $((wthr + 1)) ] || [ "$efds" -gt $((wfds + 2)) ]; then
    echo "soak: FAILED: the resident server holds more than when warm (above)"
    fail=1
fi
if grep -l "panicked" "$OUT"/runs/* "$OUT/resident.srv" 2>/dev/null | head -5 | grep .; then
    echo "soak: FAILED: a program panicked (above)"
    fail=1
fi

# Nothing left behind: every address used once more (a SIGKILLed last member's registry file
# is removed by the next clean last member), then no process, socket or registry file.
for i in $(seq 1 $HOSTS); do
    prog "$i" timeout -s KILL 30 "$FERROCE" devinfo -d "$NET.$i" -v >/dev/null 2>&1 ||
        { echo "soak: FAILED: devinfo on $NET.$i"; fail=1; }
done
for i in $(seq 1 $HOSTS); do
    left=$(ip netns pids "$P-h$i" | wc -l)
    [ "$left" = 0 ] || { echo "soak: FAILED: $left processes left in host $i"; fail=1; }
    socks=$(ns "$i" ss -uan | grep -c ':4791 ')
    [ "$socks" = 0 ] || { echo "soak: FAILED: $socks sockets on port 4791 left in host $i"; fail=1; }
done
files=$(ls /dev/shm 2>/dev/null | grep -c "^ferroce-$NET\.")
if [ "$files" != 0 ]; then
    echo "soak: FAILED: registry files left: $(ls /dev/shm | grep "^ferroce-$NET\." | paste -sd' ')"
    fail=1
fi
if [ $fail = 0 ]; then
    echo "soak: PASSED (no process, socket or registry file left)"
fi
exit $fail
