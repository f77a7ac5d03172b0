/* liboptireduce: Transpose AllReduce with randomized Hadamard encoding, for GPU buffers (over an
 * NCCL communicator in bounded mode) and host buffers (over the optireduce transport). A plain C
 * API shaped like NCCL's: every call returns an optiResult_t, never throws, never exits. */
#ifndef OPTIREDUCE_H_
#define OPTIREDUCE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPTIREDUCE_VERSION_MAJOR 0
#define OPTIREDUCE_VERSION_MINOR 1

/* The enums below are ints in both languages. In C++ their underlying type is fixed as well, so
 * that any int a C caller passes is a value of the type, and the library can refuse a bad one
 * (without it, a value outside the enumerators' range is undefined behaviour in C++ before any
 * check can run). */
#ifdef __cplusplus
#define OPTI_ENUM_INT : int
#else
#define OPTI_ENUM_INT
#endif

/* Opaque handles. The NCCL and CUDA types are declared, not included, so that this header needs
 * neither nccl.h nor the CUDA toolkit: ncclComm_t and cudaStream_t convert implicitly. */
struct ncclComm;
struct CUstream_st;
typedef struct optiComm* optiComm_t;

typedef enum OPTI_ENUM_INT {
  optiSuccess = 0,
  optiInvalidArgument = 1, /* a null pointer, an unknown type or op, a bad option value */
  optiInvalidUsage = 2,    /* the configuration is wrong (bad OPTIREDUCE_* value, env missing) */
  optiSystemError = 3,     /* the OS or the network failed */
  optiInternalError = 4,   /* a bug of ours or a broken contract (calls out of order) */
  optiRemoteError = 5,     /* a peer misbehaved or went away */
  optiUnsupported = 6,     /* valid but not available in this build (e.g. no CUDA) */
  optiCudaError = 7,       /* a CUDA runtime call failed */
  optiNcclError = 8        /* an NCCL call failed */
} optiResult_t;

typedef enum OPTI_ENUM_INT {
  optiFloat32 = 0,
  optiFloat16 = 1,
  optiBfloat16 = 2,
  optiFloat64 = 3
} optiDataType_t;
typedef enum OPTI_ENUM_INT { optiSum = 0, optiAvg = 1 } optiRedOp_t;

/* What becomes of elements lost under the deadline (bounded mode). */
typedef enum OPTI_ENUM_INT {
  optiErasureRescale = 0, /* unbiased: phase 1 rescales per element, phase 2 estimates */
  optiErasureZero = 1     /* lost contributions count as zero (the published release's phase 1) */
} optiErasure_t;

/* What a bounded call gives an element a rank lost in phase 2 (see optiOptions_t.gatherFill). */
typedef enum OPTI_ENUM_INT {
  optiGatherFillZero = 0, /* this rank skips the element's update this step */
  optiGatherFillOwn = 1   /* its own contribution x N (unbiased, noisy) */
} optiGatherFill_t;

/* Delivery of a communicator's exchanges. */
typedef enum OPTI_ENUM_INT {
  optiExact = 0,
  optiBounded = 1,
  optiUntilStarted = 2 /* allgatherMode only: bounded until each peer's shard starts to arrive,
                          whole after */
} optiMode_t;

/* Incast values with a special meaning (any other value >= 1 is fixed). */
#define OPTI_INCAST_MAX 0   /* all N-1 senders at once */
#define OPTI_INCAST_AUTO -1 /* each receiver adapts its incast (host path) */

typedef struct {
  optiMode_t mode;         /* OPTIREDUCE_ALLREDUCE_MODE */
  int incast;              /* OPTIREDUCE_INCAST: >= 1, OPTI_INCAST_MAX or OPTI_INCAST_AUTO */
  int hadamard;            /* OPTIREDUCE_HADAMARD: encode in bounded mode (1) or not (0) */
  int64_t hadamardBlock;   /* OPTIREDUCE_HADAMARD_BLOCK: elements, a power of two >= 2 */
  optiErasure_t erasure;   /* no variable: optiErasureRescale unless set here */
  double safeguard;        /* OPTIREDUCE_SAFEGUARD: lost fraction that flags a call */
  int safeguardRedo;       /* OPTIREDUCE_SAFEGUARD_REDO: redo a flagged call exactly */
  int64_t exactBelowBytes; /* OPTIREDUCE_EXACT_BELOW: smaller buffers always go exact */
  int nonfiniteAgree;      /* OPTIREDUCE_NONFINITE_AGREE: in bounded calls, agree exactly on
                              whether some rank's input held a NaN or Inf (1) or not (0); see
                              optiStats_t.nonfiniteCalls */
  optiMode_t allgatherMode;    /* OPTIREDUCE_ALLGATHER_MODE: how a bounded call's phase 2 (the
                                 all-gather) runs. optiUntilStarted (the default): a peer's shard
                                 is cut at the deadline only if none of it has arrived by then (a
                                 straggler costs the others at most a deadline per phase), and
                                 received whole once it started, so a slow but live peer costs time
                                 rather than data and every rank keeps the same result bits (the GPU
                                 path decides it per NCCL chunk, on a second sibling communicator).
                                 optiBounded: cut at its deadline
                                 like phase 1; a rank estimates what it lost there on its own, and
                                 replicas drift apart (docs/architecture.md, "Replicas drift under
                                 loss"). optiExact: every rank gets the same result bits, and a
                                 straggler's reduced shard is waited for. Ignored by exact calls. */
  optiGatherFill_t gatherFill; /* OPTIREDUCE_GATHER_FILL: an element lost in phase 2 is 0 on
                              this rank (optiGatherFillZero, the default: it skips that element's
                              update this step) or its own contribution x N (optiGatherFillOwn:
                              unbiased, as noisy as one rank's gradient scaled by N). With
                              Hadamard, per block: Zero decodes the kept coordinates unscaled
                              (an error of at most the block's norm), Own rescales them by d/k
                              (unbiased; sqrt((d-k)/k) times the block's norm) and gives an empty
                              block own x N. With optiErasureZero it is always 0. */
} optiOptions_t;

/* Statistics, per call (the last call) and cumulative. Elements are counted on this rank.
 * GPU communicators: deadlineHits, tbUs and tcUs are always 0 there. They are the transport's,
 * and on GPU the transport is the NCCL net plugin under an NCCL communicator that the library
 * cannot name (NCCL does not expose the id it passes the plugin): read them from the plugin with
 * optireduceNetGetStats (optireduce_net.h). Every other field means the same on both paths. */
typedef struct {
  uint64_t calls;               /* allreduce calls */
  uint64_t exactCalls;          /* of which went exact (exact mode, first call, tiny, redo) */
  uint64_t elementsExpected[2]; /* elements this rank receives in phase 1 and phase 2 */
  uint64_t elementsLost[2];     /* of which were lost and estimated, per phase */
  uint64_t blocksEmpty;         /* Hadamard blocks that lost every coordinate */
  uint64_t deadlineHits;        /* receives closed by their deadline */
  uint64_t safeguardFlags;      /* calls whose lost fraction exceeded the threshold */
  uint64_t safeguardRedos;      /* calls redone exactly */
  uint32_t tbUs;                /* transport hard bound tB at the end of the call (0: none) */
  uint32_t tcUs;                /* transport adaptive estimate tC at the end of the call */
  int32_t incast;               /* incast of the last call's receives */
  int32_t reserved;
  double lostFraction; /* (lost phase 1 + 2) / (expected phase 1 + 2) */
  double timeUs;       /* wall time of the call(s) on this rank (GPU: the host's time to
                          enqueue the call, plus any wait for the safeguard's redo) */
  /* Bounded calls in which some rank's input held a NaN or an Inf, as the ranks agreed exactly
   * (options.nonfiniteAgree; 0 without it, and in exact calls, whose outputs are identical on
   * every rank anyway). The same on every rank. Such a call's output is non-finite on every
   * rank alike: with safeguardRedo, the exact result (the call is redone exactly); without,
   * every element the canonical quiet NaN (0x7FC00000 in fp32, 0x7E00 fp16, 0x7FC0 bf16,
   * 0x7FF8000000000000 fp64), as a lost NaN could otherwise leave some ranks finite. */
  uint64_t nonfiniteCalls;
} optiStats_t;

/* Fills *opts from the OPTIREDUCE_* environment (the defaults when unset). */
optiResult_t optiOptionsDefault(optiOptions_t* opts);

/* GPU path: a communicator over the ranks of `nccl`. Creates the bounded NCCL communicator
 * (ncclCommSplit with config.trafficClass = OPTIREDUCE_BOUNDED_TRAFFIC_CLASS) when mode is
 * optiBounded, and a second one (the class after it) for phase 2 when allgatherMode is
 * optiUntilStarted. Collective over the ranks of `nccl`. opts may be NULL (environment). */
optiResult_t optiCommInit(optiComm_t* comm, struct ncclComm* nccl, const optiOptions_t* opts);

/* Host path, rendezvous from the torchrun-style environment: MASTER_ADDR, MASTER_PORT, RANK,
 * WORLD_SIZE. Rank 0 serves a small TCP key-value store on MASTER_PORT from its first call until
 * the process ends; every communicator made this way shares it, several at once or one after
 * another (ranks must make them in the same order). The port must be free for it: under a
 * launcher whose own store listens there, use optiHostCommInitStore. */
optiResult_t optiHostCommInit(optiComm_t* comm, const optiOptions_t* opts);
/* Host path, rendezvous through files in `dir` (a folder every rank can write; for tests).
 * optiCommDestroy removes the communicator's files, so the folder can serve the next run; a run
 * whose ranks died leaves its files there, and the next one must start from an empty folder. */
optiResult_t optiHostCommInitFile(optiComm_t* comm, const char* dir, int rank, int nranks,
                                  const optiOptions_t* opts);

/* A key-value store of the caller's, for the host path's rendezvous (for example a PyTorch
 * c10d store, through the Python package). The struct is copied; `user` must stay valid until
 * optiCommDestroy or optiCommAbort returns. The library calls `set` and `get` only from inside
 * optiHostCommInitStore and optiCommDestroy, on the thread that called them. */
typedef struct {
  void* user;
  /* Stores `len` bytes under `key` (a NUL-terminated string). Returns 0, nonzero on failure. */
  int (*set)(void* user, const char* key, const void* value, size_t len);
  /* Waits at most timeout_ms for `key` to exist, then copies at most `cap` bytes of its value to
   * `value` and its whole length to *len (the library asks again with a larger buffer when *len
   * exceeds cap). Returns 0, 1 when the key did not appear in time, or another value on failure. */
  int (*get)(void* user, const char* key, void* value, size_t cap, size_t* len, int timeout_ms);
} optiStore_t;

/* Host path, rendezvous through the caller's key-value store. Collective over nranks. Keys are
 * under "optireduce/"; a store shared with other users of those names must be prefixed. */
optiResult_t optiHostCommInitStore(optiComm_t* comm, const optiStore_t* store, int rank, int nranks,
                                   const optiOptions_t* opts);

/* Collective. Frees the communicator; the last call of every rank must have returned. */
optiResult_t optiCommDestroy(optiComm_t comm);

/* Not collective: frees the communicator at once, without waiting for the other ranks. Its
 * connections close (host path) or its NCCL communicator is aborted (GPU path), so a peer that
 * waits on this rank in a call fails with optiRemoteError instead of waiting for it. For error
 * paths (one rank gives up, the others must not hang). No call on comm may be in progress. */
optiResult_t optiCommAbort(optiComm_t comm);

optiResult_t optiCommRank(optiComm_t comm, int* rank);
optiResult_t optiCommSize(optiComm_t comm, int* nranks);
/* Changes the options of later calls; every rank must set the same options. */
optiResult_t optiCommSetOptions(optiComm_t comm, const optiOptions_t* opts);

/* recvbuf[i] = sum (or average) over ranks of sendbuf[i], i < count. sendbuf == recvbuf is in
 * place; otherwise the buffers must not overlap. Host communicators ignore `stream` and return
 * when the result is in recvbuf; GPU communicators enqueue on `stream` (NULL: the default).
 * Calls on different streams may be in flight together (e.g. buckets overlapped on streams):
 * each has scratch of its own; like NCCL's, they run in the order they were issued, which must
 * be the same on every rank. */
optiResult_t optiAllReduce(const void* sendbuf, void* recvbuf, size_t count,
                           optiDataType_t datatype, optiRedOp_t op, optiComm_t comm,
                           struct CUstream_st* stream);

/* last: the last call (may be NULL); total: cumulative since init (may be NULL). GPU
 * communicators first wait for the last call's stream work. */
optiResult_t optiGetStats(optiComm_t comm, optiStats_t* last, optiStats_t* total);

/* A static string naming a result code. */
const char* optiGetErrorString(optiResult_t result);
/* The message of the last failed call on this thread ("" when none). */
const char* optiGetLastError(void);

#ifdef __cplusplus
}
#endif

#endif /* OPTIREDUCE_H_ */
