// An in-process Exchange for tests and benchmarks: ranks are threads, messages are copied
// through per-pair FIFO mailboxes, bounded receives end by a deadline, and a seeded loss model
// erases packet-sized byte ranges with the erasure marker exactly as the transport does
// (8-byte aligned payload boundaries, 0x7FF1 repeated).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "collectives/exchange.h"
#include "collectives/math.h"

namespace optireduce::coll::test {

struct LossModel {
  double drop = 0;             // stationary fraction of packets lost
  double burst = 1;            // mean length of a loss burst, in packets (Gilbert model)
  size_t packet_bytes = 1024;  // payload per packet, a multiple of 8
  int only_phase = 0;          // 0: every phase; 1 or 2: only that phase loses
  uint64_t seed = 1;
  // Incast congestion: each sender admitted in the same round beyond `incast_capacity` adds
  // `incast_drop` to the drop rate of that round's receives (0 capacity: off).
  int incast_capacity = 0;
  double incast_drop = 0;
};

// Fills [p, p + n) with the marker pattern; p is 2-byte aligned relative to the message.
inline void fill_marker(uint8_t* p, size_t n) {
  for (size_t i = 0; i + 1 < n; i += 2) {
    p[i] = uint8_t(kMarker16 & 0xFF);
    p[i + 1] = uint8_t(kMarker16 >> 8);
  }
}

class SimNetwork {
 public:
  SimNetwork(int nranks, LossModel loss, std::chrono::microseconds deadline)
      : n_(nranks), loss_(loss), deadline_(deadline), pairs_(size_t(nranks * nranks)) {}

  std::unique_ptr<Exchange> endpoint(int rank);
  int size() const { return n_; }
  // Whether the endpoints are pipelined (Exchange::pipelined: sends released as they are
  // written, receives' arrivals told), as the host path's are, or take each send when posted
  // and complete every receive in end_phase, as grouped NCCL calls do.
  void set_pipelined(bool on) { pipelined_ = on; }
  // Runs fn(rank) on N threads and joins them.
  void run(const std::function<void(int)>& fn) {
    std::vector<std::thread> ts;
    for (int r = 0; r < n_; ++r) ts.emplace_back(fn, r);
    for (auto& t : ts) t.join();
  }

 private:
  friend class SimExchange;
  struct Msg {
    uint64_t seq;
    std::vector<uint8_t> data;
  };
  struct Pair {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Msg> q;
    uint64_t send_seq = 0;
    uint64_t recv_seq = 0;
    uint64_t closed = 0;  // receives below this sequence number are finished
  };
  Pair& pair(int from, int to) { return pairs_[size_t(from * n_ + to)]; }

  int n_;
  LossModel loss_;
  std::chrono::microseconds deadline_;
  std::vector<Pair> pairs_;
  bool pipelined_ = true;
};

class SimExchange final : public Exchange {
 public:
  SimExchange(SimNetwork* net, int rank) : net_(net), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return net_->n_; }
  void timing(uint32_t* tb_us, uint32_t* tc_us) const override {
    *tb_us = uint32_t(net_->deadline_.count());
    *tc_us = *tb_us;
  }

  Status begin_phase(Mode mode, int phase, std::span<RecvOp> recvs,
                     std::span<const uint32_t> round_end) override {
    mode_ = mode;
    phase_ = phase;
    recvs_ = recvs;
    round_end_ = round_end;
    done_ = 0;
    round_ = 0;
    round_deadline_ = std::chrono::steady_clock::now() + net_->deadline_;
    stage_.resize(recvs.size());
    staged_.assign(recvs.size(), 0);
    outcome_.assign(recvs.size(), RecvOp{});
    clean_.assign(recvs.size(), 0);
    sends_.clear();
    return Status::ok();
  }

  // A send copies its bytes as they are released (all of them when posted, unless held), so
  // that a byte the schedule changes after releasing it never reaches the receiver as changed.
  Status post_sends(std::span<const SendOp> sends) override {
    for (const SendOp& s : sends) {
      if (s.peer < 0 || s.peer >= size() || s.peer == rank_) return fail("bad send peer");
      if (s.ready < s.bytes && !net_->pipelined_) return fail("a held send on a grouped exchange");
      auto& pr = net_->pair(rank_, s.peer);
      uint64_t seq;
      {
        std::lock_guard<std::mutex> lk(pr.mu);
        seq = pr.send_seq++;
      }
      sends_.push_back({s, seq, std::vector<uint8_t>(s.bytes), 0, false});
      if (Status st = release_send(sends_.size() - 1, s.ready < s.bytes ? s.ready : s.bytes); !st)
        return st;
      leave_if_whole(sends_.size() - 1);  // an empty send has nothing to release
    }
    return Status::ok();
  }

  Status release_send(size_t k, size_t ready) override {
    if (k >= sends_.size() || ready > sends_[k].op.bytes) return fail("release beyond a send");
    Held& h = sends_[k];
    if (ready <= h.released) return Status::ok();
    const auto* b = static_cast<const uint8_t*>(h.op.data);
    std::memcpy(h.data.data() + h.released, b + h.released, ready - h.released);
    h.released = ready;
    leave_if_whole(k);
    return Status::ok();
  }

  bool pipelined() const override { return net_->pipelined_; }

  // A send leaves once all of it was released, once.
  void leave_if_whole(size_t k) {
    auto& h = sends_[k];
    if (h.gone || h.released < h.op.bytes) return;
    h.gone = true;
    auto& pr = net_->pair(rank_, h.op.peer);
    std::lock_guard<std::mutex> lk(pr.mu);
    // A message the receiver already gave up on is late: dropped, as the transport does.
    if (h.seq >= pr.closed) pr.q.push_back({h.seq, std::move(h.data)});
    pr.cv.notify_all();
  }

  // Receives end in order here; the one in progress shows its head a few `step`s at a time
  // (a pseudo-random number of them, in whole packets), never past its first lost packet.
  Status wait_arrivals(size_t n, uint64_t step) override {
    if (!net_->pipelined_) return Exchange::wait_arrivals(n, step);
    n = n < recvs_.size() ? n : recvs_.size();
    if (done_ >= n) return Status::ok();
    advance_round();
    const size_t i = done_;
    if (Status s = stage(i); !s) return s;
    RecvOp& r = recvs_[i];
    const uint64_t pkt = net_->loss_.packet_bytes;
    const uint64_t k = 1 + mix64((uint64_t(rank_) << 40) ^ (uint64_t(i) << 32) ^ r.arrived) % 3;
    uint64_t next = r.arrived + (step * k + pkt - 1) / pkt * pkt;
    next = next < clean_[i] ? next : clean_[i];
    if (step > 0 && next >= r.arrived + step) {
      std::memcpy(static_cast<uint8_t*>(r.data) + r.arrived, stage_[i].data() + r.arrived,
                  next - r.arrived);
      r.arrived = next;
      return Status::ok();
    }
    finish(i);
    return Status::ok();
  }
  Status end_phase() override {
    for (const Held& h : sends_)
      if (h.released < h.op.bytes) return fail("a send ended its phase not released whole");
    return wait_until(recvs_.size());
  }

 private:
  Status fail(const char* msg) {
    error_ = msg;
    return Status(Errc::kInternal);
  }

  // Receives [done_, n), round by round: round 0 was posted by begin_phase, a later round
  // when the previous one completed (its deadline counts from then).
  Status wait_until(size_t n) {
    n = n < recvs_.size() ? n : recvs_.size();
    while (done_ < n) {
      advance_round();
      if (Status s = stage(done_); !s) return s;
      finish(done_);
    }
    return Status::ok();
  }

  void advance_round() {
    while (done_ == round_end_[round_]) {
      ++round_;
      round_deadline_ = std::chrono::steady_clock::now() + net_->deadline_;
    }
  }

  // Receives message i (its loss applied) into a buffer of the exchange's own, once, so that
  // wait_arrivals can show its head before it ends.
  Status stage(size_t i) {
    if (staged_[i]) return Status::ok();
    const size_t lo = round_ == 0 ? 0 : round_end_[round_ - 1];
    RecvOp t = recvs_[i];
    stage_[i].assign(t.bytes, 0);
    t.data = stage_[i].data();
    size_t first_lost = t.bytes;
    Status s =
        recv_one(mode_, phase_, t, round_deadline_, int(round_end_[round_] - lo), &first_lost);
    if (!s) return s;
    outcome_[i] = t;
    clean_[i] = first_lost;
    staged_[i] = 1;
    return Status::ok();
  }

  void finish(size_t i) {
    RecvOp& r = recvs_[i];
    std::memcpy(static_cast<uint8_t*>(r.data) + r.arrived, stage_[i].data() + r.arrived,
                r.bytes - r.arrived);
    r.lost_bytes = outcome_[i].lost_bytes;
    r.deadline_hit = outcome_[i].deadline_hit;
    r.arrived = r.bytes;
    r.done = true;
    ++done_;
  }

  Status recv_one(Mode mode, int phase, RecvOp& r, std::chrono::steady_clock::time_point deadline,
                  int round_size, size_t* first_lost) {
    auto& pr = net_->pair(r.peer, rank_);
    std::unique_lock<std::mutex> lk(pr.mu);
    const uint64_t seq = pr.recv_seq++;
    auto ready = [&] {
      while (!pr.q.empty() && pr.q.front().seq < seq) pr.q.pop_front();
      return !pr.q.empty() && pr.q.front().seq == seq;
    };
    auto* dst = static_cast<uint8_t*>(r.data);
    if (mode == Mode::kExact) {
      if (!pr.cv.wait_for(lk, std::chrono::seconds(60), ready)) return fail("exact receive hung");
    } else if (!pr.cv.wait_until(lk, deadline, ready)) {
      pr.closed = seq + 1;
      fill_marker(dst, r.bytes);
      r.lost_bytes = r.bytes;
      r.deadline_hit = true;
      *first_lost = 0;
      return Status::ok();
    }
    SimNetwork::Msg m = std::move(pr.q.front());
    pr.q.pop_front();
    pr.closed = seq + 1;
    lk.unlock();
    if (m.data.size() != r.bytes) return fail("message size differs from the receive");
    std::memcpy(dst, m.data.data(), r.bytes);
    // kUntilStarted: a message that arrived is whole (the deadline cut only absent ones).
    if (mode == Mode::kBounded) apply_loss(phase, r, seq, round_size, first_lost);
    return Status::ok();
  }

  void apply_loss(int phase, RecvOp& r, uint64_t seq, int round_size, size_t* first_lost) {
    const LossModel& L = net_->loss_;
    if (L.only_phase != 0 && L.only_phase != phase) return;
    double drop = L.drop;
    if (L.incast_capacity > 0 && round_size > L.incast_capacity)
      drop += L.incast_drop * (round_size - L.incast_capacity);
    if (drop <= 0) return;
    drop = drop > 1 ? 1 : drop;
    std::mt19937_64 rng(mix64(L.seed ^ mix64((uint64_t(r.peer) << 48) ^ (uint64_t(rank_) << 32) ^
                                             (seq << 2) ^ uint64_t(phase))));
    std::uniform_real_distribution<double> u(0, 1);
    const double stay_bad = L.burst > 1 ? 1 - 1 / L.burst : 0;
    const double go_bad = drop >= 1 ? 1 : drop / (L.burst * (1 - drop));
    // Start in the stationary distribution so short messages see the configured rate.
    bool bad = u(rng) < drop;
    auto* b = static_cast<uint8_t*>(r.data);
    for (size_t off = 0; off < r.bytes; off += L.packet_bytes) {
      const size_t len = r.bytes - off < L.packet_bytes ? r.bytes - off : L.packet_bytes;
      if (bad) {
        fill_marker(b + off, len);
        r.lost_bytes += len;
        if (off < *first_lost) *first_lost = off;
      }
      bad = bad ? u(rng) < stay_bad : u(rng) < go_bad;
    }
  }

  struct Held {  // a send of this phase, and what of it was released
    SendOp op;
    uint64_t seq;
    std::vector<uint8_t> data;
    size_t released;
    bool gone;  // in the receiver's mailbox
  };

  SimNetwork* net_;
  int rank_;
  Mode mode_ = Mode::kExact;
  int phase_ = 0;
  std::span<RecvOp> recvs_;
  std::span<const uint32_t> round_end_;
  size_t done_ = 0;   // receives [0, done_) complete
  size_t round_ = 0;  // the latest round posted
  std::chrono::steady_clock::time_point round_deadline_;
  // Per receive of the phase: its message as received (loss applied), whether it is, its
  // outcome, and the bytes before its first lost packet.
  std::vector<std::vector<uint8_t>> stage_;
  std::vector<uint8_t> staged_;
  std::vector<RecvOp> outcome_;
  std::vector<uint64_t> clean_;
  std::vector<Held> sends_;
};

inline std::unique_ptr<Exchange> SimNetwork::endpoint(int rank) {
  return std::make_unique<SimExchange>(this, rank);
}

}  // namespace optireduce::coll::test
