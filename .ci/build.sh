#!/usr/bin/env bash
# Configures and builds one build directory. Sourced by .ci/setup and .ci/run. A directory left
# configured with other options (another build type, sanitizers on or off) is reconfigured in
# place, so neither README command depends on what the other, or an older checkout, left there.
set -euo pipefail

# optireduce_build DIR BUILDTYPE [SANITIZE]   (SANITIZE: meson's b_sanitize value, default none)
optireduce_build() {
  local dir=$1 buildtype=$2 sanitize=${3:-none}
  local opts=(-Dbuildtype="$buildtype" -Db_sanitize="$sanitize")
  # Sanitizer runtimes are linked into executables, not into the plugin .so, so shared objects
  # must be allowed undefined (sanitizer) symbols. The libFuzzer targets are built by clang with
  # their own sanitizers whatever the configuration: the same binaries in every build directory,
  # and 50 s of one core each to build, so only the plain configuration builds (and runs) them.
  local fuzz=auto lundef=true
  if [ "$sanitize" != none ]; then fuzz=disabled lundef=false; fi
  opts+=(-Db_lundef="$lundef" -Dfuzz="$fuzz")
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "${opts[@]}"
  elif ! optireduce_build_matches "$dir" "$buildtype" "$sanitize" "$fuzz"; then
    echo "optireduce: $dir was configured differently; reconfiguring as $buildtype (sanitize: $sanitize)"
    meson configure "$dir" "${opts[@]}"
  fi
  ninja -C "$dir" -j"$(nproc)"
}

# True when DIR's configuration already has this build type, sanitizer and fuzz setting.
optireduce_build_matches() {
  python3 - "$1/meson-info/intro-buildoptions.json" "$2" "$3" "$4" <<'PY'
import json, sys
try:
    opts = {o["name"]: o["value"] for o in json.load(open(sys.argv[1]))}
except (OSError, ValueError):
    sys.exit(1)
sys.exit(0 if (opts.get("buildtype"), opts.get("b_sanitize"), opts.get("fuzz")) == tuple(sys.argv[2:5])
         else 1)
PY
}
