#!/bin/sh
# Fails when a library reaches libibverbs other than through the dlopen table (verbs/
# ibv_symbols.cc): a static library with an undefined ibv_* reference, or a shared object that
# lists libibverbs as NEEDED, would stop the plugin from loading on hosts without RDMA.
# Usage: check-no-ibv-link.sh LIB...   (.a or .so)
status=0
for lib in "$@"; do
  case "$lib" in
    *.so*)
      if readelf -d "$lib" | grep -q 'NEEDED.*libibverbs'; then
        echo "$lib: links libibverbs (NEEDED)"; status=1
      fi
      bad=$(nm -D --undefined-only "$lib" | awk '{print $NF}' | grep -E '^_*ibv_' || true) ;;
    *)
      bad=$(nm -u "$lib" 2>/dev/null | awk '{print $NF}' | grep -E '^_*ibv_' || true) ;;
  esac
  if [ -n "$bad" ]; then
    echo "$lib references libibverbs directly:"; echo "$bad"; status=1
  fi
done
[ $status = 0 ] && echo "no direct libibverbs reference in: $*"
exit $status
