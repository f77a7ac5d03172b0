"""A liboptireduce communicator (optiComm_t) owned by a Python object.

Host communicators rendezvous through any store with the c10d Store methods set(key, value),
get(key) and wait([keys], timedelta) (PyTorch's TCPStore, FileStore, PrefixStore...), handed to
the library as optiStore_t callbacks. GPU communicators wrap an NCCL communicator (a pointer).
"""

import ctypes
import datetime
import threading

from . import _library as L
from .errors import OptiReduceError, check


class _StoreBridge:
    """optiStore_t callbacks over a c10d-style store. The library calls them only inside init
    and destroy, on the calling thread; a Python exception must never cross into C, so each
    callback returns an error code and keeps the exception for the message."""

    def __init__(self, store):
        self.store = store
        self.error = None
        self._set = L.STORE_SET(self._on_set)
        self._get = L.STORE_GET(self._on_get)
        self.callbacks = L.StoreCallbacks(None, self._set, self._get)

    def _on_set(self, _user, key, value, length):
        try:
            self.store.set(key.decode(), ctypes.string_at(value, length))
            return 0
        except Exception as e:  # noqa: BLE001 - reported through the library's error
            self.error = e
            return 2

    def _on_get(self, _user, key, value, cap, length, timeout_ms):
        k = key.decode()
        try:
            self.store.wait([k], datetime.timedelta(milliseconds=timeout_ms))
        except Exception as e:  # noqa: BLE001 - c10d raises RuntimeError on a timeout
            if "timeout" in str(e).lower() or "timed out" in str(e).lower():
                return 1
            self.error = e
            return 2
        try:
            data = bytes(self.store.get(k))
        except Exception as e:  # noqa: BLE001
            self.error = e
            return 2
        length[0] = len(data)
        ctypes.memmove(value, data, min(len(data), cap))
        return 0


class Communicator:
    """One liboptireduce communicator. allreduce() may be called from one thread at a time (the
    library serialises calls anyway; ranks must issue them in the same order)."""

    def __init__(self, handle, bridge, rank, size, is_gpu):
        self._handle = handle
        self._bridge = bridge  # keeps the callbacks alive as long as the library may call them
        self.rank = rank
        self.size = size
        self.is_gpu = is_gpu
        self._lock = threading.Lock()

    @classmethod
    def host(cls, store, rank, size, options):
        lib = L.load_library()
        bridge = _StoreBridge(store)
        handle = ctypes.c_void_p()
        rc = lib.optiHostCommInitStore(ctypes.byref(handle), ctypes.byref(bridge.callbacks), rank,
                                       size, ctypes.byref(options))
        if rc != L.SUCCESS and bridge.error is not None:
            raise OptiReduceError(rc, f"host communicator rendezvous failed: {bridge.error!r}")
        check(rc, "optiHostCommInitStore")
        return cls(handle, bridge, rank, size, is_gpu=False)

    @classmethod
    def gpu(cls, nccl_comm, rank, size, options):
        """nccl_comm: an ncclComm_t (int or c_void_p) this communicator builds its sibling from."""
        lib = L.load_library()
        handle = ctypes.c_void_p()
        check(lib.optiCommInit(ctypes.byref(handle), ctypes.c_void_p(int(nccl_comm)),
                               ctypes.byref(options)), "optiCommInit")
        return cls(handle, None, rank, size, is_gpu=True)

    @property
    def alive(self):
        return self._handle is not None

    def _live(self):
        if self._handle is None:
            raise OptiReduceError(L.INVALID_USAGE, "the communicator is closed")
        return self._handle

    def allreduce(self, ptr, count, dtype, op=L.AVG, stream=None):
        """In place on `count` elements at address `ptr`. Host: returns when done (the GIL is
        released meanwhile). GPU: enqueues on `stream` (an int cudaStream_t; None: default)."""
        lib = L.load_library()
        rc = lib.optiAllReduce(ptr, ptr, count, dtype, op, self._live(), stream)
        check(rc, "optiAllReduce")

    def set_options(self, options):
        check(L.load_library().optiCommSetOptions(self._live(), ctypes.byref(options)),
              "optiCommSetOptions")

    def stats(self):
        """(last call, cumulative) as optireduce.Stats."""
        last, total = L.Stats(), L.Stats()
        check(L.load_library().optiGetStats(self._live(), ctypes.byref(last), ctypes.byref(total)),
              "optiGetStats")
        return Stats.of(last), Stats.of(total)

    def destroy(self):
        """Collective: every rank must call it after its last allreduce."""
        with self._lock:
            h, self._handle = self._handle, None
        if h is not None:
            check(L.load_library().optiCommDestroy(h), "optiCommDestroy")

    def abort(self):
        """Not collective: frees at once; peers waiting on this rank fail instead of waiting."""
        with self._lock:
            h, self._handle = self._handle, None
        if h is not None:
            check(L.load_library().optiCommAbort(h), "optiCommAbort")


class Stats:
    """optiStats_t with Python names. elements_* add both phases (elements_lost_gather: phase 2's
    alone); lost_fraction as the library's."""

    __slots__ = ("calls", "exact_calls", "elements_expected", "elements_lost",
                 "elements_lost_gather", "blocks_empty", "deadline_hits", "safeguard_flags",
                 "safeguard_redos", "tb_us", "tc_us",
                 "incast", "lost_fraction", "time_us", "nonfinite_calls")

    @classmethod
    def of(cls, s):
        o = cls()
        o.calls = s.calls
        o.exact_calls = s.exactCalls
        o.elements_expected = s.elementsExpected[0] + s.elementsExpected[1]
        o.elements_lost = s.elementsLost[0] + s.elementsLost[1]
        # Phase 2's share: an element lost there leaves this rank's result unlike its peers'.
        o.elements_lost_gather = s.elementsLost[1]
        o.blocks_empty = s.blocksEmpty
        o.deadline_hits = s.deadlineHits
        o.safeguard_flags = s.safeguardFlags
        o.safeguard_redos = s.safeguardRedos
        o.tb_us = s.tbUs
        o.tc_us = s.tcUs
        o.incast = s.incast
        o.lost_fraction = s.lostFraction
        o.time_us = s.timeUs
        o.nonfinite_calls = s.nonfiniteCalls
        return o

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self):
        return "Stats(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"
