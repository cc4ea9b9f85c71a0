#!/usr/bin/env bash
# Builds ferroce's libibverbs.so.1 and librdmacm.so.1 into target/ferroce-ibverbs/ (or $1):
# put that directory on LD_LIBRARY_PATH to run rdma_cm programs (rping, ucmatose, ...) on ferroce.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/target/ferroce-ibverbs}
profile=${FERROCE_IBVERBS_PROFILE:-release}
flag=--release
[ "$profile" = debug ] && flag=
target_dir=${CARGO_TARGET_DIR:-$root/target}
"$root/ibverbs/build.sh" "$out" >/dev/null
(cd "$root" && cargo build -q $flag -p ferroce-librdmacm --lib)
"$root/librdmacm/link.sh" "$target_dir/$profile/libferroce_librdmacm.a" "$out/libibverbs.so.1" "$out/librdmacm.so.1"
echo "$out/librdmacm.so.1"
