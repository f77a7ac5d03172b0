// Transpose AllReduce (see tar.h). One call = one or two passes of two phases:
//   phase 1 (transpose): rank r sends shard j of its (encoded) input to rank j and reduces the
//            N-1 shards r it receives with its own, erased elements excluded and rescaled;
//   phase 2 (gather):    rank r sends its reduced shard to every peer (TarOptions::allgather).
//            By default a shard is cut only if none of it arrived by the deadline, and
//            received whole once it started. Where it is lost, a rank's stand-in (0, or own
//            contribution x N and d/k in the Hadamard domain) is its own, and data-parallel
//            replicas drift apart; a shard that arrives whole is the same bits everywhere
//            (phase 1's estimates are made once, at the shard's owner).
// A bounded call may then agree exactly, over one 1-byte all-to-all, on the safeguard's and the
// non-finite verdicts of every rank (agree). The second pass is the safeguard's exact redo.
// Buffers: `work_in` is what phase 1 reads (the input, or the encoded vector E), `work_out` where
// reduced shards live (the output, or E).
#include "collectives/tar.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "collectives/shard_plan.h"

namespace optireduce::coll {

// Scratch regions (Kernels::scratch slots).
// kSlotFlags: the N flag bytes of the agreement (own at index rank; elem.h's Flag), in the
// path's memory because the exchange moves them (device memory on the GPU).
enum : int { kSlotEncoded = 0, kSlotRecv = 1, kSlotKeep = 2, kSlotRecv2 = 3, kSlotFlags = 4 };

// Pieces of a progressive reduction start on multiples of this many elements.
constexpr uint64_t kReduceGrain = 64;

struct Tar::Pass {
  Mode mode = Mode::kExact;   // phase 1's (and the call's)
  Mode mode2 = Mode::kExact;  // phase 2's: TarOptions::allgather in bounded calls
  bool hadamard = false;
  DType t = DType::kF32;
  RedOp op = RedOp::kSum;
  Erasure erasure = Erasure::kRescale;
  bool gather_fill_own = false;  // TarOptions::gather_fill_own
  size_t es = 4;
  int incast = 1;
  const uint8_t* input = nullptr;
  uint8_t* output = nullptr;
  size_t count = 0;
  uint64_t seed = 0;
  HadamardGeometry g;
  // Derived by run_pass:
  const uint8_t* work_in = nullptr;
  uint8_t* work_out = nullptr;
  uint8_t* encoded = nullptr;  // E, where Hadamard passes encode into (work_in and work_out)
  // The exchange is pipelined (the host path): sends leave as their bytes are released and
  // receives tell their arrivals, so the Hadamard transforms and the reduction work piece by
  // piece while the rest is on the wire.
  bool pipelined = false;
  uint64_t reduced = 0;  // elements of this rank's shard reduced so far (phase 1)
  uint64_t step = 0;     // TarOptions::arrival_step_bytes
  uint64_t release = 0;  // TarOptions::release_bytes
  uint64_t lead = 0;     // TarOptions::release_lead_bytes
  ShardPlan plan;
  uint8_t* slots = nullptr;   // N-1 receive slots of slot_bytes() each (phase 1)
  uint8_t* slots2 = nullptr;  // the same for phase 2 when via_slots
  bool via_slots = false;     // phase 2 receives beside the output (bounded, in place, no HT)
  // A receive slot holds the longest shard, rounded up so that every slot starts as aligned as
  // the scratch (ShardPlan: the kernels' vector path wants 16-byte aligned pointers).
  size_t slot_bytes() const {
    constexpr size_t kAlign = 64;
    return (size_t(plan.max_length()) * es + kAlign - 1) / kAlign * kAlign;
  }
  // Results:
  uint64_t expected[2] = {0, 0};
  uint64_t deadline_hits = 0;
  bool whole_sender_missing = false;
};

Tar::Tar(Exchange* ex, Kernels* k, uint64_t comm_seed)
    : ex_(ex), k_(k), comm_seed_(comm_seed), incast_(ex->size()) {
  srcs_.resize(size_t(ex->size()));
  lossy_.resize(size_t(ex->size()));
}

Status Tar::run_pass(Pass& p, std::string* error) {
  const int n = ex_->size();
  // Pipelined where the exchange moves each send as it is posted and tells each receive's
  // arrivals: the host path. The GPU's grouped calls move everything in end_phase, so there
  // the reduction and the transforms run whole, between and around the phases, as one kernel
  // each.
  p.pipelined = ex_->pipelined();
  p.reduced = 0;
  if (p.hadamard) {
    const uint64_t len = p.g.encoded();
    auto* e = static_cast<uint8_t*>(k_->scratch(kSlotEncoded, len * p.es));
    if (!p.pipelined) k_->encode(p.t, p.input, e, p.g, p.seed);
    p.encoded = e;
    p.work_in = e;
    p.work_out = e;
    p.plan = ShardPlan{len, n};
  } else {
    p.work_in = p.input;
    p.work_out = p.output;
    p.plan = ShardPlan{p.count, n};
  }
  const size_t slots_bytes = size_t(n - 1) * p.slot_bytes();
  p.slots = static_cast<uint8_t*>(k_->scratch(kSlotRecv, slots_bytes));
  // Bounded without Hadamard needs the own contribution of a lost element to estimate it; in
  // place that contribution sits where the received shard would land, so receive beside it.
  p.via_slots = lossy(p.mode2) && !p.hadamard && p.input == p.output;
  if (p.via_slots) p.slots2 = static_cast<uint8_t*>(k_->scratch(kSlotRecv2, slots_bytes));
  Status s = phase1(p, error);
  if (!s) return s;
  return phase2(p, error);
}

Status Tar::fail(const char* what, Status s, std::string* error) {
  *error = std::string(what) + ": " + ex_->error();
  return s;
}

Status Tar::phase1(Pass& p, std::string* error) {
  const int n = ex_->size(), r = ex_->rank();
  const RoundPlan rp{n, p.incast};
  const size_t slot_bytes = p.slot_bytes();
  const uint64_t mine = p.plan.length(r);
  sends_.clear();
  send_round_end_.clear();
  recvs1_.clear();
  round_end1_.clear();
  for (int q = 0; q < rp.rounds(); ++q) {
    for (int d = rp.first_distance(q); d <= rp.last_distance(q); ++d) {
      const int to = rp.send_peer(r, d);
      if (p.plan.length(to) > 0)
        sends_.push_back({to, p.work_in + p.plan.offset(to) * p.es, p.plan.length(to) * p.es});
      if (mine > 0)
        recvs1_.push_back({rp.recv_peer(r, d), p.slots + size_t(d - 1) * slot_bytes, mine * p.es});
    }
    send_round_end_.push_back(uint32_t(sends_.size()));
    round_end1_.push_back(uint32_t(recvs1_.size()));
  }
  if (!p.pipelined) {
    if (Status s = ex_->run_phase(p.mode, 1, sends_, recvs1_, round_end1_); !s)
      return fail("phase 1", s, error);
  } else {
    if (Status s = ex_->begin_phase(p.mode, 1, recvs1_, round_end1_); !s)
      return fail("phase 1", s, error);
    if (p.hadamard) {
      // Every shard is posted before it is encoded and released as its blocks come out
      // (encode_and_release); this rank's own shard, which only the reduction reads, is
      // encoded as the reduction gets to it (reduce_as_arrived).
      blocks_.reset(p.plan, p.g);
      for (SendOp& op : sends_) op.ready = 0;
      released_.assign(sends_.size(), 0);
      if (Status s = ex_->post_sends(sends_); !s) return fail("phase 1", s, error);
      if (Status s = encode_and_release(p, false); !s) return fail("phase 1", s, error);
    } else if (Status s = ex_->post_sends(sends_); !s) {
      return fail("phase 1", s, error);
    }
    if (Status s = reduce_as_arrived(p); !s) return fail("phase 1", s, error);
    if (Status s = ex_->end_phase(); !s) return fail("phase 1", s, error);
  }
  p.expected[0] = uint64_t(n - 1) * mine;
  for (const RecvOp& rv : recvs1_) {
    p.deadline_hits += rv.deadline_hit ? 1 : 0;
    p.whole_sender_missing |= rv.lost_bytes == rv.bytes;
  }
  return Status::ok();
}

// Phase 2 posts its receives first, then reduces this rank's shard (phase 1's result), then
// sends it: the peers' phase-2 sends, which may start as soon as they finished their own
// reduction, find the receives already posted instead of expiring.
Status Tar::phase2(Pass& p, std::string* error) {
  const int n = ex_->size(), r = ex_->rank();
  const RoundPlan rp{n, p.incast};
  const size_t slot_bytes = p.slot_bytes();
  const uint64_t mine = p.plan.length(r);
  recvs2_.clear();
  round_end2_.clear();
  for (int q = 0; q < rp.rounds(); ++q) {
    for (int d = rp.first_distance(q); d <= rp.last_distance(q); ++d) {
      const int from = rp.recv_peer(r, d);
      const uint64_t len = p.plan.length(from);
      if (len == 0) continue;
      uint8_t* dst = p.via_slots ? p.slots2 + size_t(d - 1) * slot_bytes
                                 : p.work_out + p.plan.offset(from) * p.es;
      recvs2_.push_back({from, dst, len * p.es});
    }
    round_end2_.push_back(uint32_t(recvs2_.size()));
  }
  if (Status s = ex_->begin_phase(p.mode2, 2, recvs2_, round_end2_); !s)
    return fail("phase 2", s, error);

  // What phase 1 left: all of the shard where the reduction waited for the phase's end.
  if (mine > p.reduced) reduce_range(p, p.reduced, mine);

  sends_.clear();
  for (int q = 0; q < rp.rounds(); ++q)
    for (int d = rp.first_distance(q); d <= rp.last_distance(q); ++d)
      if (mine > 0)
        sends_.push_back({rp.send_peer(r, d), p.work_out + p.plan.offset(r) * p.es, mine * p.es});
  if (Status s = ex_->post_sends(sends_); !s) return fail("phase 2", s, error);

  // The stand-in for what this rank lost here: its own contribution as the average (x N for
  // a sum), or nothing (0: it skips those elements this step). In the Hadamard domain the same
  // choice: `own` rescales a block that kept k of its d coordinates by d/k (unbiased; an error
  // of sqrt((d - k) / k) times the block's norm, past the block itself once k < d/2) and puts
  // own x N into a block that kept none; `zero` decodes the kept coordinates as they are (the
  // lost ones 0: an error of sqrt(1 - k/d) of the block's norm, never more than the block).
  const double own_scale = !p.gather_fill_own ? 0.0 : p.op == RedOp::kSum ? double(n) : 1.0;
  const Erasure fill_policy = p.gather_fill_own ? p.erasure : Erasure::kZero;
  const auto decode = [&](uint64_t b0, uint64_t b1) {
    const size_t at = size_t(b0 * p.g.block) * p.es;
    k_->decode(p.t, p.work_out + at, p.output + at, p.g.blocks_from(b0, b1), p.seed, 1.0,
               p.input + at, own_scale, fill_policy);
  };
  if (p.pipelined && p.hadamard) {
    blocks_.reset(p.plan, p.g);
    // What is here decodes while the rest arrives: this rank's shard at once, each peer's
    // blocks as their bytes arrive (a received prefix holds no hole), the rest as each
    // receive ends.
    blocks_.shard_arrived(r, decode);
    for (bool all = recvs2_.empty(); !all;) {
      if (Status s = ex_->wait_arrivals(recvs2_.size(), p.step); !s)
        return fail("phase 2", s, error);
      all = true;
      for (const RecvOp& rv : recvs2_) {
        all = all && rv.done;
        blocks_.shard_progress(rv.peer, rv.arrived / p.es, decode);
      }
    }
  }
  if (Status s = ex_->end_phase(); !s) return fail("phase 2", s, error);

  p.expected[1] = p.plan.count - mine;
  for (const RecvOp& rv : recvs2_) {
    p.deadline_hits += rv.deadline_hit ? 1 : 0;
    p.whole_sender_missing |= rv.lost_bytes == rv.bytes;
    if (p.hadamard) continue;  // the decoder finds and counts the holes
    const size_t off = p.plan.offset(rv.peer) * p.es;
    const size_t len = p.plan.length(rv.peer);
    if (rv.lost_bytes > 0) {
      k_->fill_lost(p.t, p.output + off, rv.data, p.input + off, len, own_scale, fill_policy);
    } else if (p.via_slots) {
      k_->copy(p.output + off, rv.data, rv.bytes);
    }
  }
  if (p.hadamard) {
    if (p.pipelined)
      blocks_.take_rest(decode);
    else
      decode(0, p.g.blocks());
  }
  return Status::ok();
}

// Elements [from, to) of this rank's shard, from what phase 1 received. A receive not done yet
// contributes only below its arrived prefix, which holds no hole (lossy 0); a done one is
// checked for the marker where it lost bytes. Each element's result depends on its own column
// alone, so pieces give the bits of one whole reduction.
void Tar::reduce_range(Pass& p, uint64_t from, uint64_t to) {
  const int n = ex_->size(), r = ex_->rank();
  const size_t at = size_t(from) * p.es;
  srcs_[size_t(r)] = p.work_in + p.plan.offset(r) * p.es + at;
  lossy_[size_t(r)] = 0;
  for (const RecvOp& rv : recvs1_) {
    srcs_[size_t(rv.peer)] = static_cast<const uint8_t*>(rv.data) + at;
    lossy_[size_t(rv.peer)] = rv.done && rv.lost_bytes > 0 ? 1 : 0;
  }
  k_->reduce(p.t, srcs_.data(), lossy_.data(), n, p.work_out + p.plan.offset(r) * p.es + at,
             to - from, p.op, p.erasure);
}

// Phase 1 on the host path: reduces this rank's shard as far as every peer's contribution has
// arrived, while the rest is on the wire; returns once every receive ended, leaving the rest
// (with the losses the receives reported) to phase 2, after it posted its receives.
// With Hadamard it encodes this rank's own shard piece by piece just before reducing it, and
// whatever is left at the end. Encoded whole after the sends, it took 0.3-0.5 ms of CPU on
// every rank at once, just as every rank's first packets left: on a busy host (4 ranks on 2
// cores in bench/lab) that delayed the sends themselves, and phase 1 ended later.
Status Tar::reduce_as_arrived(Pass& p) {
  const int r = ex_->rank();
  const uint64_t mine = p.plan.length(r);
  const auto encode = [&](uint64_t b0, uint64_t b1) { encode_blocks(p, b0, b1); };
  while (mine > 0) {
    if (Status s = ex_->wait_arrivals(recvs1_.size(), p.step); !s) return s;
    if (p.hadamard) {
      if (Status s = encode_and_release(p, false); !s) return s;
    }
    uint64_t ready = mine;
    bool all = true;
    for (const RecvOp& rv : recvs1_) {
      all = all && rv.done;
      ready = std::min<uint64_t>(ready, rv.arrived / p.es);
    }
    if (all) break;
    // Whole vector widths, so that every piece keeps the kernels' alignment.
    ready -= ready % kReduceGrain;
    if (ready > p.reduced) {
      if (p.hadamard) blocks_.take_shard_prefix(r, ready, encode);
      reduce_range(p, p.reduced, ready);
      p.reduced = ready;
    }
  }
  if (p.hadamard) {
    if (Status s = encode_and_release(p, true); !s) return s;
    blocks_.take_shard(r, encode);
  }
  return Status::ok();
}

// Phase 1's sends on the host path with Hadamard, posted before they are encoded: encodes
// TarOptions::release_bytes of each shard in turn and releases it, round by round of the
// receivers, until each is released release_lead_bytes past what of it has left (`all`: whole).
// Called once the sends are posted, at each return of the reduction's wait, and at the phase's
// end.
// Why in pieces: encoded whole before its send, each shard held its first packet back by its
// own encode and the last shard's by all of them, which grows with the bucket (+ Hadamard's
// idle P50 at 16 MiB was 215.1-215.7 ms that way, 211.9-212.0 ms in pieces; bench/lab, 4 ranks
// on 2 cores, Gloo ring 207.2-207.7 ms). Why no further than a lead: encoding a 16 MiB
// bucket's 12 MiB of peers' shards at once took every rank's CPU for the phase's first 9 ms,
// just as every rank's flows started, and phase 1 ended 3-4 ms after bounded TAR's.
// The defaults: each release runs a pass of the transport (drain, transmit), and 64 KiB pieces
// cost 5-10% more CPU per call than 256 KiB ones for no gain in time. A lead of 1 MiB per flow
// is 25 ms of a 1 Gbit/s link shared by three flows, far longer than the reduction's wait
// between two looks (a step's arrival, well under a millisecond), so the wire never waits for
// the encode; a 4 MiB bucket (1 MiB shards at 4 ranks) is released whole at once.
Status Tar::encode_and_release(Pass& p, bool all) {
  const uint64_t chunk = std::max<uint64_t>(p.release / p.es, 1);
  const uint64_t lead = std::max<uint64_t>(p.lead / p.es, 1);
  const auto encode = [&](uint64_t b0, uint64_t b1) { encode_blocks(p, b0, b1); };
  size_t first = 0;
  for (const uint32_t end : send_round_end_) {
    for (bool more = true; more;) {
      more = false;
      for (size_t k = first; k < end; ++k) {
        const uint64_t len = p.plan.length(sends_[k].peer);
        if (released_[k] >= len) continue;  // no need to ask the transport (a lock) again
        const uint64_t target = all ? len : std::min(len, ex_->sent_bytes(k) / p.es + lead);
        if (released_[k] >= target) continue;
        const uint64_t upto = std::min(target, released_[k] + chunk);
        released_[k] = blocks_.take_shard_prefix(sends_[k].peer, upto, encode);
        if (Status s = ex_->release_send(k, released_[k] * p.es); !s) return s;
        more = more || released_[k] < target;
      }
    }
    first = end;
  }
  return Status::ok();
}

void Tar::encode_blocks(Pass& p, uint64_t b0, uint64_t b1) {
  const size_t at = size_t(b0 * p.g.block) * p.es;
  k_->encode(p.t, p.input + at, p.encoded + at, p.g.blocks_from(b0, b1), p.seed);
}

// `flags` holds N bytes in the path's memory, this rank's flag byte (elem.h's Flag) at [rank],
// written in order with the call's kernels; the others' land beside it. One exact exchange
// carries both verdicts. Nothing is read on the host here: the GPU's stream runs on.
Status Tar::agree(uint8_t* flags, std::string* error) {
  const int n = ex_->size(), r = ex_->rank();
  sends_.clear();
  recvs1_.clear();
  round_end1_.clear();
  for (int d = 1; d < n; ++d) {
    sends_.push_back({(r + d) % n, flags + r, 1});
    const int from = (r - d + n) % n;
    recvs1_.push_back({from, flags + from, 1});
  }
  round_end1_.push_back(uint32_t(recvs1_.size()));
  if (Status s = ex_->run_phase(Mode::kExact, 3, sends_, recvs1_, round_end1_); !s)
    return fail("agreement on the call's verdicts", s, error);
  return Status::ok();
}

Status Tar::allreduce(const void* send, void* recv, size_t count, DType t, RedOp op,
                      const TarOptions& o, optiStats_t* st, std::string* error) {
  const auto t0 = std::chrono::steady_clock::now();
  *st = optiStats_t{};
  st->calls = 1;
  const int n = ex_->size();
  const uint64_t call = calls_++;
  const size_t es = dtype_size(t);
  if (count == 0) return Status::ok();
  if (n == 1) {
    if (send != recv) k_->copy(recv, send, count * es);
    st->exactCalls = 1;
    return Status::ok();
  }
  // Control data must be identical on every rank: the first call of a communicator and tiny
  // buffers (norms, loss values) go exact.
  const bool exact = o.mode == Mode::kExact || call == 0 || count * es < o.exact_below_bytes;
  int incast = o.incast;
  if (incast < 0) incast = ex_->receiver_paced() ? incast_.incast() : 0;
  incast = clamp_incast(incast, n);

  Pass p;
  p.mode = exact ? Mode::kExact : Mode::kBounded;
  p.mode2 = exact ? Mode::kExact : o.allgather;
  p.hadamard = !exact && o.hadamard;
  p.t = t;
  p.op = op;
  p.erasure = o.erasure;
  p.gather_fill_own = o.gather_fill_own;
  p.es = es;
  p.incast = incast;
  p.input = static_cast<const uint8_t*>(send);
  p.output = static_cast<uint8_t*>(recv);
  p.count = count;
  p.seed = call_seed(comm_seed_, call);
  p.g = HadamardGeometry{count, o.hadamard_block};
  p.step = o.arrival_step_bytes;
  p.release = o.release_bytes;
  p.lead = o.release_lead_bytes;

  // An exact redo needs the input, which an in-place pass overwrites: keep a copy.
  const uint8_t* redo_input = p.input;
  if (!exact && o.safeguard_redo && send == recv) {
    auto* keep = static_cast<uint8_t*>(k_->scratch(kSlotKeep, count * es));
    k_->copy(keep, send, count * es);
    redo_input = keep;
  }

  // Bounded calls: this rank's flag byte starts with its input's non-finite scan, before the
  // pass overwrites an in-place input. The byte lives in the path's memory (the exchange moves
  // it), and on the GPU the verdict stays on the device, in stream order.
  uint8_t* flags = nullptr;
  if (!exact) {
    flags = static_cast<uint8_t*>(k_->scratch(kSlotFlags, size_t(n)));
    k_->flag_nonfinite(t, send, o.nonfinite_agree ? count : 0, flags + ex_->rank());
  }
  Status s = run_pass(p, error);
  if (!s) return s;
  const uint64_t expected = p.expected[0] + p.expected[1];
  // The verdict comes from the counters where they are (on the GPU: the device, in stream
  // order), not from a host copy that may not have been read back yet.
  if (!exact) k_->flag_lost(o.safeguard, expected, flags + ex_->rank());
  // One exact agreement per bounded call that needs one, for both verdicts. Bounded mode does
  // not otherwise wait for the slowest rank; this does (docs/architecture.md, "The non-finite
  // verdict"), which is why the non-finite agreement is an option.
  const bool agreed = !exact && (o.safeguard_redo || o.nonfinite_agree);
  if (agreed) {
    s = agree(flags, error);
    if (!s) return s;
    // With the redo the exact pass makes the output (non-finite where the exact sum is); only
    // count the verdict then.
    if (o.nonfinite_agree) k_->nonfinite_verdict(t, recv, o.safeguard_redo ? 0 : count, flags, n);
  }
  uint64_t c[kNumCounters] = {};
  k_->take_counters(c);
  st->exactCalls = exact ? 1 : 0;
  st->elementsExpected[0] = p.expected[0];
  st->elementsExpected[1] = p.expected[1];
  st->elementsLost[0] = c[kLostPhase1];
  st->elementsLost[1] = c[kLostPhase2];
  st->blocksEmpty = c[kBlocksEmpty];
  st->deadlineHits = p.deadline_hits;
  st->incast = incast;
  const uint64_t lost = c[kLostPhase1] + c[kLostPhase2];
  st->lostFraction = expected ? double(lost) / double(expected) : 0.0;
  // 0 here on a GPU that has not synchronised: gpu_collect_stats adds the device's count.
  st->safeguardFlags = c[kSafeguardFlags];
  st->nonfiniteCalls = c[kNonFiniteCalls];
  if (!exact && o.incast < 0)
    incast_.update(st->lostFraction, p.deadline_hits, p.whole_sender_missing);

  if (!exact && o.safeguard_redo) {
    // Either verdict of any rank redoes the call exactly, on every rank alike.
    flags_host_.resize(size_t(n));
    k_->read_back(flags_host_.data(), flags, size_t(n));
    bool any = false;
    for (uint8_t f : flags_host_) any = any || f != 0;
    if (any) {
      Pass q;
      q.mode = Mode::kExact;
      q.t = t;
      q.op = op;
      q.erasure = o.erasure;
      q.es = es;
      q.incast = incast;
      q.input = redo_input;
      q.output = p.output;
      q.count = count;
      q.seed = p.seed;
      q.g = p.g;
      q.step = p.step;
      s = run_pass(q, error);
      if (!s) return s;
      k_->take_counters(c);  // an exact pass loses nothing; drop whatever it counted
      st->safeguardRedos = 1;
    }
  }
  ex_->timing(&st->tbUs, &st->tcUs);
  st->timeUs =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  return Status::ok();
}

}  // namespace optireduce::coll
