#!/bin/sh
# Checks what the built plugin exports and links: exactly the NCCL tables and the C query API
# (nm -D --defined-only), and no CUDA runtime or driver among its dependencies (readelf -d).
set -eu
so="$1"
expected="ncclNetPlugin_v10
ncclNetPlugin_v11
ncclNetPlugin_v12
ncclNetPlugin_v8
ncclNetPlugin_v9
optireduceNetGetStats
optireduceNetStatsVersion"
actual=$(nm -D --defined-only "$so" | awk '{print $3}' | LC_ALL=C sort)
if [ "$actual" != "$expected" ]; then
  echo "unexpected dynamic exports of $so:"
  echo "--- expected"; echo "$expected"
  echo "--- actual"; echo "$actual"
  exit 1
fi
# The tables are data (NCCL reads them), the query API functions.
for v in 8 9 10 11 12; do
  nm -D --defined-only "$so" | grep -Eq "^[0-9a-f]+ [DdRr] ncclNetPlugin_v$v\$" ||
    { echo "ncclNetPlugin_v$v is not an exported data object"; exit 1; }
done
if readelf -d "$so" | grep NEEDED | grep -Eiq 'cudart|libcuda|libnccl'; then
  echo "$so links CUDA or NCCL:"; readelf -d "$so" | grep NEEDED; exit 1
fi
# A GNU_UNIQUE symbol would make the library impossible to unload (dlclose keeps it mapped).
if readelf --dyn-syms -W "$so" | grep -q UNIQUE; then
  echo "$so has STB_GNU_UNIQUE symbols: dlclose would not unload it"; exit 1
fi
echo "exports of $so: OK"
