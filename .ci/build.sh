#!/usr/bin/env bash
# Configures and builds one build directory. Sourced by .ci/setup and .ci/run. A directory left
# configured with other options (another build type, sanitizers on or off) is reconfigured in
# place, so neither README command depends on what the other, or an older checkout, left there.
set -euo pipefail

# optireduce_build DIR BUILDTYPE [SANITIZE]   (SANITIZE: meson's b_sanitize value, default none)
# Configures DIR, then builds every target in it.
optireduce_build() {
  optireduce_configure "$@"
  ninja -C "$1" -j"$(nproc)"
}

# optireduce_configure DIR BUILDTYPE [SANITIZE]: configures DIR and builds nothing. .ci/run
# configures its sanitizer directories this way and lets `meson test` build what the suites it
# runs depend on (each test names its targets), not the benchmarks or the suites it leaves out.
optireduce_configure() {
  local dir=$1 buildtype=$2 sanitize=${3:-none}
  # The plain configuration is the one users run: everything found is built.
  # A sanitizer configuration is a test configuration, and two cores build it in CI:
  #  - Sanitizer runtimes are linked into executables, not into the plugin .so, so shared
  #    objects must be allowed undefined (sanitizer) symbols.
  #  - No libFuzzer targets: clang builds them with sanitizers of their own whatever the
  #    configuration, the same binaries in every directory, 50 s of one core each.
  #  - No GPU path (nvcc's kernels.cu is 30 s of one core): device code is not instrumented,
  #    and its host code is tested under the sanitizers over the emulated GPU (tests/gpu_emu).
  #  - Line tables only (-g1): a sanitizer's report needs functions, files and lines, not
  #    variables and types; -O0 -g1 compiles a test file in 12% less time than -O0 -g.
  #  - ThreadSanitizer at -O1: half the compile time of -O2 for the same reports (TSan's own
  #    advice is -O1 or more).
  local fuzz=auto lundef=true cuda=auto args=""
  if [ "$sanitize" != none ]; then fuzz=disabled lundef=false cuda=disabled args="-g1"; fi
  if [ "$sanitize" = thread ]; then args="-O1 -g1"; fi
  local opts=(-Dbuildtype="$buildtype" -Db_sanitize="$sanitize" -Db_lundef="$lundef"
              -Dfuzz="$fuzz" -Dcuda="$cuda" -Dc_args="$args" -Dcpp_args="$args")
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "${opts[@]}"
  elif ! optireduce_build_matches "$dir" "${opts[@]}"; then
    echo "optireduce: $dir was configured differently; reconfiguring as $buildtype (sanitize: $sanitize)"
    # --wipe, not --reconfigure: meson 1.0 leaves c_args/cpp_args as they were on a
    # reconfigure, and `meson configure` refuses an option the directory does not know yet.
    meson setup --wipe "$dir" "${opts[@]}"
  fi
}

# True when DIR's configuration already has every -Dname=value given (list options compare
# as their words joined by spaces).
optireduce_build_matches() {
  local dir=$1
  shift
  python3 - "$dir/meson-info/intro-buildoptions.json" "$@" <<'PY'
import json, sys
try:
    opts = {o["name"]: o["value"] for o in json.load(open(sys.argv[1]))}
except (OSError, ValueError):
    sys.exit(1)
def text(v):
    return " ".join(map(str, v)) if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else str(v)
for arg in sys.argv[2:]:
    name, _, want = arg[2:].partition("=")
    if name not in opts or text(opts[name]) != want:
        sys.exit(1)
PY
}
