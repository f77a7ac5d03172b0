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
  // A message's bytes, as far as its sender released them (Exchange::release_send); both
  // fields under the pair's mutex. Posted at once, so that a receiver can start on a message
  // whose tail its sender has not written yet.
  struct Body {
    std::vector<uint8_t> data;
    size_t released = 0;
  };
  struct Msg {
    uint64_t seq;
    std::shared_ptr<Body> body;
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
    bodies_.assign(recvs.size(), nullptr);
    lost_.resize(recvs.size());
    outcome_.assign(recvs.size(), RecvOp{});
    clean_.assign(recvs.size(), 0);
    sends_.clear();
    return Status::ok();
  }

  // A send is in the receiver's mailbox at once and copies its bytes as they are released
  // (all of them when posted, unless held), so that a byte the schedule changes after releasing
  // it never reaches the receiver as changed. What is released has left (an instant wire).
  Status post_sends(std::span<const SendOp> sends) override {
    for (const SendOp& s : sends) {
      if (s.peer < 0 || s.peer >= size() || s.peer == rank_) return fail("bad send peer");
      if (s.ready < s.bytes && !net_->pipelined_) return fail("a held send on a grouped exchange");
      auto body = std::make_shared<SimNetwork::Body>();
      body->data.resize(s.bytes);
      {
        auto& pr = net_->pair(rank_, s.peer);
        std::lock_guard<std::mutex> lk(pr.mu);
        // A message the receiver already gave up on is late: dropped, as the transport does.
        const uint64_t seq = pr.send_seq++;
        if (seq >= pr.closed) pr.q.push_back({seq, body});
        pr.cv.notify_all();
      }
      sends_.push_back({s, body, 0});
      if (Status st = release_send(sends_.size() - 1, s.ready < s.bytes ? s.ready : s.bytes); !st)
        return st;
    }
    return Status::ok();
  }

  Status release_send(size_t k, size_t ready) override {
    if (k >= sends_.size() || ready > sends_[k].op.bytes) return fail("release beyond a send");
    Held& h = sends_[k];
    if (ready <= h.released) return Status::ok();
    auto& pr = net_->pair(rank_, h.op.peer);
    std::lock_guard<std::mutex> lk(pr.mu);
    const auto* b = static_cast<const uint8_t*>(h.op.data);
    std::memcpy(h.body->data.data() + h.released, b + h.released, ready - h.released);
    h.released = h.body->released = ready;
    pr.cv.notify_all();
    return Status::ok();
  }
  uint64_t sent_bytes(size_t k) override { return k < sends_.size() ? sends_[k].released : 0; }

  bool pipelined() const override { return net_->pipelined_; }

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
    const size_t released = released_of(i);
    const bool whole = released == r.bytes;
    if (!whole) next = std::min<uint64_t>(next, released / pkt * pkt);
    if (step > 0 && next >= r.arrived + step) {
      std::memcpy(static_cast<uint8_t*>(r.data) + r.arrived, bodies_[i]->data.data() + r.arrived,
                  next - r.arrived);
      r.arrived = next;
      stalled_ = false;
      return Status::ok();
    }
    if (whole) {
      stalled_ = false;
      return finish(i);
    }
    // Its sender has not released enough yet, and may be waiting for this rank's bytes to
    // release more: a return without progress lets the caller release its own (the contract
    // allows it; the transport's exchange never needs to). A schedule that never releases the
    // rest would spin here for good: fail instead.
    const auto now = std::chrono::steady_clock::now();
    if (!stalled_) stalled_since_ = now;
    stalled_ = true;
    if (now - stalled_since_ > std::chrono::seconds(10)) return fail("a sender stopped releasing");
    std::this_thread::yield();
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
      if (Status s = finish(done_); !s) return s;
    }
    return Status::ok();
  }

  // How much of receive i's message its sender has released (all of a message cut before it
  // came: the markers are all there is).
  size_t released_of(size_t i) {
    if (!bodies_[i]) return recvs_[i].bytes;
    std::lock_guard<std::mutex> lk(net_->pair(recvs_[i].peer, rank_).mu);
    return bodies_[i]->released;
  }

  void advance_round() {
    while (done_ == round_end_[round_]) {
      ++round_;
      round_deadline_ = std::chrono::steady_clock::now() + net_->deadline_;
    }
  }

  // Takes message i from its mailbox once, and decides its loss: the lost packets' markers go
  // into a buffer of the exchange's own (lost_[i] says which), the bytes come from the
  // message as its sender releases them, so that wait_arrivals can show its head before it
  // ends, and before its tail is written.
  Status stage(size_t i) {
    if (staged_[i]) return Status::ok();
    const size_t lo = round_ == 0 ? 0 : round_end_[round_ - 1];
    RecvOp t = recvs_[i];
    stage_[i].assign(t.bytes, 0);
    t.data = stage_[i].data();
    lost_[i].clear();
    size_t first_lost = t.bytes;
    Status s = recv_one(mode_, phase_, t, round_deadline_, int(round_end_[round_] - lo),
                        &first_lost, &bodies_[i], &lost_[i]);
    if (!s) return s;
    outcome_[i] = t;
    clean_[i] = first_lost;
    staged_[i] = 1;
    return Status::ok();
  }

  // Ends receive i: the rest of its message once its sender released all of it, the markers
  // where packets were lost.
  Status finish(size_t i) {
    RecvOp& r = recvs_[i];
    auto* dst = static_cast<uint8_t*>(r.data);
    if (const auto& b = bodies_[i]) {
      auto& pr = net_->pair(r.peer, rank_);
      std::unique_lock<std::mutex> lk(pr.mu);
      if (!pr.cv.wait_for(lk, std::chrono::seconds(60), [&] { return b->released == r.bytes; }))
        return fail("a sender never released its message whole");
      lk.unlock();
      std::memcpy(dst + r.arrived, b->data.data() + r.arrived, r.bytes - r.arrived);
      const size_t pkt = net_->loss_.packet_bytes;
      for (size_t off : lost_[i]) {
        if (off < r.arrived) continue;
        const size_t len = r.bytes - off < pkt ? r.bytes - off : pkt;
        std::memcpy(dst + off, stage_[i].data() + off, len);
      }
    } else {
      std::memcpy(dst + r.arrived, stage_[i].data() + r.arrived, r.bytes - r.arrived);
    }
    r.lost_bytes = outcome_[i].lost_bytes;
    r.deadline_hit = outcome_[i].deadline_hit;
    r.arrived = r.bytes;
    r.done = true;
    ++done_;
    return Status::ok();
  }

  // Takes the receive's message into *body and marks the packets it loses (bounded) in r.data
  // and *lost (their offsets); a bounded one that never came is all markers, with no body.
  Status recv_one(Mode mode, int phase, RecvOp& r, std::chrono::steady_clock::time_point deadline,
                  int round_size, size_t* first_lost, std::shared_ptr<SimNetwork::Body>* body,
                  std::vector<size_t>* lost) {
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
    if (m.body->data.size() != r.bytes) return fail("message size differs from the receive");
    *body = std::move(m.body);
    // kUntilStarted: a message that arrived is whole (the deadline cut only absent ones).
    if (mode == Mode::kBounded) apply_loss(phase, r, seq, round_size, first_lost, lost);
    return Status::ok();
  }

  void apply_loss(int phase, RecvOp& r, uint64_t seq, int round_size, size_t* first_lost,
                  std::vector<size_t>* lost) {
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
        lost->push_back(off);
        r.lost_bytes += len;
        if (off < *first_lost) *first_lost = off;
      }
      bad = bad ? u(rng) < stay_bad : u(rng) < go_bad;
    }
  }

  struct Held {  // a send of this phase, and what of it was released
    SendOp op;
    std::shared_ptr<SimNetwork::Body> body;
    size_t released;
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
  bool stalled_ = false;  // wait_arrivals' last return found nothing new released
  std::chrono::steady_clock::time_point stalled_since_;
  // Per receive: its message (none: cut before it came), and the offsets of the packets it lost.
  std::vector<std::shared_ptr<SimNetwork::Body>> bodies_;
  std::vector<std::vector<size_t>> lost_;
  std::vector<RecvOp> outcome_;
  std::vector<uint64_t> clean_;
  std::vector<Held> sends_;
};

inline std::unique_ptr<Exchange> SimNetwork::endpoint(int rank) {
  return std::make_unique<SimExchange>(this, rank);
}

}  // namespace optireduce::coll::test
