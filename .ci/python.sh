#!/usr/bin/env bash
# Installs the Python package (python/) into .venv, a virtual environment over Debian's python3
# that also sees Debian's packages (python3-torch). Sourced by .ci/setup and .ci/run, after the
# release build (setup.py bundles that build's liboptireduce into the package).
set -euo pipefail

optireduce_install_python() {
  if [ ! -x .venv/bin/python ]; then
    /usr/bin/python3 -m venv --system-site-packages .venv
  fi
  # No index, no build isolation: everything comes from Debian's packages (setuptools, wheel).
  .venv/bin/python -m pip install --quiet --no-index --no-build-isolation --no-deps \
    --force-reinstall ./python
  echo "optireduce: Python package installed in .venv ($(.venv/bin/python -c \
    'import optireduce; print(optireduce.library_path())'))"
}
