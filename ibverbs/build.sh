#!/usr/bin/env bash
# Builds libibverbs.so.1 (ferroce's libibverbs ABI) into target/ferroce-ibverbs/ (or $1).
# The Rust static library is linked as a shared object with libibverbs' symbol-version script:
# a Rust cdylib cannot carry version nodes (rustc passes its own anonymous version script).
# FERROCE_IBVERBS_PROFILE=debug builds the debug profile (faster to build, slower to run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/target/ferroce-ibverbs}
profile=${FERROCE_IBVERBS_PROFILE:-release}
flag=--release
[ "$profile" = debug ] && flag=
target_dir=${CARGO_TARGET_DIR:-$root/target}
(cd "$root" && cargo build -q $flag -p ferroce-ibverbs --lib)
mkdir -p "$out"
"$root/ibverbs/link.sh" "$target_dir/$profile/libferroce_ibverbs.a" "$out/libibverbs.so.1"
echo "$out/libibverbs.so.1"
