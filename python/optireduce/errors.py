"""The one exception the package raises for a failed library call, carrying the result code."""

from . import _library as L

_NAMES = {
    L.INVALID_ARGUMENT: "invalid argument",
    L.INVALID_USAGE: "invalid usage",
    L.SYSTEM_ERROR: "system error",
    L.INTERNAL_ERROR: "internal error",
    L.REMOTE_ERROR: "remote error",
    L.UNSUPPORTED: "unsupported",
    L.CUDA_ERROR: "CUDA error",
    L.NCCL_ERROR: "NCCL error",
}


class OptiReduceError(RuntimeError):
    """A liboptireduce call failed. `code` is its optiResult_t; REMOTE_ERROR means a peer failed
    or went away (for example another rank's hook raised and aborted the communicator)."""

    def __init__(self, code, message):
        self.code = code
        super().__init__(f"optireduce: {message} ({_NAMES.get(code, code)})")


def check(code, what):
    """Raises for a failed call: ValueError for bad options or arguments (the message names the
    option), OptiReduceError for everything else."""
    if code == L.SUCCESS:
        return
    lib = L.load_library()
    detail = (lib.optiGetLastError() or b"").decode(errors="replace")
    message = f"{what}: {detail}" if detail else what
    if code in (L.INVALID_ARGUMENT, L.INVALID_USAGE):
        raise ValueError(f"optireduce: {message}")
    raise OptiReduceError(code, message)
