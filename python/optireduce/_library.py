"""Finding and loading liboptireduce, and the ctypes declarations of its C API (optireduce.h).

The package carries no compiled extension: it talks to the C library through ctypes, so it
works with any PyTorch build (nothing is compiled against PyTorch's headers) and a call into
the library releases the GIL while it runs.
"""

import ctypes
import os
import threading

# optiResult_t
SUCCESS = 0
INVALID_ARGUMENT = 1
INVALID_USAGE = 2
SYSTEM_ERROR = 3
INTERNAL_ERROR = 4
REMOTE_ERROR = 5
UNSUPPORTED = 6
CUDA_ERROR = 7
NCCL_ERROR = 8

# optiDataType_t, optiRedOp_t, optiMode_t, optiErasure_t, optiGatherFill_t
FLOAT32, FLOAT16, BFLOAT16, FLOAT64 = 0, 1, 2, 3
SUM, AVG = 0, 1
EXACT, BOUNDED, UNTIL_STARTED = 0, 1, 2  # optiMode_t (UNTIL_STARTED: allgatherMode only)
ERASURE_RESCALE, ERASURE_ZERO = 0, 1
INCAST_MAX, INCAST_AUTO = 0, -1
GATHER_FILL_ZERO, GATHER_FILL_OWN = 0, 1


class Options(ctypes.Structure):
    _fields_ = [
        ("mode", ctypes.c_int),
        ("incast", ctypes.c_int),
        ("hadamard", ctypes.c_int),
        ("hadamardBlock", ctypes.c_int64),
        ("erasure", ctypes.c_int),
        ("safeguard", ctypes.c_double),
        ("safeguardRedo", ctypes.c_int),
        ("exactBelowBytes", ctypes.c_int64),
        ("nonfiniteAgree", ctypes.c_int),
        ("allgatherMode", ctypes.c_int),
        ("gatherFill", ctypes.c_int),
    ]


class Stats(ctypes.Structure):
    _fields_ = [
        ("calls", ctypes.c_uint64),
        ("exactCalls", ctypes.c_uint64),
        ("elementsExpected", ctypes.c_uint64 * 2),
        ("elementsLost", ctypes.c_uint64 * 2),
        ("blocksEmpty", ctypes.c_uint64),
        ("deadlineHits", ctypes.c_uint64),
        ("safeguardFlags", ctypes.c_uint64),
        ("safeguardRedos", ctypes.c_uint64),
        ("tbUs", ctypes.c_uint32),
        ("tcUs", ctypes.c_uint32),
        ("incast", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("lostFraction", ctypes.c_double),
        ("timeUs", ctypes.c_double),
        ("nonfiniteCalls", ctypes.c_uint64),
    ]


STORE_SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                             ctypes.c_size_t)
STORE_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.c_int)


class StoreCallbacks(ctypes.Structure):
    _fields_ = [("user", ctypes.c_void_p), ("set", STORE_SET), ("get", STORE_GET)]


_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    # Installed by pip: the copy built into the package.
    yield os.path.join(here, "lib", "liboptireduce.so")
    # A source tree (python/optireduce/ beside the README's build directory).
    yield os.path.join(os.path.dirname(os.path.dirname(here)), "build", "collectives",
                       "liboptireduce.so")


def _declare(lib):
    c_int, c_size_t, c_void_p, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
    comm_p = ctypes.POINTER(c_void_p)
    decl = {
        "optiOptionsDefault": (c_int, [ctypes.POINTER(Options)]),
        "optiHostCommInitStore": (c_int, [comm_p, ctypes.POINTER(StoreCallbacks), c_int, c_int,
                                          ctypes.POINTER(Options)]),
        "optiCommInit": (c_int, [comm_p, c_void_p, ctypes.POINTER(Options)]),
        "optiCommDestroy": (c_int, [c_void_p]),
        "optiCommAbort": (c_int, [c_void_p]),
        "optiCommSetOptions": (c_int, [c_void_p, ctypes.POINTER(Options)]),
        "optiAllReduce": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]),
        "optiGetStats": (c_int, [c_void_p, ctypes.POINTER(Stats), ctypes.POINTER(Stats)]),
        "optiGetErrorString": (c_char_p, [c_int]),
        "optiGetLastError": (c_char_p, []),
    }
    for name, (res, args) in decl.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


def load_library(path=None):
    """Loads liboptireduce (once per process) and returns it. `path`: an explicit file; else the
    copy installed with the package, else a source tree's build/collectives/."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            if path is not None and os.path.abspath(path) != _lib_path:
                raise RuntimeError(
                    f"optireduce: {_lib_path} is already loaded in this process; cannot load {path}")
            return _lib
        tried = [path] if path is not None else list(_candidates())
        for p in tried:
            if p is not None and os.path.isfile(p):
                lib = ctypes.CDLL(p)
                _declare(lib)
                _lib, _lib_path = lib, os.path.abspath(p)
                return lib
        raise OSError("optireduce: liboptireduce.so not found (looked at: " + ", ".join(tried) +
                      "); install the package with pip (README), build the source tree "
                      "(bash .ci/setup), or pass optireduce.load_library(path)")


def library_path():
    load_library()
    return _lib_path
