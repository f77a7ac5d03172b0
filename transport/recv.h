// The receiving side of a connection. irecv posts a buffer and sends a clear-to-send (CTS) for
// its sequence; DATA is placed by offset after every bounds check, duplicates and stale
// packets are counted and dropped, and SACKs go back once per received burst (bounded messages
// too: the sender's congestion window and its repair of early losses need them). Exact mode:
// done when every packet arrived. Bounded mode: done when every packet arrived, when the deadline
// passes, when the early timeout after the tail packets passes, or at once when the sender
// says it expired; missing bytes are then filled (zeros or the erasure marker) and counted, and a
// FINAL tells the sender to stop.
//
// Message slot states. The legal edges, the only ones set_msg_state_locked() accepts:
//   Free     -> Posted    irecv
//   Posted   -> Complete  every packet arrived, or (bounded) the deadline, the early timeout,
//                         the sender's expiry notice or its departure ended it (a receive
//                         posted MsgDelivery::kUntilStarted: the deadline only before its first
//                         DATA, then only the fallback bound against a sender that went silent)
//   Complete -> Free      test() reported it
// Meanings:
//   Free      unused
//   Posted    irecv called, CTS sent; DATA accepted while here
//   Complete  buffer final; test() reports it and frees the slot. DATA for it is stale.
#pragma once

#include <memory>

#include "transport/conn.h"
#include "transport/credit.h"
#include "transport/rtt.h"
#include "transport/sack.h"

namespace optireduce {

class DeadlinePolicy;

class RecvConn final : public Conn, public RecvComm {
 public:
  RecvConn(const Config& cfg, const Clock& clock, std::unique_ptr<Endpoint> ep,
           const ConnParams& p, std::shared_ptr<Registry> registry);
  ~RecvConn() override;

  using RecvComm::irecv;
  Status irecv(void* data, size_t capacity, MsgDelivery how, const MemoryRegion* mr,
               Request** req) override;
  Status test(Request* req, bool* done, size_t* size) override {
    return test_request(req, done, size);
  }
  uint64_t arrived_prefix(Request* req) override;
  ConnStats stats() const override { return stats_snapshot(); }
  Delivery delivery() const override;

  enum class State : uint8_t { kFree, kPosted, kComplete };
  // The edges listed above; anything else is a bug that fails the connection.
  static bool legal_transition(State from, State to);

  // Bounded mode: where deadlines come from. Null = a fixed budget from OPTIREDUCE_TIMEOUT_MS
  // (or 1 s when that is 0). Not owned; must outlive the connection.
  void set_deadline_policy(DeadlinePolicy* policy);

  // Bounded mode: the downlink whose credit this connection's senders share (credit.h). Null:
  // no credit, the sender's path window alone limits it. Set before the first irecv.
  void set_downlink(std::shared_ptr<Downlink> downlink);

  // Repeats HELLO_ACK when the sender's HELLO is repeated (its first answer was lost).
  void set_hello_ack(const uint8_t* body);

 private:
  enum class End : uint8_t { kAll, kDeadline, kEarly, kExpired };
  struct Msg {
    Request req;
    State state = State::kFree;
    bool bounded = false;
    bool exact = false;     // pinned exact on a bounded connection (MsgDelivery::kExact)
    // Bounded until its sender starts (MsgDelivery::kUntilStarted), and whole() once it did:
    // from its first DATA on no deadline or early timeout cuts it (only the fallback bound).
    bool until_started = false;
    bool started = false;   // first DATA seen: size and packet count known
    bool tail_seen = false; // a tail-flagged packet arrived (bounded early timeout)
    uint8_t* buf = nullptr;
    uint64_t capacity = 0;
    // Receiving into place (Endpoint::aim_open): the steer its CTS names, 0 for none; closed
    // (aim_close) before the buffer is final, so that no posted work request writes into it
    // once the caller has it back.
    uint32_t steer = 0;
    // Its place stopped reaching it in mid-receive and it asked its sender again with steer 0
    // (resteer_locked): that CTS is repeated, as a first one is, until DATA follows it.
    bool resteered = false;
    uint64_t size = 0;
    uint32_t npkts = 0;
    uint32_t cum = 0;  // packets below it have all arrived
    uint32_t high = 0; // one past the highest packet that arrived
    PacketBitmap got;
    // Packets that came first as a retransmission: a later copy of one is the network's (a
    // duplicated datagram), not a retransmission the sender did not need (needless_retx).
    PacketBitmap by_retx;
    uint64_t bytes_got = 0;
    uint64_t posted_ns = 0;
    uint64_t cts_ns = 0;        // last CTS sent
    uint64_t first_cts_ns = 0;  // first CTS sent (the downlink's RTT sample starts here)
    uint64_t cts_backoff_ns = 0;
    uint64_t cts_bytes = 0;     // bytes_got when the last CTS left
    uint64_t head_ns = 0;       // became the oldest incomplete message (bounded clock starts)
    uint64_t first_data_ns = 0; // the sender's first packet arrived (0: not yet)
    uint64_t last_byte_ns = 0;  // a new payload last arrived (aimed receives' stall check)
    bool pipelined = false;     // data had already arrived by then (see StepReport)
    bool burst_head = false;    // it started a burst when posted (starts_burst, StepReport)
    uint64_t deadline_ns = 0;   // 0 = not yet armed
    uint64_t early_ns = 0;      // early-timeout instant, once the tail arrived
    uint32_t pkts_since_ack = 0;
    bool dup_seen = false;  // a retransmission of a packet held here came since the last ACK

    bool whole() const { return until_started && first_data_ns != 0; }
  };

  int rx_guesses(RxGuesses* out) override;
  void on_packet_locked(const PacketHeader& h, const uint8_t* payload, uint64_t now) override;
  bool waiting_on_peer_locked() const override;
  void on_peer_closed_locked(uint32_t floor, uint64_t now) override;
  void after_rx_burst_locked(uint64_t now) override;
  void on_timers_locked(uint64_t now) override;
  void transmit_locked(uint64_t) override {}
  Status test_locked(Request* req, bool* done, size_t* size, uint64_t now) override;

  void on_data_locked(const PacketHeader& h, const uint8_t* payload, uint64_t now);
  void send_cts_locked(Msg& m, uint64_t now);
  void send_ack_locked(Msg& m, bool final_ack);
  // An ACK's hold_ns (wire.h): from the newest DATA's arrival at this host to now.
  uint32_t hold_ns_locked() const;
  // dup: answers a packet of a message complete here (kFlagDup).
  void send_final_for_locked(uint32_t seq, bool bounded, bool dup = false);
  // A retransmitted packet of message `seq` at `offset` arrived that was here already: true
  // when the sender did not need to send it (what is held came as an original, or the message
  // is no longer known here), false when the copy held came as a retransmission too.
  bool needless_retx_locked(uint32_t seq, uint64_t offset);
  // The floor as it stands once the messages completed so far are counted: what a FINAL
  // carries, sent between a completion and the floor's advance (advance_floor_locked).
  uint32_t settled_floor_locked() const;
  void complete_locked(Msg& m, End how, uint64_t now);
  // Receiving into place: opened for a receive large enough to pay (the datapath decides the
  // rest), closed when the receive ends and for every receive still open when the connection
  // goes. unaim_locked: true once the datapath writes into the buffer no more (at once with
  // `wait`); false while it is still taking its requests back, and test() asks again.
  void aim_locked(Msg& m, const MemoryRegion* mr);
  bool unaim_locked(Msg& m, bool wait);
  // An aimed receive, on each timer pass. Once the datapath says a place it gave may have
  // stopped reaching its receive (aim_moves, `moved`), a receive it no longer reaches closes it
  // and asks its sender again with steer 0, so that the DATA still to come (and the repairs of
  // those sent to the lost place) come the common way. Without this an exact receive would wait
  // for ever on a peer that answers every PING. The same for a receive that took no byte for
  // kAimStallRtoMax * OPTIREDUCE_RTO_MAX_US while its sender was alive: its sender resends at
  // least that often, so its place is not taking what comes (a datapath defect, logged), and
  // the common way still works. False while the datapath is still taking the lost place's
  // requests back (asked again on the next pass).
  bool check_aim_locked(Msg& m, bool moved, uint64_t now);
  // Closes a receive's aim and asks its sender again with steer 0 (false: the datapath is
  // still taking its requests back; asked again on the next pass).
  bool resteer_locked(Msg& m, uint64_t now);
  uint64_t aim_stall_ns() const;
  uint64_t aim_moves_seen_ = 0;
  void fill_holes_locked(Msg& m);
  void advance_floor_locked(uint64_t now);
  void arm_deadline_locked(Msg& m, uint64_t now);
  bool expiry_allowed_locked(const Msg& m) const;
  // The sender expired a receive pinned exact: its bytes never come, so the connection fails.
  void fail_expired_pinned_locked();
  uint16_t credit_locked(const Msg& m, bool first) const;
  // A bounded receive's budget: the policy's, else OPTIREDUCE_TIMEOUT_MS, else 1 s.
  uint64_t budget_locked(uint64_t bytes) const;
  // How long a bounded receive waits for a sender that has not started (DeadlinePolicy).
  uint64_t start_allowance_locked(uint64_t bytes) const;
  // How long a bounded receive whose sender started may take from then: its budget, or the
  // fallback bound once it is whole.
  uint64_t started_budget_locked(const Msg& m) const;
  // When a CTS is first repeated: from the RTT this receiver measured (rtt_), or a
  // conservative figure before it measured any (recv_deadline.cc).
  uint64_t cts_resend_ns_locked() const;
  uint64_t next_timer_locked() const override;
  bool set_msg_state_locked(Msg& m, State to, uint64_t now);
  Msg& slot(uint32_t seq) { return msgs_[seq % kMaxRequests]; }
  const Msg& slot(uint32_t seq) const { return msgs_[seq % kMaxRequests]; }

  uint64_t last_data_arrival_ns_ = 0;  // the newest DATA's rx_arrival_ns_
  uint64_t last_complete_ns_ = 0;      // when a receive last completed (0: never)
  // The last receive to complete held as many bytes as it had room for (aim_locked).
  bool last_filled_ = true;
  // When a bounded receive was last cut without its sender ever starting it (0: never). Until
  // DATA arrives again, the sender is absent from this burst: a straggler, or a peer whose data
  // never comes.
  uint64_t sender_cut_ns_ = 0;
  bool sender_absent_locked() const {
    return sender_cut_ns_ != 0 && last_data_arrival_ns_ <= sender_cut_ns_;
  }
  // Receives that began a burst and were cut at their deadline before their sender started:
  // the policy counted each as a skew of exactly its wait (a lower bound), and the sender's
  // first packet of it after the cut tells how late it really was
  // (DeadlinePolicy::on_late_sender). A few suffice: a step has one burst per connection (a
  // phase of TAR, or NCCL's dozens of chunks), and a sender shows up before this side is
  // many steps further.
  struct CutUnstarted {
    uint32_t seq = 0;
    uint64_t start_ns = 0;    // the receive became the oldest
    uint64_t counted_ns = 0;  // the wait reported (StepReport::elapsed_ns)
    bool valid = false;
  };
  static constexpr int kCutRecords = 4;
  CutUnstarted cut_[kCutRecords];
  uint32_t ncut_ = 0;
  // A packet of message `seq` arrived after this side ended it: tells the policy how late its
  // sender was if the receive was cut before it started.
  void on_late_sign_locked(uint32_t seq);
  Msg msgs_[kMaxRequests];
  uint32_t next_seq_ = 0;   // sequence of the next irecv
  uint32_t floor_ = 0;      // every message below it is complete
  uint32_t oldest_ = 0;     // oldest sequence not yet reported done
  uint32_t dirty_ = 0;      // bit k: slot k received DATA since its last ACK
  uint64_t expired_mask_ = 0;   // bit (seq % 64): the sender said seq expired before we posted it
  uint32_t expired_base_ = 0;   // expired_mask_ is valid for seq in [expired_base_, +64)
  DeadlinePolicy* policy_ = nullptr;
  std::shared_ptr<Downlink> downlink_;
  uint32_t bounded_posted_ = 0;  // bounded receives posted and not complete (joined if > 0)
  uint64_t burst_bytes_ = 0;     // DATA bytes accepted in the current received burst
  bool have_hello_ack_ = false;
  uint8_t hello_ack_[kHelloBodyBytes] = {};
  // The RTT as this side sees it: CTS to the first DATA it unlocked, which only overstates it.
  MinRttFilter rtt_;
  // The last completed message whose late bounded DATA was answered with a FINAL.
  bool answered_late_ = false;
  uint32_t answered_seq_ = 0;
};

}  // namespace optireduce
