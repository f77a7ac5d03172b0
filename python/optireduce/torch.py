"""A PyTorch DDP communication hook over liboptireduce, for an unmodified PyTorch:

    state = optireduce.torch.OptiReduceState(process_group=None)
    model.register_comm_hook(state, optireduce.torch.allreduce_hook)

CPU buckets go through the host path (the library's own transport); CUDA buckets through the GPU
path, on an NCCL communicator the state builds itself (its unique id swapped through the store).
Only public PyTorch API is used: torch.futures.Future, c10d stores, GradBucket.buffer().

The hook is asynchronous on the host path: it queues the bucket and returns a Future that the
state's worker thread completes when the library returns (the call releases the GIL), so the
autograd thread goes on computing the next buckets' gradients meanwhile. Buckets are reduced in
the order DDP hands them over, the same on every rank. The result is averaged over ranks, as
DDP's default hook does. On the GPU path the call only enqueues work on the current stream, and
the Future completes at once: later work on that stream is ordered after it, as with NCCL.

A failure on one rank becomes an exception on every rank instead of a hang: the failing rank's
state aborts its communicator (optiCommAbort), which closes its connections, so every peer's
pending call fails with a remote error, and each rank's Future carries the exception, which DDP
raises from backward().
"""

import atexit
import ctypes
import datetime
import hashlib
import os
import queue
import sys
import threading
import weakref

import torch
import torch.distributed as dist

from . import _library as L
from .comm import Communicator, Stats
from .errors import OptiReduceError
from .options import describe, make_options, resync_steps as _resync_steps

__all__ = ["OptiReduceState", "allreduce_hook", "leave"]

_DTYPES = {
    torch.float32: L.FLOAT32,
    torch.float16: L.FLOAT16,
    torch.bfloat16: L.BFLOAT16,
    torch.float64: L.FLOAT64,
}

# States made by this process, counted per process group: a group's members make its states in
# the same order, so the group's ranks and the count name a state's keys in a store the ranks
# share. The ranks matter where several groups share one store: DDP over each data-parallel group
# of a model split by tensor or pipeline parallelism gives every group a state, and with the
# count alone each group's first state took the same keys, so ranks of different groups
# rendezvoused with each other and hung.
_serial_lock = threading.Lock()
_serials = {}
_live_states = weakref.WeakSet()


def _group_ranks(process_group):
    """The global ranks of process_group in its rank order; a clear error where this process is
    not one of them."""
    if process_group is None:
        return list(range(dist.get_world_size()))
    ranks = dist.get_process_group_ranks(process_group)
    if dist.get_rank() not in ranks:
        raise ValueError(f"optireduce: option process_group: this process (global rank "
                         f"{dist.get_rank()}) is not one of its ranks {ranks}")
    return ranks


def _state_prefix(ranks):
    """The store prefix of this process's next state over the group of these global ranks. It
    names torchrun's restart too: an elastic agent's store can outlive the workers of one
    attempt, and the next attempt's states count from 1 again, where a rank could read the
    addresses the last attempt's ranks left there."""
    key = hashlib.sha256(",".join(map(str, ranks)).encode()).hexdigest()[:16]
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    with _serial_lock:
        _serials[key] = _serials.get(key, 0) + 1
        return f"optireduce.torch/{attempt}/{key}/{_serials[key]}"


def _default_store(timeout):
    """A client of the store torch.distributed's env:// rendezvous serves on MASTER_ADDR:MASTER_PORT
    (torchrun sets both). PyTorch has no public API to read a process group's own store, so any
    other set-up passes store= explicitly."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise ValueError(
            "optireduce: option store=None needs MASTER_ADDR and MASTER_PORT (as torchrun and "
            "init_method='env://' set them); otherwise pass store= (any torch.distributed Store "
            "every rank reaches, e.g. the one given to init_process_group)")
    try:
        port_n = int(port)
    except ValueError:
        raise ValueError(f"optireduce: MASTER_PORT={port!r} is not a port number") from None
    return dist.TCPStore(addr, port_n, None, False, timeout)


class _NcclLib:
    """The few NCCL calls the GPU path needs, through ctypes (no compiled extension)."""

    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]

        # All 128 bytes, both ways: the c_char field reads as bytes cut at the first zero byte,
        # and writing through it would write into a copy.
        def to_bytes(self):
            return ctypes.string_at(ctypes.addressof(self), ctypes.sizeof(self))

        @classmethod
        def from_bytes(cls, raw):
            if len(raw) != ctypes.sizeof(cls):
                raise OptiReduceError(L.INTERNAL_ERROR, f"an NCCL unique id has "
                                      f"{ctypes.sizeof(cls)} bytes, not {len(raw)}")
            return cls.from_buffer_copy(raw)

    def __init__(self):
        self.lib = ctypes.CDLL("libnccl.so.2")
        self.lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(self.UniqueId)]
        self.lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                              self.UniqueId, ctypes.c_int]
        self.lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
        self.lib.ncclCommAbort.argtypes = [ctypes.c_void_p]
        self.lib.ncclGetErrorString.restype = ctypes.c_char_p

    def check(self, rc, what):
        if rc != 0:
            raise OptiReduceError(L.NCCL_ERROR,
                                  f"{what}: {self.lib.ncclGetErrorString(rc).decode()}")


class OptiReduceState:
    """The hook's state: options, the communicators (made on first use, collectively) and the
    statistics of the last call.

    process_group: whose ranks take part (None: the default group). store: a torch.distributed
    Store every rank reaches (None: a client of MASTER_ADDR:MASTER_PORT, the env:// store).
    The other keyword arguments are the library's options (optireduce.h), each defaulting to its
    OPTIREDUCE_* variable: mode ('exact' | 'bounded'), incast (int >= 1 | 'max' | 'auto'),
    hadamard (bool), hadamard_block (power of two), erasure ('rescale' | 'zero'), safeguard
    (fraction in [0, 1]), safeguard_redo (bool), exact_below (bytes), nonfinite_agree (bool:
    bounded calls agree exactly whether any rank's bucket held a NaN/Inf and then give every
    rank a non-finite bucket alike, so a GradScaler skips the step on every rank or on none),
    allgather_mode ('started' | 'bounded' | 'exact': how bounded calls run phase 2; started cuts
    only a peer whose shard has not begun to arrive by the deadline and receives the rest whole,
    bounded cuts it like phase 1, exact keeps every replica's gradient identical but waits for a
    straggler there), gather_fill ('zero' |
    'own': what an element lost in phase 2 becomes). A bad value raises ValueError naming the
    option.

    resync_steps (OPTIREDUCE_RESYNC_STEPS, default 20; 0: never): bounded mode lets replicas
    drift apart, since a rank that loses part of phase 2 (a straggler loses all of it) applies
    a stand-in where its peers applied the owner's values. Every resync_steps steps the hook
    asks, in one exact 4-byte call, whether any rank lost phase-2 elements since the last
    resync, and if one did, averages every bucket's parameters exactly over the ranks during
    that step's backward pass, before the optimizer's step: the replicas are the same bits
    again. Exact mode and allgather_mode='exact' never drift and never resync.
    sync_parameters(params) does the same on demand (before a checkpoint, say).
    """

    def __init__(self, process_group=None, store=None, *, mode=None, incast=None, hadamard=None,
                 hadamard_block=None, erasure=None, safeguard=None, safeguard_redo=None,
                 exact_below=None, nonfinite_agree=None, allgather_mode=None, gather_fill=None,
                 resync_steps=None, timeout=datetime.timedelta(minutes=5), max_queued=256):
        if not dist.is_initialized():
            raise RuntimeError("optireduce: call torch.distributed.init_process_group first")
        if not isinstance(max_queued, int) or max_queued < 1:
            raise ValueError(f"optireduce: option max_queued={max_queued!r}: must be an integer >= 1")
        self._options = make_options(mode=mode, incast=incast, hadamard=hadamard,
                                     hadamard_block=hadamard_block, erasure=erasure,
                                     safeguard=safeguard, safeguard_redo=safeguard_redo,
                                     exact_below=exact_below, nonfinite_agree=nonfinite_agree,
                                     allgather_mode=allgather_mode, gather_fill=gather_fill)
        # The same options with mode exact: the resync's calls.
        self._exact_options = L.Options.from_buffer_copy(self._options)
        self._exact_options.mode = L.EXACT
        self.resync_steps = _resync_steps(resync_steps)
        self._can_drift = (self._options.mode != L.EXACT and self._options.allgatherMode != L.EXACT)
        self._steps_seen = 0          # steps whose last bucket reached the hook (autograd thread)
        self._drifted = False         # this rank lost phase-2 elements in an earlier step (worker)
        self._drifted_now = False     # ... in the step in progress
        self._resync_step = -1        # the step whose resync was decided, and the decision
        self._resync_go = False
        self.resyncs = 0              # resyncs that averaged the parameters
        self.process_group = process_group
        ranks = _group_ranks(process_group)
        self.rank = dist.get_rank(process_group)
        self.size = len(ranks)
        self.options = describe(self._options)
        self._timeout = timeout
        self._base_store = store
        self._prefix = _state_prefix(ranks)
        self._store = None
        self._host = None
        self._gpu = None
        self._nccl = None
        self._nccl_comm = None
        self._failure = None  # the first exception; every later call fails with it
        self._lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.last_stats = None  # Stats of the last completed call
        self._step = self._empty_step()
        self._queue = queue.Queue(maxsize=max_queued)  # bounded: DDP has few buckets per step
        self._busy = False
        self._fail_at_call = None  # tests only: raise in the worker before this call (1-based)
        self._calls = 0
        self._worker = None
        _live_states.add(self)

    # ---- statistics
    @staticmethod
    def _empty_step():
        return {"calls": 0, "exact_calls": 0, "elements_expected": 0, "elements_lost": 0,
                "deadline_hits": 0, "safeguard_flags": 0, "nonfinite_calls": 0, "time_us": 0.0}

    def _record(self, last):
        with self._stats_lock:
            self.last_stats = last
            s = self._step
            s["calls"] += 1
            s["exact_calls"] += last.exact_calls
            s["elements_expected"] += last.elements_expected
            s["elements_lost"] += last.elements_lost
            s["deadline_hits"] += last.deadline_hits
            s["safeguard_flags"] += last.safeguard_flags
            s["nonfinite_calls"] += last.nonfinite_calls
            s["time_us"] += last.time_us

    def step_stats(self):
        """Totals of the calls completed since the previous step_stats() (e.g. one training
        step's buckets), with lost_fraction = elements_lost / elements_expected."""
        with self._stats_lock:
            s, self._step = self._step, self._empty_step()
        s["lost_fraction"] = s["elements_lost"] / s["elements_expected"] if s["elements_expected"] else 0.0
        return s

    def total_stats(self):
        """Cumulative Stats of the host communicator (None before its first call)."""
        return self._host.stats()[1] if self._host is not None else None

    # ---- communicators
    def _rendezvous_store(self):
        if self._store is None:
            base = self._base_store if self._base_store is not None else _default_store(self._timeout)
            self._store = dist.PrefixStore(self._prefix, base)
        return self._store

    def _host_comm(self):
        if self._host is None:
            self._host = Communicator.host(dist.PrefixStore("host", self._rendezvous_store()),
                                           self.rank, self.size, self._options)
        return self._host

    def _gpu_comm(self, device):
        if self._gpu is None:
            store = dist.PrefixStore("gpu", self._rendezvous_store())
            self._nccl = _NcclLib()
            uid = _NcclLib.UniqueId()
            if self.rank == 0:
                self._nccl.check(self._nccl.lib.ncclGetUniqueId(ctypes.byref(uid)),
                                 "ncclGetUniqueId")
                store.set("nccl-id", uid.to_bytes())
            else:
                store.wait(["nccl-id"], self._timeout)
                uid = _NcclLib.UniqueId.from_bytes(bytes(store.get("nccl-id")))
            comm = ctypes.c_void_p()
            with torch.cuda.device(device):
                self._nccl.check(self._nccl.lib.ncclCommInitRank(ctypes.byref(comm), self.size,
                                                                 uid, self.rank),
                                 "ncclCommInitRank")
                self._nccl_comm = comm
                self._gpu = Communicator.gpu(comm.value, self.rank, self.size, self._options)
        return self._gpu

    # ---- calls
    def _fail(self, exc):
        """The first failure sticks, and this rank leaves at once so its peers fail too."""
        with self._lock:
            if self._failure is None:
                self._failure = exc
        self.abort()

    def allreduce_async(self, tensor, _resync=None):
        """Averages `tensor` (contiguous fp32/fp16/bf16/fp64) over the ranks in place; returns a
        torch.futures.Future of the tensor. (_resync: the hook's _Resync for the bucket.)"""
        fut = torch.futures.Future()
        if self._failure is not None:
            fut.set_exception(self._failure)
            return fut
        bad = None
        if tensor.dtype not in _DTYPES or not tensor.is_contiguous():
            kind = "" if tensor.is_contiguous() else "non-contiguous "
            bad = TypeError(f"optireduce: cannot reduce a {kind}{tensor.dtype} tensor "
                            "(fp32, fp16, bf16 or fp64, contiguous)")
        if tensor.is_cuda:
            if bad is not None:
                self._fail(bad)
                fut.set_exception(bad)
                return fut
            try:
                self._calls += 1
                comm = self._gpu_comm(tensor.device)
                stream = torch.cuda.current_stream(tensor.device).cuda_stream
                comm.allreduce(tensor.data_ptr(), tensor.numel(), _DTYPES[tensor.dtype], L.AVG,
                               stream)
                last = comm.stats()[0]
                self._record(last)
                if _resync is not None:
                    self._after_bucket(comm, _resync, last, tensor.device, stream)
                fut.set_result(tensor)
            except Exception as e:  # noqa: BLE001 - surfaced through the Future
                self._fail(e)
                fut.set_exception(e)
            return fut
        # A bad bucket fails in the worker, in order: the abort must not race a running call.
        self._start_worker()
        self._queue.put((bad if bad is not None else tensor, fut, _resync))
        return fut

    def _start_worker(self):
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="optireduce-hook", daemon=True)
            self._worker.start()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            tensor, fut, resync = item
            if self._failure is not None:
                fut.set_exception(self._failure)
                continue
            self._busy = True
            try:
                if isinstance(tensor, Exception):
                    raise tensor
                if isinstance(tensor, _Call):
                    tensor.run(self._host_comm())
                    self._busy = False
                    fut.set_result(None)
                    continue
                self._calls += 1
                if self._fail_at_call is not None and self._calls >= self._fail_at_call:
                    raise OptiReduceError(L.INTERNAL_ERROR, "failure injected by a test")
                comm = self._host_comm()
                comm.allreduce(tensor.data_ptr(), tensor.numel(), _DTYPES[tensor.dtype], L.AVG)
                last = comm.stats()[0]
                self._record(last)
                if resync is not None:
                    self._after_bucket(comm, resync, last, tensor.device, None)
            except Exception as e:  # noqa: BLE001 - surfaced through the Future
                self._busy = False
                self._fail(e)
                fut.set_exception(e)
                continue
            self._busy = False
            fut.set_result(tensor)

    def _stop_worker(self):
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._worker = None

    # ---- replica resync (see the class's doc)
    def _resync_job(self, bucket):
        """On the autograd thread, in DDP's bucket order: what the worker does after this
        bucket's call (None: nothing)."""
        if not self._can_drift or self.resync_steps == 0:
            return None
        step = self._steps_seen
        last = bucket.is_last()
        if last:
            self._steps_seen += 1
        due = (step + 1) % self.resync_steps == 0
        return _Resync(step, last, list(bucket.parameters()) if due else None)

    def _after_bucket(self, comm, job, last_stats, device, stream):
        """After a bucket's call, in call order (the worker, or the GPU path's caller)."""
        if last_stats.elements_lost_gather:
            self._drifted_now = True
        if job.params is not None:
            if self._resync_step != job.step:
                # The step's first bucket decides for all of its buckets: any rank drifted in an
                # earlier step. This step's own losses count towards the next resync.
                self._resync_step = job.step
                flag = torch.tensor([1.0 if self._drifted else 0.0], dtype=torch.float32,
                                    device=device)
                self._exact_call(comm, flag, stream)
                self._resync_go = flag.item() > 0
                self._drifted = False
                if self._resync_go:
                    self.resyncs += 1
            if self._resync_go:
                self._average(comm, job.params, stream)
        if job.last:
            self._drifted = self._drifted or self._drifted_now
            self._drifted_now = False

    def _exact_call(self, comm, tensor, stream):
        comm.set_options(self._exact_options)
        try:
            comm.allreduce(tensor.data_ptr(), tensor.numel(), _DTYPES[tensor.dtype], L.AVG, stream)
        finally:
            comm.set_options(self._options)

    def _average(self, comm, params, stream):
        """params <- their exact average over the ranks, one call per dtype."""
        with torch.no_grad():
            by_dtype = {}
            for p in params:
                by_dtype.setdefault(p.dtype, []).append(p)
            for dtype, ps in by_dtype.items():
                if dtype not in _DTYPES:
                    raise TypeError(f"optireduce: cannot resync {dtype} parameters")
                flat = torch.cat([p.detach().reshape(-1) for p in ps])
                self._exact_call(comm, flat, stream)
                off = 0
                for p in ps:
                    n = p.numel()
                    # In place through detach(): the version counter is shared, so autograd
                    # raises rather than use a value changed under it.
                    p.detach().copy_(flat[off:off + n].view_as(p))
                    off += n

    def sync_parameters(self, params):
        """Collective, outside a backward pass: averages `params` (an iterable of tensors, e.g.
        model.parameters(), in the same order on every rank) exactly over the ranks, so that
        every replica holds the same bits. Waits for the hook's queued calls first."""
        params = list(params)
        if any(p.is_cuda for p in params):
            comm = self._gpu_comm(params[0].device)
            stream = torch.cuda.current_stream(params[0].device).cuda_stream
            self._average(comm, params, stream)
            return
        done = torch.futures.Future()
        self._start_worker()
        self._queue.put((_Call(lambda comm: self._average(comm, params, None)), done, None))
        done.wait()

    # ---- teardown
    def close(self):
        """Collective: every rank calls it after its last step. Waits for queued calls."""
        self._stop_worker()
        if self._failure is not None:
            self.abort()
            return
        if self._host is not None:
            self._host.destroy()
            self._host = None
        if self._gpu is not None:
            self._gpu.destroy()
            self._gpu = None
            self._nccl.check(self._nccl.lib.ncclCommDestroy(self._nccl_comm), "ncclCommDestroy")
            self._nccl_comm = None

    def abort(self):
        """Not collective: frees the communicators at once; peers waiting on this rank fail
        (remote error) instead of waiting. Safe to call more than once, but not while a hook's
        call is running (the state calls it itself, from its worker, when a call fails)."""
        for c in (self._host, self._gpu):
            if c is not None:
                try:
                    c.abort()
                except OptiReduceError:
                    pass
        if self._nccl_comm is not None:
            self._nccl.lib.ncclCommAbort(self._nccl_comm)
            self._nccl_comm = None

    def __repr__(self):
        return f"OptiReduceState(rank={self.rank}, size={self.size}, options={self.options})"


def allreduce_hook(state, bucket):
    """DDP communication hook: averages the bucket over the ranks with Transpose AllReduce."""
    return state.allreduce_async(bucket.buffer(), _resync=state._resync_job(bucket))


def leave(code=0, barrier=True):
    """Ends this rank's process with exit status `code`, once its work is written: after a
    barrier of the default process group (`barrier`, when one is initialized: no rank leaves
    while a peer may still be inside its last collective), at once, without
    destroy_process_group or Python's teardown.

    With torch 1.13 (Debian 12's), freeing the Gloo process group (destroy_process_group, or
    DDP's reducer at exit) joins Gloo's worker threads while holding the GIL, and a worker that
    is dropping the last reference to a tensor waits for the GIL: the rank hangs after its work
    is done (pytorch/pytorch#56297; 2 of 26 runs of tests/tta here, with and without this hook).
    Close your OptiReduceState first; pass barrier=False where the peers may be gone (after a
    failure), since a barrier would then wait for them."""
    if barrier and dist.is_available() and dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class _Resync:
    """What the worker does for the resync after a bucket's call: the step it belongs to,
    whether it is the step's last bucket, and its parameters on a resync step (else None)."""

    __slots__ = ("step", "last", "params")

    def __init__(self, step, last, params):
        self.step, self.last, self.params = step, last, params


class _Call:
    """A queued job other than a bucket (sync_parameters): runs on the worker, in order."""

    def __init__(self, run):
        self.run = run


@atexit.register
def _release_at_exit():
    # A state never closed: free its sockets and threads without waiting for peers, unless a
    # call is still running on its worker (then the process exit ends it).
    for s in list(_live_states):
        if not s._busy and (s._host is not None or s._gpu is not None):
            s.abort()
