#!/usr/bin/env bash
# Installs the Debian 12 packages the build, the tests and the benchmarks need, skipping those
# already present. Sourced by .ci/setup and .ci/run; uses sudo when not run as root.
set -euo pipefail

OPTIREDUCE_DEBS=(
  build-essential meson ninja-build pkg-config
  libgtest-dev libgmock-dev
  libibverbs-dev rdma-core ibverbs-providers ibverbs-utils
  libgloo-dev openmpi-bin libopenmpi-dev
  iproute2 iptables iperf3 ethtool
  qemu-system-x86 debootstrap cpio zstd
  clang libclang-rt-14-dev
  python3-matplotlib
  python3-torch python3-numpy python3-setuptools python3-wheel python3-pip python3-venv
  dataset-fashion-mnist
)

optireduce_install_deps() {
  local missing=()
  for p in "${OPTIREDUCE_DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "optireduce: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
