"""The package as `pip install` put it into .venv (README command 1; .ci/run installs it too):
it imports from the environment, not from the source tree, loads the liboptireduce bundled in
it, and reduces through a PyTorch store.

    installed_test.py VENV
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402

CHECK = r"""
import ctypes, os, sys
import optireduce
pkg = os.path.dirname(optireduce.__file__)
assert "site-packages" in pkg, "imported from " + pkg
assert optireduce.library_path().startswith(pkg), optireduce.library_path()
try:
    import torch, torch.distributed as dist
except ImportError:
    print("no torch: imported and loaded only"); sys.exit(0)
comm = optireduce.Communicator.host(dist.HashStore(), 0, 1, optireduce.make_options())
t = torch.arange(1000, dtype=torch.float32)
comm.allreduce(t.data_ptr(), t.numel(), 0)
assert torch.equal(t, torch.arange(1000, dtype=torch.float32))
assert comm.stats()[1].calls == 1
comm.destroy()
import optireduce.torch
print("ok", optireduce.library_path())
"""

if __name__ == "__main__":
    venv = sys.argv[1]
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        print(f"skipped: no {venv} (bash .ci/setup or .ci/run installs the package there)")
        sys.exit(ranks.SKIP)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([py, "-c", CHECK], env=env, cwd="/", capture_output=True, text=True)
    print(p.stdout, p.stderr)
    sys.exit(p.returncode)
