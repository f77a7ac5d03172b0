// The GPU path of liboptireduce: Kernels on device memory (launchers of kernels.cu on the
// caller's stream) and an Exchange of grouped ncclSend/ncclRecv on NCCL communicators, the
// bounded ones split off the user's with config.trafficClass = OPTIREDUCE_BOUNDED_TRAFFIC_CLASS
// (the plugin runs that communicator bounded, filling holes with the erasure marker) and, for a
// phase 2 bounded until each sender starts, the class after it. The phase's delivery must ride
// on the communicator: NCCL's grouped calls carry nothing else from here to the plugin.
// Everything is stream-ordered: optiAllReduce returns once the work is enqueued; statistics
// are read back when asked for (optiGetStats), unless the safeguard must redo, which waits.
#include <cuda_runtime.h>
#include <nccl.h>

#include <strings.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collectives/comm.h"
#include "collectives/shard_plan.h"
#include "cuda/launch.h"
#include "plugin/optireduce_net.h"
#include "transport/params.h"

namespace optireduce::coll {

namespace {

ncclDataType_t nccl_bytes() {
  return ncclUint8;
}

// Everything one call writes on the device besides its output: the schedule's scratch regions,
// the loss counters (and their snapshot for the safeguard), and the pinned memory they are read
// back into. Calls on different streams may be in flight together (DDP overlaps buckets), so
// each call takes a set of its own from a pool; a set is reused by a later call only once its
// previous call's work is ordered before it (same stream, or its `idle` event has fired, or the
// new stream waits for that event).
struct CallScratch {
  struct Region {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  Region regions[8];
  unsigned long long* counters = nullptr;
  unsigned long long* base = nullptr;  // counters at the last take_counters, on the device
  unsigned long long* host_counters = nullptr;
  // The device's `base` as the last take_counters found it: host_counters - host_before is what
  // the set's last call counted, which is what optiGetStats' `last` must show.
  unsigned long long* host_before = nullptr;
  void* host_flags = nullptr;  // pinned: read_back's landing place
  size_t host_flags_bytes = 0;
  cudaEvent_t done = nullptr;     // after the last snapshot of the counters
  cudaEvent_t idle = nullptr;     // after the last call's last work
  cuda::Stream stream = nullptr;  // of the last call
  uint64_t last_use = 0;          // call number of the last call (least recently used first)
  uint64_t seen[kNumCounters] = {};
  bool pending = false;  // a snapshot not collected yet

  ~CallScratch() {
    for (auto& r : regions)
      if (r.ptr) cudaFree(r.ptr);
    if (counters) cudaFree(counters);
    if (base) cudaFree(base);
    if (host_counters) cudaFreeHost(host_counters);
    if (host_before) cudaFreeHost(host_before);
    if (host_flags) cudaFreeHost(host_flags);
    if (done) cudaEventDestroy(done);
    if (idle) cudaEventDestroy(idle);
  }
  bool init() {
    const size_t bytes = sizeof(unsigned long long) * kNumCounters;
    if (cudaMalloc(&counters, bytes) != cudaSuccess || cudaMalloc(&base, bytes) != cudaSuccess ||
        cudaMallocHost(&host_counters, bytes) != cudaSuccess ||
        cudaMallocHost(&host_before, bytes) != cudaSuccess ||
        cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&idle, cudaEventDisableTiming) != cudaSuccess)
      return false;
    return cudaMemset(counters, 0, bytes) == cudaSuccess &&
           cudaMemset(base, 0, bytes) == cudaSuccess;
  }
};

class CudaKernels final : public Kernels {
 public:
  // Sets beyond this many are not made: a further stream waits for the least recently used
  // set's last call instead (its scratch can be as large as the largest bucket).
  static constexpr size_t kMaxSets = 8;

  Status init() {
    auto first = std::make_unique<CallScratch>();
    if (!first->init()) return Status(Errc::kSystem);
    pool_.push_back(std::move(first));
    cur_ = pool_.front().get();
    return Status::ok();
  }
  // Picks the scratch set of a call on stream s, ordered after that set's previous call.
  Status begin_call(cuda::Stream s) {
    stream_ = s;
    CallScratch* pick = nullptr;
    // The same stream orders its calls by itself; a set whose last call is over is free.
    for (auto& c : pool_)
      if (c->stream == s) pick = c.get();
    if (pick == nullptr)
      for (auto& c : pool_)
        if (cudaEventQuery(c->idle) == cudaSuccess) {
          pick = c.get();
          break;
        }
    if (pick == nullptr && pool_.size() < kMaxSets) {
      auto c = std::make_unique<CallScratch>();
      if (!c->init()) return Status(Errc::kSystem);
      pool_.push_back(std::move(c));
      pick = pool_.back().get();
    }
    if (pick == nullptr) {
      pick = pool_.front().get();
      for (auto& c : pool_)
        if (c->last_use < pick->last_use) pick = c.get();
      note(int(cudaStreamWaitEvent(s, pick->idle, 0)));
    }
    pick->stream = s;
    pick->last_use = ++calls_;
    cur_ = pick;
    took_ = false;
    return Status::ok();
  }
  // Marks the end of the call's work: its set may be taken by another stream after this.
  void end_call() { note(int(cudaEventRecord(cur_->idle, stream_))); }
  // When true, take_counters waits for the stream (the safeguard needs the counts now).
  void set_sync(bool sync) { sync_ = sync; }

  void* scratch(int slot, size_t bytes) override { return region(slot, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst != src && bytes > 0)
      note(int(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_)));
  }
  void encode(DType t, const void* in, void* out, const HadamardGeometry& g,
              uint64_t seed) override {
    void* w = region(kWork, cuda::hadamard_work_bytes(g, t));
    note(cuda::encode(t, in, out, g, seed, w, stream_));
  }
  void decode(DType t, const void* in, void* out, const HadamardGeometry& g, uint64_t seed,
              double scale, const void* fallback, double fallback_scale, Erasure policy) override {
    void* w = region(kWork, cuda::hadamard_work_bytes(g, t));
    note(cuda::decode(t, in, out, g, seed, scale, fallback, fallback_scale, policy, w,
                      cur_->counters, stream_));
  }
  void reduce(DType t, const void* const* srcs, const uint8_t* lossy, int nranks, void* out,
              size_t n, RedOp op, Erasure policy) override {
    void* w = region(kWork, cuda::reduce_work_bytes(n, nranks) + 256);
    note(cuda::reduce(t, srcs, lossy, nranks, out, n, op, policy, w, cur_->counters, stream_));
  }
  void fill_lost(DType t, void* dst, const void* received, const void* own, size_t n,
                 double own_scale, Erasure policy) override {
    note(cuda::fill_lost(t, dst, received, own, n, own_scale, policy, cur_->counters, stream_));
  }
  void flag_nonfinite(DType t, const void* data, size_t n, void* flag) override {
    if (n > 0) note(cuda::count_nonfinite(t, data, n, cur_->counters, stream_));
    note(cuda::nonfinite_flag(cur_->counters, cur_->base, static_cast<uint8_t*>(flag), stream_));
  }
  void flag_lost(double threshold, uint64_t expected, void* flag) override {
    note(cuda::safeguard_flag(cur_->counters, cur_->base, threshold, expected,
                              static_cast<uint8_t*>(flag), stream_));
  }
  void nonfinite_verdict(DType t, void* out, size_t n, const void* flags, int nranks) override {
    note(cuda::nonfinite_verdict(t, out, n, static_cast<const uint8_t*>(flags), nranks,
                                 cur_->counters, stream_));
  }
  void read_back(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    CallScratch& c = *cur_;
    if (c.host_flags_bytes < bytes) {
      if (c.host_flags) cudaFreeHost(c.host_flags);
      c.host_flags = nullptr;
      c.host_flags_bytes = 0;
      if (cudaMallocHost(&c.host_flags, bytes) != cudaSuccess) throw std::bad_alloc();
      c.host_flags_bytes = bytes;
    }
    note(int(cudaMemcpyAsync(c.host_flags, src, bytes, cudaMemcpyDeviceToHost, stream_)));
    note(int(cudaStreamSynchronize(stream_)));
    std::memcpy(host_dst, c.host_flags, bytes);
  }
  void take_counters(uint64_t* out) override {
    // The device counters only grow; a snapshot of them follows the call's work into pinned
    // memory, and collect() turns snapshots into increments. Nothing waits unless sync_. The
    // device keeps its own snapshot (base) for flag_lost's "since the last take": per set, so
    // another stream's call in flight never counts against this one.
    CallScratch& c = *cur_;
    const size_t bytes = sizeof(unsigned long long) * kNumCounters;
    note(int(cudaMemcpyAsync(c.host_before, c.base, bytes, cudaMemcpyDeviceToHost, stream_)));
    note(int(cudaMemcpyAsync(c.base, c.counters, bytes, cudaMemcpyDeviceToDevice, stream_)));
    note(int(cudaMemcpyAsync(c.host_counters, c.counters, bytes, cudaMemcpyDeviceToHost, stream_)));
    note(int(cudaEventRecord(c.done, stream_)));
    c.pending = true;
    took_ = true;
    // Only this call's set: the counts go to this call's statistics.
    if (sync_) collect_set(c, out);
  }
  // Waits for the latest snapshots and adds what was counted since the previous ones to out.
  void collect(uint64_t* out) {
    for (auto& c : pool_) collect_set(*c, out);
  }
  // Whether the call being enqueued (the latest) took a snapshot of its counters.
  bool took() const { return took_; }
  // What the latest call counted, out[kNumCounters] (overwritten). Only after collect(), and
  // only when that call took exactly one snapshot (async: without the safeguard's redo).
  void latest_call(uint64_t* out) const {
    for (int i = 0; i < kNumCounters; ++i) out[i] = cur_->host_counters[i] - cur_->host_before[i];
  }
  int error() const { return error_; }

 private:
  static constexpr int kWork = 7;  // beyond the schedule's slots

  void collect_set(CallScratch& c, uint64_t* out) {
    if (!c.pending) return;
    note(int(cudaEventSynchronize(c.done)));
    for (int i = 0; i < kNumCounters; ++i) {
      out[i] += c.host_counters[i] - c.seen[i];
      c.seen[i] = c.host_counters[i];
    }
    c.pending = false;
  }
  void* region(int slot, size_t bytes) {
    CallScratch::Region& r = cur_->regions[size_t(slot)];
    if (r.bytes < bytes) {
      // Growing synchronises (cudaFree/cudaMalloc); it happens only when a bucket grows.
      if (r.ptr) cudaFree(r.ptr);
      r.ptr = nullptr;
      r.bytes = 0;
      if (cudaMalloc(&r.ptr, bytes) != cudaSuccess) throw std::bad_alloc();
      r.bytes = bytes;
    }
    return r.ptr;
  }
  void note(int err) {
    if (err != 0 && error_ == 0) error_ = err;
  }

  std::vector<std::unique_ptr<CallScratch>> pool_;
  CallScratch* cur_ = nullptr;  // the set of the call being enqueued
  cuda::Stream stream_ = nullptr;
  uint64_t calls_ = 0;
  bool took_ = false;
  bool sync_ = false;
  int error_ = 0;
};

// Grouped point-to-point calls: one NCCL group per incast round. NCCL has no receiver-paced
// rounds (a group's sends and receives are matched as a whole), but groups on one stream run one
// after the other, so a round per group bounds every receiver to the fixed incast it reports;
// every rank uses the same incast (set_incast), so round q's sends meet round q's receives.
// With the default incast (all N-1 at once) a phase is one group.
class NcclExchange final : public Exchange {
 public:
  NcclExchange(ncclComm_t exact, ncclComm_t bounded, ncclComm_t until_started, int rank, int n)
      : exact_(exact), bounded_(bounded), until_started_(until_started), rank_(rank), n_(n) {}
  int rank() const override { return rank_; }
  int size() const override { return n_; }
  bool receiver_paced() const override { return false; }
  void set_stream(cudaStream_t s) { stream_ = s; }
  // The incast of the next call's phases, as the schedule clamps it (shard_plan.h).
  void set_incast(int incast) { incast_ = clamp_incast(incast, n_); }

  Status begin_phase(Mode mode, int, std::span<RecvOp> recvs,
                     std::span<const uint32_t> round_end) override {
    mode_ = mode;
    recvs_ = recvs;
    round_end_ = round_end;
    sends_.clear();
    return Status::ok();
  }
  // Queued for end_phase's groups, where NCCL runs them; several calls add up.
  Status post_sends(std::span<const SendOp> sends) override {
    sends_.insert(sends_.end(), sends.begin(), sends.end());
    return Status::ok();
  }
  Status end_phase() override {
    const RoundPlan rp{n_, incast_};
    // One round (the safeguard's agreement among them) is one group whatever the incast.
    const int rounds = round_end_.size() <= 1 ? 1 : int(round_end_.size());
    if (rounds > 1 && rounds != rp.rounds()) {
      error_ = "the schedule's rounds do not follow the incast set on the exchange";
      return Status(Errc::kInternal);
    }
    ncclResult_t r = ncclSuccess;
    for (int q = 0; q < rounds && r == ncclSuccess; ++q) {
      const size_t lo = q == 0 ? 0 : round_end_[size_t(q - 1)];
      const size_t hi = rounds == 1 ? recvs_.size() : round_end_[size_t(q)];
      r = run_group(rounds == 1 ? 1 : rp.first_distance(q),
                    rounds == 1 ? n_ - 1 : rp.last_distance(q), recvs_.subspan(lo, hi - lo));
    }
    if (r != ncclSuccess) {
      error_ = std::string("NCCL: ") + ncclGetErrorString(r);
      return Status(Errc::kSystem);
    }
    return Status::ok();
  }

 private:
  // One group: these receives, and the sends to the peers at distance first_d..last_d.
  ncclResult_t run_group(int first_d, int last_d, std::span<RecvOp> recvs) {
    ncclComm_t c = comm_for(mode_);
    ncclResult_t r = ncclGroupStart();
    for (RecvOp& op : recvs) {
      if (r == ncclSuccess) r = ncclRecv(op.data, op.bytes, nccl_bytes(), op.peer, c, stream_);
      // What arrived is known only on the device: bounded receives are scanned for the marker
      // there, so report them as possibly lossy.
      op.lost_bytes = lossy(mode_) ? op.bytes : 0;
      op.deadline_hit = false;
      op.done = true;  // in stream order, as everything the schedule does with it
      op.arrived = op.bytes;
    }
    for (const SendOp& op : sends_) {
      const int d = (op.peer - rank_ + n_) % n_;
      if (r == ncclSuccess && d >= first_d && d <= last_d)
        r = ncclSend(op.data, op.bytes, nccl_bytes(), op.peer, c, stream_);
    }
    const ncclResult_t e = ncclGroupEnd();
    return r == ncclSuccess ? e : r;
  }

  // The communicator whose traffic class gives the plugin the phase's delivery. kUntilStarted
  // without its sibling (the options changed to it after optiCommInit) runs bounded: exact would
  // make a straggler cost the others all of its lateness.
  ncclComm_t comm_for(Mode m) const {
    if (!lossy(m) || bounded_ == nullptr) return exact_;
    return m == Mode::kUntilStarted && until_started_ != nullptr ? until_started_ : bounded_;
  }

  ncclComm_t exact_;
  ncclComm_t bounded_;
  ncclComm_t until_started_;
  int rank_;
  int n_;
  int incast_ = 1;
  Mode mode_ = Mode::kExact;
  cudaStream_t stream_ = nullptr;
  std::span<RecvOp> recvs_;
  std::span<const uint32_t> round_end_;
  std::vector<SendOp> sends_;
};

}  // namespace

struct GpuState {
  ncclComm_t user = nullptr;
  ncclComm_t bounded = nullptr;        // ours: destroyed with the communicator
  ncclComm_t until_started = nullptr;  // ours, phase 2's when it runs until started
  std::unique_ptr<NcclExchange> ex;
  std::unique_ptr<CudaKernels> k;
  uint64_t pending_calls = 0;  // calls whose counters are still on the device
  // The last call's counters are still on the device: `last` gets them at collection.
  bool last_pending = false;

  // Ends the siblings (ours; the user's communicator is theirs): destroyed, or aborted when
  // the peers may be gone or stuck (optiCommAbort, a failed optiCommInit).
  void close_siblings(bool abort) {
    for (ncclComm_t* c : {&bounded, &until_started}) {
      if (*c == nullptr) continue;
      if (abort) {
        ncclCommAbort(*c);
      } else {
        ncclCommDestroy(*c);
      }
      *c = nullptr;
    }
  }
};

namespace {

// The plugin's network name, which the sibling asks NCCL for.
constexpr const char* kPluginNetName = OPTIREDUCE_NET_NAME;
// The first NCCL with ncclConfig_t.trafficClass, the plugin's only way to tell the sibling from
// the application's communicators (docs/architecture.md, "Which network an NCCL communicator
// uses").
constexpr int kFirstNcclWithTrafficClass = 22600;

// Why this process's set-up cannot keep the application's communicators exact while the
// library's sibling runs bounded ("" if it can).
std::string setup_error(const optiOptions_t& opts) {
  if (global_config().mode == optireduce::ModeChoice::kBounded)
    return "OPTIREDUCE_MODE=bounded makes the plugin run every NCCL communicator of this "
           "process bounded, the application's own and liboptireduce's exact steps included; "
           "unset it: liboptireduce's bounded steps run on a communicator of their own (choose "
           "them with OPTIREDUCE_ALLREDUCE_MODE=bounded or optiOptions_t.mode)";
  if (opts.mode != optiBounded) return "";
  if (const char* net = std::getenv("NCCL_NET");
      net != nullptr && strcasecmp(net, kPluginNetName) != 0)
    return std::string("NCCL_NET=") + net +
           " overrides every communicator's network, "
           "liboptireduce's bounded one included, which would then not run over OptiReduce; "
           "unset NCCL_NET and create your own communicators with ncclConfig_t.netName = \"" +
           net + "\" instead";
  int version = 0;
  if (ncclGetVersion(&version) == ncclSuccess && version < kFirstNcclWithTrafficClass)
    return "NCCL " + std::to_string(version) +
           " has no ncclConfig_t.trafficClass (2.26 and "
           "newer), so the plugin cannot run only liboptireduce's communicator bounded: use "
           "exact mode, or NCCL 2.26 or newer";
  return "";
}

}  // namespace

optiResult_t gpu_init(optiComm* comm, struct ncclComm* nccl, const optiOptions_t& opts) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    return api_fail(optiCudaError, "optiCommInit: no CUDA device");
  auto st = std::make_unique<GpuState>();
  st->user = nccl;
  // Every failure from here on aborts the siblings made so far, which nothing else would end.
  struct AbortOnFailure {
    GpuState* st;
    ~AbortOnFailure() {
      if (st != nullptr) st->close_siblings(true);
    }
  } abort_on_failure{st.get()};
  int rank = 0, n = 0;
  if (ncclCommUserRank(nccl, &rank) != ncclSuccess || ncclCommCount(nccl, &n) != ncclSuccess)
    return api_fail(optiNcclError, "optiCommInit: the NCCL communicator is not usable");
  if (std::string why = setup_error(opts); !why.empty())
    return api_fail(optiInvalidUsage, "optiCommInit: " + why);
  if (opts.mode == optiBounded) {
    // The siblings: bounded by their traffic class, over OptiReduce by their netName, and with
    // resources of their own (a child that shares its parent's must keep the parent's network).
    const auto split = [&](int64_t traffic_class, ncclComm_t* out) {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.trafficClass = int(traffic_class);
      cfg.netName = kPluginNetName;
      cfg.splitShare = 0;
      const ncclResult_t r = ncclCommSplit(nccl, 0, rank, out, &cfg);
      if (r == ncclSuccess) return optiSuccess;
      return api_fail(optiNcclError,
                      std::string("optiCommInit: ncclCommSplit: ") + ncclGetErrorString(r) +
                          " (is the OptiReduce plugin loaded: NCCL_NET_PLUGIN=optireduce?)");
    };
    const int64_t tc = global_config().bounded_traffic_class;
    if (optiResult_t r = split(tc, &st->bounded); r != optiSuccess) return r;
    if (opts.allgatherMode == optiUntilStarted) {
      if (optiResult_t r = split(tc + 1, &st->until_started); r != optiSuccess) return r;
    }
  }
  st->ex = std::make_unique<NcclExchange>(nccl, st->bounded, st->until_started, rank, n);
  st->k = std::make_unique<CudaKernels>();
  if (!st->k->init()) return api_fail(optiCudaError, "optiCommInit: CUDA allocation failed");
  // Every rank needs the same seed for D: rank 0 draws it and broadcasts it once, exactly.
  uint64_t seed = 0;
  uint64_t* dseed = nullptr;
  if (cudaMalloc(&dseed, sizeof(seed)) != cudaSuccess)
    return api_fail(optiCudaError, "optiCommInit: CUDA allocation failed");
  if (rank == 0) {
    std::random_device rd;
    seed = (uint64_t(rd()) << 32) ^ rd();
    cudaMemcpy(dseed, &seed, sizeof(seed), cudaMemcpyHostToDevice);
  }
  ncclResult_t r = ncclBroadcast(dseed, dseed, sizeof(seed), ncclUint8, 0, nccl, nullptr);
  if (r == ncclSuccess &&
      cudaMemcpy(&seed, dseed, sizeof(seed), cudaMemcpyDeviceToHost) != cudaSuccess)
    r = ncclUnhandledCudaError;
  cudaFree(dseed);
  if (r != ncclSuccess)
    return api_fail(optiNcclError,
                    std::string("optiCommInit: seed broadcast: ") + ncclGetErrorString(r));
  comm->rank = rank;
  comm->nranks = n;
  comm->seed = seed;
  comm->kernels = nullptr;
  comm->tar = std::make_unique<Tar>(st->ex.get(), st->k.get(), seed);
  abort_on_failure.st = nullptr;
  comm->gpu_state = st.release();
  return optiSuccess;
}

optiResult_t gpu_allreduce(optiComm* comm, const void* send, void* recv, size_t count, DType t,
                           RedOp op, struct CUstream_st* stream) {
  GpuState* st = comm->gpu_state;
  st->ex->set_stream(stream);
  if (!st->k->begin_call(stream))
    return api_fail(optiCudaError, "optiAllReduce: CUDA allocation of the call's scratch failed");
  const TarOptions o = api_tar_options(comm->options);
  // As the schedule chooses for an exchange that is not receiver-paced: adaptive means all.
  st->ex->set_incast(o.incast < 0 ? 0 : o.incast);
  st->k->set_sync(o.safeguard_redo);
  optiStats_t s{};
  std::string err;
  Status r = comm->tar->allreduce(send, recv, count, t, op, o, &s, &err);
  st->k->end_call();
  if (!r) {
    comm->failed = optiNcclError;
    comm->failed_msg = err;
    return api_fail(optiNcclError, "optiAllReduce: " + err);
  }
  if (st->k->error() != 0)
    return api_fail(optiCudaError,
                    std::string("optiAllReduce: ") + cuda::error_string(st->k->error()));
  comm->last = s;
  api_add_stats(&comm->total, s);
  ++st->pending_calls;
  st->last_pending = !o.safeguard_redo && st->k->took();
  return optiSuccess;
}

optiResult_t gpu_collect_stats(optiComm* comm) {
  GpuState* st = comm->gpu_state;
  uint64_t c[kNumCounters] = {};
  st->k->collect(c);
  comm->total.elementsLost[0] += c[kLostPhase1];
  comm->total.elementsLost[1] += c[kLostPhase2];
  comm->total.blocksEmpty += c[kBlocksEmpty];
  comm->total.safeguardFlags += c[kSafeguardFlags];
  comm->total.nonfiniteCalls += c[kNonFiniteCalls];
  // `last` is the last call alone, as on the host: what its own snapshot counted, not every
  // count collected since the previous optiGetStats (elementsExpected covers one call).
  if (st->last_pending) {
    uint64_t d[kNumCounters] = {};
    st->k->latest_call(d);
    comm->last.elementsLost[0] = d[kLostPhase1];
    comm->last.elementsLost[1] = d[kLostPhase2];
    comm->last.blocksEmpty = d[kBlocksEmpty];
    comm->last.safeguardFlags = d[kSafeguardFlags];
    comm->last.nonfiniteCalls = d[kNonFiniteCalls];
    st->last_pending = false;
  }
  for (optiStats_t* s : {&comm->last, &comm->total}) {
    const uint64_t e = s->elementsExpected[0] + s->elementsExpected[1];
    const uint64_t l = s->elementsLost[0] + s->elementsLost[1];
    s->lostFraction = e ? double(l) / double(e) : 0.0;
  }
  st->pending_calls = 0;
  return optiSuccess;
}

optiResult_t gpu_destroy(optiComm* comm, bool abort) {
  GpuState* st = comm->gpu_state;
  if (st == nullptr) return optiSuccess;
  comm->tar.reset();
  st->close_siblings(abort);
  delete st;
  comm->gpu_state = nullptr;
  return optiSuccess;
}

}  // namespace optireduce::coll
