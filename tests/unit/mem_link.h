// An in-memory datagram link for protocol tests: two endpoints joined by bounded queues, with a
// scriptable loss/duplication/reordering hook, so connections can be driven deterministically
// with a FakeClock and no sockets.
#pragma once

#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "transport/clock.h"
#include "transport/datapath.h"
#include "transport/wire.h"

namespace optireduce::testing {

struct MemQueue {
  std::deque<std::vector<uint8_t>> q;  // arrived: the next rx_burst reads these
  size_t cap = 4096;  // datagrams; beyond it tx_burst takes fewer (like a full socket buffer)
  // One-way delay: with a clock, a datagram sent at t joins q once the clock reaches
  // t + delay_ns (a network of that latency; an RTT of twice it). Without one, at once.
  const Clock* clock = nullptr;
  uint64_t delay_ns = 0;
  std::deque<std::pair<uint64_t, std::vector<uint8_t>>> wire;  // (arrival time, datagram)
  // With a clock, when each datagram of q arrived, so that rx_burst reports its age as a
  // socket's timestamp would (RxPacket::age_ns). A test that fills q by hand leaves this
  // behind q, and its datagrams then have no age.
  std::deque<uint64_t> arrived_ns;

  // extra_ns: this datagram's own delay beyond the link's (reordering: later datagrams
  // overtake it), kept in arrival order on the wire.
  void push(std::vector<uint8_t> d, uint64_t extra_ns = 0) {
    if (clock == nullptr || delay_ns + extra_ns == 0) {
      q.push_back(std::move(d));
      if (clock != nullptr) arrived_ns.push_back(clock->now_ns());
      return;
    }
    const uint64_t at = clock->now_ns() + delay_ns + extra_ns;
    auto pos = wire.end();
    while (pos != wire.begin() && std::prev(pos)->first > at) --pos;
    wire.emplace(pos, at, std::move(d));
  }
  // Moves what has arrived by now from the wire into q.
  void arrive() {
    while (!wire.empty() && clock->now_ns() >= wire.front().first) {
      q.push_back(std::move(wire.front().second));
      arrived_ns.push_back(wire.front().first);
      wire.pop_front();
    }
  }
  size_t size() const { return q.size() + wire.size(); }
};

// decide(datagram) -> number of copies to deliver (0 = drop, 2 = duplicate).
using LinkPolicy = std::function<int(const std::vector<uint8_t>&)>;

// Policies that drop by header, so that tests say what they lose instead of each decoding
// datagrams in a lambda of its own. Undecodable datagrams always pass.
template <typename Pred>
LinkPolicy drop_where(Pred pred) {
  return [pred](const std::vector<uint8_t>& d) {
    PacketHeader h;
    if (decode(d.data(), d.size(), &h) != DecodeError::kNone) return 1;
    return pred(h) ? 0 : 1;
  };
}
// Every datagram of `type`, while *on holds (null: always).
inline LinkPolicy drop_type(PacketType type, const bool* on = nullptr) {
  return drop_where(
      [type, on](const PacketHeader& h) { return h.type == type && (on == nullptr || *on); });
}
// The first `n` datagrams that pred matches, then nothing; *dropped (if given) counts them.
template <typename Pred>
LinkPolicy drop_first(Pred pred, int n, int* dropped = nullptr) {
  auto left = std::make_shared<int>(n);
  return drop_where([pred, left, dropped](const PacketHeader& h) {
    if (*left == 0 || !pred(h)) return false;
    --*left;
    if (dropped != nullptr) ++*dropped;
    return true;
  });
}

class MemEndpoint final : public Endpoint {
 public:
  MemEndpoint(std::shared_ptr<MemQueue> tx, std::shared_ptr<MemQueue> rx, uint8_t id,
              uint32_t max_dgram)
      : tx_(std::move(tx)), rx_(std::move(rx)), max_(max_dgram) {
    local_.kind = 9;
    local_.len = 1;
    local_.data[0] = id;
  }
  const PeerAddress& local_address() const override { return local_; }
  Status set_peer(const PeerAddress&) override { return Status::ok(); }
  int tx_burst(const TxPacket* pkts, int n) override {
    if (n > 0) ++counters_.tx_syscalls;  // one call: one sendmmsg on UDP, one post on verbs
    int taken = 0;
    for (; taken < n; ++taken) {
      if (tx_->size() >= tx_->cap) break;
      std::vector<uint8_t> d(pkts[taken].hdr_len + pkts[taken].payload_len);
      std::memcpy(d.data(), pkts[taken].hdr, pkts[taken].hdr_len);
      if (pkts[taken].payload_len)
        std::memcpy(d.data() + pkts[taken].hdr_len, pkts[taken].payload, pkts[taken].payload_len);
      const int copies = policy ? policy(d) : 1;
      const uint64_t extra = copies > 0 && late ? late(d) : 0;
      for (int c = 0; c < copies; ++c) tx_->push(d, extra);
      ++counters_.tx_datagrams;
    }
    return taken;
  }
  // What the receiving connection expected before its last receive (RxGuesses), as a datapath
  // that places payloads would be told; this one places nothing.
  RxGuesses guesses;
  int rx_into(RxHandler& own, int max) override {
    own.rx_guesses(&guesses);
    return Endpoint::rx_into(own, max);
  }
  int rx_burst(RxPacket* pkts, int max) override {
    if (rx_->clock != nullptr) rx_->arrive();
    held_.clear();
    const bool stamped = rx_->clock != nullptr && rx_->arrived_ns.size() == rx_->q.size();
    if (!stamped) rx_->arrived_ns.clear();
    int n = 0;
    while (n < max && !rx_->q.empty()) {
      held_.push_back(std::move(rx_->q.front()));
      rx_->q.pop_front();
      pkts[n].age_ns = 0;
      if (stamped) {
        pkts[n].age_ns = rx_->clock->now_ns() - rx_->arrived_ns.front();
        rx_->arrived_ns.pop_front();
      }
      ++n;
    }
    for (int i = 0; i < n; ++i) {
      pkts[i].data = held_[i].data();
      pkts[i].len = static_cast<uint32_t>(held_[i].size());
      pkts[i].from = PeerAddress();
    }
    counters_.rx_datagrams += n;
    return n;
  }
  uint32_t max_datagram_bytes() const override { return max_; }
  const DatapathCounters& counters() const override { return counters_; }
  // The queue this endpoint reads holds `cap` datagrams; the sender's tx_burst stops there, so
  // nothing is dropped for want of room below that many full-size ones.
  uint64_t receive_buffer_bytes() const override { return uint64_t{rx_->cap} * max_; }

  // What a host's ICMP "port unreachable" does to a UDP socket: counted by the datapath.
  void report_unreachable(uint64_t n) { counters_.peer_unreachable += n; }

  LinkPolicy policy;  // applied to what this endpoint sends
  // What this endpoint sends: nanoseconds a datagram arrives after the link's delay (0: none).
  // Needs the pair's clock and one-way delay.
  std::function<uint64_t(const std::vector<uint8_t>&)> late;

 private:
  std::shared_ptr<MemQueue> tx_, rx_;
  uint32_t max_;
  PeerAddress local_;
  DatapathCounters counters_;
  std::vector<std::vector<uint8_t>> held_;
};

struct MemPair {
  std::unique_ptr<MemEndpoint> a, b;
  std::shared_ptr<MemQueue> ab, ba;
};

// `clock` and `one_way_ns`: a link of that latency each way (see MemQueue).
inline MemPair make_mem_pair(uint32_t max_dgram = 1048, const Clock* clock = nullptr,
                             uint64_t one_way_ns = 0) {
  MemPair p;
  p.ab = std::make_shared<MemQueue>();
  p.ba = std::make_shared<MemQueue>();
  for (auto* q : {p.ab.get(), p.ba.get()}) {
    q->clock = clock;
    q->delay_ns = one_way_ns;
  }
  p.a = std::make_unique<MemEndpoint>(p.ab, p.ba, 1, max_dgram);
  p.b = std::make_unique<MemEndpoint>(p.ba, p.ab, 2, max_dgram);
  return p;
}

}  // namespace optireduce::testing
