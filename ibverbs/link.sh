#!/usr/bin/env bash
# link.sh STATIC_LIB OUTPUT: links ferroce's libibverbs static library into a shared object
# named libibverbs.so.1 with the symbol versions of rdma-core 44 (libibverbs.map).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
${CC:-cc} -shared -o "$2.tmp" -Wl,-soname,libibverbs.so.1 \
    -Wl,--version-script="$here/libibverbs.map" \
    -Wl,--whole-archive "$1" -Wl,--no-whole-archive \
    -lpthread -ldl -lm -lgcc_s -lc
mv "$2.tmp" "$2"
