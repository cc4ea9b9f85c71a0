#!/usr/bin/env bash
# link.sh STATIC_LIB LIBIBVERBS OUTPUT: links ferroce's librdmacm static library into
# librdmacm.so.1 with the symbol versions of rdma-core 44 (librdmacm.map), needing ferroce's
# libibverbs.so.1 (LIBIBVERBS, which holds the implementation).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
${CC:-cc} -shared -o "$3.tmp" -Wl,-soname,librdmacm.so.1 \
    -Wl,--version-script="$here/librdmacm.map" \
    -Wl,--whole-archive "$1" -Wl,--no-whole-archive \
    -L"$(dirname "$2")" -l:"$(basename "$2")" -Wl,--no-undefined \
    -lpthread -ldl -lm -lgcc_s -lc
mv "$3.tmp" "$3"
