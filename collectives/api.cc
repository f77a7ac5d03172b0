// The C API of liboptireduce (optireduce.h): validation, one try/catch per exported function,
// the mapping of internal errors to optiResult_t, and the per-thread last error message.
#include "collectives/optireduce.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "collectives/comm.h"
#include "collectives/host_exchange.h"
#include "collectives/host_kernels.h"
#include "collectives/store.h"
#include "collectives/tar.h"
#include "transport/log.h"
#include "transport/params.h"

#define OPTI_EXPORT extern "C" __attribute__((visibility("default")))

using optireduce::Errc;
using optireduce::Status;
namespace coll = optireduce::coll;

namespace {

thread_local std::string t_last_error;

// Rendezvous waits at most this long for the other ranks to show up.
constexpr int kRendezvousTimeoutMs = 120'000;

optiResult_t fail(optiResult_t r, const std::string& msg) {
  t_last_error = msg;
  OR_WARN("optireduce: %s", msg.c_str());
  return r;
}

optiResult_t from_status(Status s) {
  switch (s.code()) {
    case Errc::kOk:
      return optiSuccess;
    case Errc::kSystem:
      return optiSystemError;
    case Errc::kInternal:
      return optiInternalError;
    case Errc::kInvalidUsage:
      return optiInvalidUsage;
    case Errc::kRemote:
      return optiRemoteError;
  }
  return optiInternalError;
}

static_assert(optireduce::kIncastMax == OPTI_INCAST_MAX && optireduce::kIncastAuto == OPTI_INCAST_AUTO,
              "OPTIREDUCE_INCAST's names mean the C API's values");

optiResult_t validate_options(const optiOptions_t& o) {
  if (o.mode != optiExact && o.mode != optiBounded)
    return fail(optiInvalidArgument, "options.mode must be optiExact or optiBounded");
  if (o.allgatherMode != optiExact && o.allgatherMode != optiBounded &&
      o.allgatherMode != optiUntilStarted)
    return fail(optiInvalidArgument,
                "options.allgatherMode must be optiExact, optiBounded or optiUntilStarted");
  if (o.gatherFill != optiGatherFillZero && o.gatherFill != optiGatherFillOwn)
    return fail(optiInvalidArgument,
                "options.gatherFill must be optiGatherFillZero or optiGatherFillOwn");
  if (o.incast < OPTI_INCAST_AUTO)
    return fail(optiInvalidArgument,
                "options.incast must be >= 1, OPTI_INCAST_MAX (0) or "
                "OPTI_INCAST_AUTO (-1), got " +
                    std::to_string(o.incast));
  if (o.hadamardBlock < 2 || (o.hadamardBlock & (o.hadamardBlock - 1)) != 0 ||
      o.hadamardBlock > (int64_t(1) << 24))
    return fail(optiInvalidArgument,
                "options.hadamardBlock must be a power of two in [2, 2^24], "
                "got " +
                    std::to_string(o.hadamardBlock));
  if (o.erasure != optiErasureRescale && o.erasure != optiErasureZero)
    return fail(optiInvalidArgument,
                "options.erasure must be optiErasureRescale or optiErasureZero");
  if (!(o.safeguard >= 0 && o.safeguard <= 1))
    return fail(optiInvalidArgument, "options.safeguard must be in [0, 1]");
  if (o.exactBelowBytes < 0)
    return fail(optiInvalidArgument, "options.exactBelowBytes must be >= 0");
  return optiSuccess;
}

coll::TarOptions to_tar(const optiOptions_t& o) {
  coll::TarOptions t;
  t.mode = o.mode == optiBounded ? coll::Mode::kBounded : coll::Mode::kExact;
  t.allgather = o.allgatherMode == optiBounded        ? coll::Mode::kBounded
                : o.allgatherMode == optiUntilStarted ? coll::Mode::kUntilStarted
                                                      : coll::Mode::kExact;
  t.gather_fill_own = o.gatherFill == optiGatherFillOwn;
  t.incast = o.incast;
  t.hadamard = o.hadamard != 0;
  t.hadamard_block = uint64_t(o.hadamardBlock);
  t.erasure = o.erasure == optiErasureZero ? coll::Erasure::kZero : coll::Erasure::kRescale;
  t.safeguard = o.safeguard;
  t.safeguard_redo = o.safeguardRedo != 0;
  t.exact_below_bytes = uint64_t(o.exactBelowBytes);
  t.nonfinite_agree = o.nonfiniteAgree != 0;
  return t;
}

optiResult_t resolve_options(const optiOptions_t* given, optiOptions_t* out) {
  if (given != nullptr) {
    *out = *given;
  } else if (optiResult_t r = optiOptionsDefault(out); r != optiSuccess) {
    return r;
  }
  return validate_options(*out);
}

// Per-process count of host communicators created: ranks create them in the same order, so
// it names a communicator's keys in a store shared by several.
std::atomic<uint64_t> g_comm_serial{0};

optiResult_t host_init(optiComm_t* out, std::unique_ptr<coll::Store> store, int rank, int nranks,
                       const optiOptions_t* opts) {
  auto c = std::make_unique<optiComm>();
  if (optiResult_t r = resolve_options(opts, &c->options); r != optiSuccess) return r;
  c->rank = rank;
  c->nranks = nranks;
  const std::string prefix = "optireduce/" + std::to_string(g_comm_serial++);
  // Rank 0 draws the seed of every D; the others read it: no per-call communication.
  std::string seed;
  if (rank == 0) {
    std::random_device rd;
    const uint64_t s = (uint64_t(rd()) << 32) ^ rd();
    seed = std::to_string(s);
    if (Status st = store->set(prefix + "/seed", seed); !st)
      return fail(from_status(st), store->error());
  } else if (Status st = store->get(prefix + "/seed", &seed, kRendezvousTimeoutMs); !st) {
    return fail(from_status(st), store->error());
  }
  c->seed = std::strtoull(seed.c_str(), nullptr, 10);
  std::unique_ptr<coll::HostExchange> ex;
  std::string err;
  if (nranks > 1) {
    if (Status st = coll::HostExchange::create(store.get(), prefix, rank, nranks,
                                               kRendezvousTimeoutMs, &ex, &err);
        !st)
      return fail(from_status(st), "optiHostCommInit: " + err);
    c->exchange = std::move(ex);
  } else {
    c->exchange = std::make_unique<coll::SoloExchange>();
  }
  c->prefix = prefix;
  c->store = std::move(store);
  c->kernels = std::make_unique<coll::HostKernels>();
  c->tar = std::make_unique<coll::Tar>(c->exchange.get(), c->kernels.get(), c->seed);
  *out = c.release();
  return optiSuccess;
}

optiResult_t check_comm(optiComm_t comm) {
  if (comm == nullptr) return fail(optiInvalidArgument, "comm is NULL");
  if (comm->failed != optiSuccess)
    return fail(comm->failed, "the communicator failed earlier: " + comm->failed_msg);
  return optiSuccess;
}

void add_stats(optiStats_t* total, const optiStats_t& c) {
  total->calls += c.calls;
  total->exactCalls += c.exactCalls;
  for (int p = 0; p < 2; ++p) {
    total->elementsExpected[p] += c.elementsExpected[p];
    total->elementsLost[p] += c.elementsLost[p];
  }
  total->blocksEmpty += c.blocksEmpty;
  total->deadlineHits += c.deadlineHits;
  total->safeguardFlags += c.safeguardFlags;
  total->safeguardRedos += c.safeguardRedos;
  total->nonfiniteCalls += c.nonfiniteCalls;
  total->tbUs = c.tbUs;
  total->tcUs = c.tcUs;
  total->incast = c.incast;
  const uint64_t e = total->elementsExpected[0] + total->elementsExpected[1];
  const uint64_t l = total->elementsLost[0] + total->elementsLost[1];
  total->lostFraction = e ? double(l) / double(e) : 0.0;
  total->timeUs += c.timeUs;
}

}  // namespace

OPTI_EXPORT const char* optiGetErrorString(optiResult_t r) {
  switch (r) {
    case optiSuccess:
      return "success";
    case optiInvalidArgument:
      return "invalid argument";
    case optiInvalidUsage:
      return "invalid usage (configuration)";
    case optiSystemError:
      return "system error (OS or network)";
    case optiInternalError:
      return "internal error";
    case optiRemoteError:
      return "remote error (a peer failed or went away)";
    case optiUnsupported:
      return "unsupported in this build";
    case optiCudaError:
      return "CUDA error";
    case optiNcclError:
      return "NCCL error";
  }
  return "unknown result code";
}

OPTI_EXPORT const char* optiGetLastError(void) {
  return t_last_error.c_str();
}

OPTI_EXPORT optiResult_t optiOptionsDefault(optiOptions_t* opts) {
  if (opts == nullptr) return fail(optiInvalidArgument, "optiOptionsDefault: opts is NULL");
  try {
    std::string err;
    if (Status s = optireduce::global_config_status(&err); !s)
      return fail(optiInvalidUsage, "environment: " + err);
    const optireduce::Config& cfg = optireduce::global_config();
    optiOptions_t o{};
    o.mode = cfg.allreduce_mode == optireduce::ModeChoice::kBounded ? optiBounded : optiExact;
    switch (cfg.allgather_mode) {
      case optireduce::GatherModeChoice::kExact:
        o.allgatherMode = optiExact;
        break;
      case optireduce::GatherModeChoice::kBounded:
        o.allgatherMode = optiBounded;
        break;
      case optireduce::GatherModeChoice::kStarted:
        o.allgatherMode = optiUntilStarted;
        break;
    }
    o.gatherFill = cfg.gather_fill == optireduce::GatherFillChoice::kOwn ? optiGatherFillOwn
                                                                         : optiGatherFillZero;
    o.incast = static_cast<int>(cfg.incast);  // the table's rule: max, auto or 1 .. 2^20
    o.hadamard = cfg.hadamard ? 1 : 0;
    o.hadamardBlock = cfg.hadamard_block;
    if (o.hadamardBlock < 2 || (o.hadamardBlock & (o.hadamardBlock - 1)) != 0)
      return fail(optiInvalidUsage, "OPTIREDUCE_HADAMARD_BLOCK=" + std::to_string(o.hadamardBlock) +
                                        ": must be a power of two");
    o.erasure = optiErasureRescale;
    o.safeguard = cfg.safeguard;
    o.safeguardRedo = cfg.safeguard_redo ? 1 : 0;
    o.exactBelowBytes = cfg.exact_below_bytes;
    o.nonfiniteAgree = cfg.nonfinite_agree ? 1 : 0;
    *opts = o;
    return optiSuccess;
  } catch (const std::exception& e) {
    return fail(optiInternalError, std::string("optiOptionsDefault: ") + e.what());
  }
}

OPTI_EXPORT optiResult_t optiHostCommInitFile(optiComm_t* comm, const char* dir, int rank,
                                              int nranks, const optiOptions_t* opts) {
  if (comm == nullptr || dir == nullptr)
    return fail(optiInvalidArgument, "optiHostCommInitFile: comm and dir must not be NULL");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(optiInvalidArgument, "optiHostCommInitFile: need 0 <= rank < nranks, got rank " +
                                         std::to_string(rank) + " of " + std::to_string(nranks));
  try {
    return host_init(comm, std::make_unique<coll::FileStore>(dir), rank, nranks, opts);
  } catch (const std::exception& e) {
    return fail(optiInternalError, std::string("optiHostCommInitFile: ") + e.what());
  }
}

OPTI_EXPORT optiResult_t optiHostCommInitStore(optiComm_t* comm, const optiStore_t* store, int rank,
                                               int nranks, const optiOptions_t* opts) {
  if (comm == nullptr || store == nullptr)
    return fail(optiInvalidArgument, "optiHostCommInitStore: comm and store must not be NULL");
  *comm = nullptr;
  if (store->set == nullptr || store->get == nullptr)
    return fail(optiInvalidArgument,
                "optiHostCommInitStore: store->set and store->get must be set");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(optiInvalidArgument, "optiHostCommInitStore: need 0 <= rank < nranks, got rank " +
                                         std::to_string(rank) + " of " + std::to_string(nranks));
  try {
    return host_init(comm, std::make_unique<coll::CallbackStore>(*store), rank, nranks, opts);
  } catch (const std::exception& e) {
    return fail(optiInternalError, std::string("optiHostCommInitStore: ") + e.what());
  }
}

OPTI_EXPORT optiResult_t optiHostCommInit(optiComm_t* comm, const optiOptions_t* opts) {
  if (comm == nullptr) return fail(optiInvalidArgument, "optiHostCommInit: comm is NULL");
  *comm = nullptr;
  // torchrun's variables: the only getenv outside the parameter table, because they are not
  // ours (they belong to the launcher).
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  const char* rank = std::getenv("RANK");
  const char* size = std::getenv("WORLD_SIZE");
  if (!addr || !port || !rank || !size)
    return fail(optiInvalidUsage,
                "optiHostCommInit: set MASTER_ADDR, MASTER_PORT, RANK and "
                "WORLD_SIZE (as torchrun does)");
  char* e1 = nullptr;
  char* e2 = nullptr;
  char* e3 = nullptr;
  const long p = std::strtol(port, &e1, 10), r = std::strtol(rank, &e2, 10),
             n = std::strtol(size, &e3, 10);
  if (*e1 || *e2 || *e3 || p < 1 || p > 65535 || n < 1 || r < 0 || r >= n)
    return fail(optiInvalidUsage, std::string("optiHostCommInit: bad MASTER_PORT='") + port +
                                      "', RANK='" + rank + "' or WORLD_SIZE='" + size + "'");
  try {
    std::unique_ptr<coll::TcpStore> store;
    std::string err;
    if (Status s = coll::TcpStore::open(addr, int(p), r == 0, kRendezvousTimeoutMs, &store, &err);
        !s)
      return fail(from_status(s), "optiHostCommInit: " + err);
    return host_init(comm, std::move(store), int(r), int(n), opts);
  } catch (const std::exception& e) {
    return fail(optiInternalError, std::string("optiHostCommInit: ") + e.what());
  }
}

OPTI_EXPORT optiResult_t optiCommInit(optiComm_t* comm, struct ncclComm* nccl,
                                      const optiOptions_t* opts) {
  if (comm == nullptr || nccl == nullptr)
    return fail(optiInvalidArgument, "optiCommInit: comm and nccl must not be NULL");
  *comm = nullptr;
  try {
    auto c = std::make_unique<optiComm>();
    if (optiResult_t r = resolve_options(opts, &c->options); r != optiSuccess) return r;
    c->gpu = true;
    if (optiResult_t r = coll::gpu_init(c.get(), nccl, c->options); r != optiSuccess) return r;
    *comm = c.release();
    return optiSuccess;
  } catch (const std::exception& e) {
    return fail(optiInternalError, std::string("optiCommInit: ") + e.what());
  }
}

OPTI_EXPORT optiResult_t optiCommDestroy(optiComm_t comm) {
  if (comm == nullptr) return fail(optiInvalidArgument, "optiCommDestroy: comm is NULL");
  optiResult_t result = optiSuccess;
  try {
    if (comm->gpu) {
      result = coll::gpu_destroy(comm, /*abort=*/false);
    } else if (comm->store && comm->nranks > 1 && comm->failed == optiSuccess) {
      // Nobody tears down connections a peer may still be finishing with; rank 0 leaves last,
      // once everyone has passed the first barrier, and then forgets the communicator's keys.
      Status s = coll::store_barrier(comm->store.get(), comm->prefix + "/exit", comm->rank,
                                     comm->nranks, kRendezvousTimeoutMs);
      if (s && comm->rank != 0)
        s = comm->store->set(comm->prefix + "/left/" + std::to_string(comm->rank), "1");
      if (s && comm->rank == 0) {
        std::string v;
        for (int r = 1; r < comm->nranks && s; ++r)
          s = comm->store->get(comm->prefix + "/left/" + std::to_string(r), &v,
                               kRendezvousTimeoutMs);
        // Every rank is done with the store for this communicator.
        if (s) comm->store->erase_prefix(comm->prefix + "/");
      }
      if (!s) result = fail(from_status(s), "optiCommDestroy: " + comm->store->error());
    } else if (comm->store && comm->nranks == 1) {
      comm->store->erase_prefix(comm->prefix + "/");
    }
    delete comm;
  } catch (const std::exception& e) {
    return fail(optiInternalError, std::string("optiCommDestroy: ") + e.what());
  }
  return result;
}

OPTI_EXPORT optiResult_t optiCommAbort(optiComm_t comm) {
  if (comm == nullptr) return fail(optiInvalidArgument, "optiCommAbort: comm is NULL");
  optiResult_t result = optiSuccess;
  try {
    // No barrier and no store: the host exchange's destructor closes every connection, which
    // tells each peer (a peer blocked on this rank fails at once instead of waiting).
    if (comm->gpu) result = coll::gpu_destroy(comm, /*abort=*/true);
    delete comm;
  } catch (const std::exception& e) {
    return fail(optiInternalError, std::string("optiCommAbort: ") + e.what());
  }
  return result;
}

OPTI_EXPORT optiResult_t optiCommRank(optiComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr)
    return fail(optiInvalidArgument, "optiCommRank: comm and rank must not be NULL");
  *rank = comm->rank;
  return optiSuccess;
}

OPTI_EXPORT optiResult_t optiCommSize(optiComm_t comm, int* nranks) {
  if (comm == nullptr || nranks == nullptr)
    return fail(optiInvalidArgument, "optiCommSize: comm and nranks must not be NULL");
  *nranks = comm->nranks;
  return optiSuccess;
}

OPTI_EXPORT optiResult_t optiCommSetOptions(optiComm_t comm, const optiOptions_t* opts) {
  if (comm == nullptr || opts == nullptr)
    return fail(optiInvalidArgument, "optiCommSetOptions: comm and opts must not be NULL");
  if (optiResult_t r = validate_options(*opts); r != optiSuccess) return r;
  std::lock_guard<std::mutex> lk(comm->mu);
  comm->options = *opts;
  return optiSuccess;
}

OPTI_EXPORT optiResult_t optiAllReduce(const void* sendbuf, void* recvbuf, size_t count,
                                       optiDataType_t datatype, optiRedOp_t op, optiComm_t comm,
                                       struct CUstream_st* stream) {
  if (optiResult_t r = check_comm(comm); r != optiSuccess) return r;
  if (count > 0 && (sendbuf == nullptr || recvbuf == nullptr))
    return fail(optiInvalidArgument, "optiAllReduce: sendbuf and recvbuf must not be NULL");
  coll::DType t;
  switch (datatype) {
    case optiFloat32:
      t = coll::DType::kF32;
      break;
    case optiFloat16:
      t = coll::DType::kF16;
      break;
    case optiBfloat16:
      t = coll::DType::kBF16;
      break;
    case optiFloat64:
      t = coll::DType::kF64;
      break;
    default:
      return fail(optiInvalidArgument,
                  "optiAllReduce: unsupported datatype " + std::to_string(int(datatype)) +
                      " (optiFloat32, optiFloat16, optiBfloat16, optiFloat64)");
  }
  if (op != optiSum && op != optiAvg)
    return fail(optiInvalidArgument,
                "optiAllReduce: unsupported op " + std::to_string(int(op)) + " (optiSum, optiAvg)");
  const size_t bytes = count * coll::dtype_size(t);
  if (count > SIZE_MAX / 8 ||
      (sendbuf != recvbuf && count > 0 &&
       static_cast<const char*>(sendbuf) < static_cast<char*>(recvbuf) + bytes &&
       static_cast<char*>(recvbuf) < static_cast<const char*>(sendbuf) + bytes))
    return fail(optiInvalidArgument,
                "optiAllReduce: sendbuf and recvbuf overlap without being equal");
  try {
    std::lock_guard<std::mutex> lk(comm->mu);
    if (comm->gpu)
      return coll::gpu_allreduce(comm, sendbuf, recvbuf, count, t,
                                 op == optiSum ? coll::RedOp::kSum : coll::RedOp::kAvg, stream);
    std::string err;
    optiStats_t st{};
    Status s = comm->tar->allreduce(sendbuf, recvbuf, count, t,
                                    op == optiSum ? coll::RedOp::kSum : coll::RedOp::kAvg,
                                    to_tar(comm->options), &st, &err);
    if (!s) {
      // A failed exchange leaves the ranks out of step: the communicator is done.
      comm->failed = from_status(s);
      comm->failed_msg = err;
      return fail(comm->failed, "optiAllReduce: " + err);
    }
    comm->last = st;
    add_stats(&comm->total, st);
    return optiSuccess;
  } catch (const std::bad_alloc&) {
    return fail(optiSystemError, "optiAllReduce: out of memory for scratch buffers");
  } catch (const std::exception& e) {
    return fail(optiInternalError, std::string("optiAllReduce: ") + e.what());
  }
}

OPTI_EXPORT optiResult_t optiGetStats(optiComm_t comm, optiStats_t* last, optiStats_t* total) {
  if (comm == nullptr) return fail(optiInvalidArgument, "optiGetStats: comm is NULL");
  try {
    std::lock_guard<std::mutex> lk(comm->mu);
    if (comm->gpu) {
      if (optiResult_t r = coll::gpu_collect_stats(comm); r != optiSuccess) return r;
    }
    if (last) *last = comm->last;
    if (total) *total = comm->total;
    return optiSuccess;
  } catch (const std::exception& e) {
    return fail(optiInternalError, std::string("optiGetStats: ") + e.what());
  }
}

namespace optireduce::coll {
// Called by the GPU part to report a failure with the same conventions.
optiResult_t api_fail(optiResult_t r, const std::string& msg) {
  return fail(r, msg);
}
optiResult_t api_resolve_options(const optiOptions_t* given, optiOptions_t* out) {
  return resolve_options(given, out);
}
TarOptions api_tar_options(const optiOptions_t& o) {
  return to_tar(o);
}
void api_add_stats(optiStats_t* total, const optiStats_t& c) {
  add_stats(total, c);
}
}  // namespace optireduce::coll
