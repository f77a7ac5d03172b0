// A receive lane: a UD queue pair of its own, lent to one receive at a time, whose receive work
// requests point packet by packet into that receive's buffer (Endpoint::aim_open). The
// receiver's CTS names the lane's QPN, the sender posts the message's DATA to it, and the
// device writes each payload where it belongs: no copy out of a ring.
//
// Why a lane and not the endpoint's shared queue pair: a UD receive request is posted ahead and
// the device fills requests in the order they were posted, whatever datagram comes. On the
// shared QP every connection's datagrams interleave, so no request could be aimed. On a lane
// only one message's DATA arrive, in the order they were sent, so request k takes packet k
// unless something was lost, duplicated or misdirected on the way.
//
// What keeps it exact when a request takes the wrong datagram (a miss):
//  - every completion is checked against the aim (token, message, offset, length); a hit is
//    handed out in place (RxPacket::aimed), a miss is copied out of the place it landed in
//    into a stage buffer and handed out from there, as any datagram;
//  - until a miss the lane posts one request per packet it still expects and no more, so a
//    plain request of the receive (an idle lane's leftover, the partial last packet's) is
//    checked too, against the packet it was posted for: a request taken by anything else (a
//    retransmission that crossed its ACK, a straggler, a runt) is a miss, after which plain
//    requests stay posted; otherwise the packet it was meant for, and every repair of it,
//    would find none and be dropped by the device for ever;
//  - a place is written by the connection's copy only once no request is posted into it: a
//    packet of the receive that came early (a loss ahead of it) waits in its stage buffer until
//    its own place's request completes, which the lane's next datagram brings (the lost
//    packet's repair at the latest); one that came late, and another's datagram, go at once;
//  - the endpoint drops DATA that arrives elsewhere (the shared QP) for a place a request here
//    still owns (owns()). A packet's first retransmission comes that way
//    (SendConn::name_payload): often a guess, mostly wrong on a host that pauses, that here
//    would shift the rest of the message one request off; its later ones come here;
//  - stop() has the QP flushed in place when an aimed request is still posted (error state,
//    every request back, reset, RTS): once it says so the device writes into the buffer no
//    more, so the receive may end and the caller reuse it, and the QPN stays, so the ended
//    receive's stragglers still reach the lane (and the FINAL their sender missed is
//    answered). Not a plain reset: rxe (Linux 6.1) keeps a reset QP's posted receive slots in
//    its queue, zeroed, and the next datagrams fall into them. Recreating the QP is the
//    fallback only: its new QPN strands those stragglers. The flush's five QP state changes are
//    firmware commands on a NIC, so it runs on the endpoint's worker thread (LaneFlusher,
//    lane_worker.h); stop() does not wait for it unless told to: the receive asks again
//    (Endpoint::aim_close) until it is done.
//
// States (LaneState, each move checked): Idle -> Lent (start) -> Idle when stop() finds no
// aimed request posted, else Draining (the flush under way, the QP and CQ the flusher's) ->
// Idle when its receive asks again after the flush. A flushed lane waits for that question
// rather than going idle by itself: lent again meanwhile under the same QPN, it would answer
// the old receive's question as if it were the new one's.
// Lent -> Recovering when an error completion (a datagram larger than its request, which no
// peer of ours sends) has put the QP in the error state in mid-receive: the posted requests
// come back flushed, then the flusher resets the QP and brings it back to RTS under the same
// QPN (resetting_: the QP is the flusher's meanwhile), and the lane is Lent again with plain
// requests only, so the receive's sender, which keeps sending to that QPN, still reaches it.
// Where the reset fails, or the requests never come back, the QP is recreated after all: its
// new QPN strands the sender, and the lane says so (take_moved, Endpoint::aim_moves) so that
// the receive moves its sender off the lane with a CTS of steer 0 (RecvConn::check_aim_locked).
// Recovering -> Draining when the receive ends meanwhile.
// A place that took a wrong datagram holds foreign bytes until its own packet (or the bounded
// receive's hole fill) overwrites it, as a wrong UDP guess would (endpoint_mux.h). After a loss
// the rest of the message lands one request off and is copied: misses cost copies, never
// exactness. So after the first miss no further request is aimed: one aimed later at a place
// whose packet had overtaken the requests and been copied could take another datagram there.
//
// Requests are posted in order: the few plain slots an idle lane keeps for stragglers, aimed
// ones for the receive's packets from there up to capacity/pkt_payload, one plain slot for a
// partial last packet, then, only once something missed, plain slots for what else comes.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "transport/datapath.h"
#include "verbs/device.h"

namespace optireduce::verbs {

// Fills RxPacket::from for a completion, or says the datagram is to be dropped (a bound
// endpoint hears its peer only). Implemented by the endpoint that owns the lanes.
class SourceCheck {
 public:
  virtual bool fill_source(const ibv_wc& wc, const uint8_t* grh, RxPacket* pkt) = 0;

 protected:
  ~SourceCheck() = default;
};

// A lane's flush as a job for another thread (AimLane::flush_now).
class Flushable {
 public:
  virtual void flush_now() = 0;

 protected:
  ~Flushable() = default;
};

// Runs a lane's flush away from the caller's thread. submit() false: it cannot, and the lane
// flushes on the caller's thread.
class LaneFlusher {
 public:
  virtual bool submit(Flushable* lane) = 0;

 protected:
  ~LaneFlusher() = default;
};

struct LaneCounters {
  uint64_t placed = 0;     // DATA that arrived in their place
  uint64_t missed = 0;     // requests that took another datagram than the one they were
                           // posted for (once a receive missed, only aimed ones are checked)
  uint64_t waited = 0;     // of the misses, held until their own place's request completed
  uint64_t flushed = 0;    // QPs flushed and reset in place (the QPN kept)
  uint64_t flushed_inline = 0;  // of the flushes, run on the caller's thread (no worker thread)
  uint64_t recovered = 0;  // QPs reset in place after an error completion in mid-receive
  uint64_t recreated = 0;  // QPs recreated (a flush or a reset that failed, an idle lane's error)
  uint64_t dropped = 0;    // no stage buffer free, a foreign source, a short completion
  uint64_t stale = 0;      // completions of requests a reset discarded
  uint64_t errors = 0;     // error completions
};

class AimLane final : public Flushable {
 public:
  // The device writes the GRH and our header into a small slot per request, the payload into
  // the place (a second gather entry).
  static constexpr uint32_t kHdrSge = kGrhBytes + 48;
  static constexpr uint32_t kHdrStride = 128;
  // Slots for datagrams that are not aimed (a partial last packet, what comes after a miss),
  // and stage buffers for misses. Both are needed rarely; a miss beyond the stage is dropped
  // and repaired by the protocol like a loss.
  static constexpr uint32_t kPlainSlots = 128;
  static constexpr uint32_t kStageSlots = 32;
  // Requests handed out by one poll at most (the transport's burst): their header slots are
  // read by the caller until the next poll, so the ring keeps this many unposted.
  static constexpr uint32_t kHandout = 32;
  // Plain slots an idle lane keeps posted to catch its last receive's stragglers; the next
  // receive's first packets land in them, copied.
  static constexpr uint32_t kIdlePlain = 4;
  // Polls in a row that bring back none of the requests an error (Recovering) completes before
  // the lane gives up on them and recreates its QP; and how long a flush waits for them.
  static constexpr int kMaxEmptyPolls = 200000;
  static constexpr std::chrono::milliseconds kFlushWait{1000};

  // `depth`: receive requests (a power of two, at least 4 * kHandout), as many as the
  // endpoint's own ring so that a sender's window never outruns the lane. `send_cq`: the
  // endpoint's (a lane sends nothing, but a QP needs one).
  // `stop_clock`: the endpoint's count of stops, which the lane advances (stopped_tick()).
  // `flusher`: where stop() sends the flush (null: the caller's thread).
  static Status open(PortContext* port, ibv_cq* send_cq, uint32_t depth, uint32_t max_datagram,
                     uint64_t* stop_clock, LaneFlusher* flusher, std::unique_ptr<AimLane>* out);
  ~AimLane();
  AimLane(const AimLane&) = delete;
  AimLane& operator=(const AimLane&) = delete;

  enum class LaneState : uint8_t { kIdle, kLent, kRecovering, kDraining };

  // 0 for a lane whose QP could not be recreated: never lent again.
  uint32_t qpn() const { return qp_ != nullptr ? qp_->qp_num : 0; }
  bool usable() const { return qp_ != nullptr; }
  // Lent to a receive that has not ended (its QP may be recovering from an error).
  bool active() const { return state_ == LaneState::kLent || state_ == LaneState::kRecovering; }
  // The steer this lane was last lent under: the receive names it at its close even if the QP
  // had to be recreated under another QPN meanwhile.
  bool lent_as(uint32_t steer) const { return busy() && lent_qpn_ == steer; }
  // Lent, or not yet given back by the receive it was lent to: not to be lent.
  bool busy() const { return state_ != LaneState::kIdle; }
  // Its state in words, for a receive's warning that nothing arrived in place.
  std::string text() const;
  // When the lane last stopped, in its endpoint's count of stops: the endpoint lends the lane
  // idle longest, so that the stragglers of its last receive (a retransmission that crossed
  // the final ACK) find no request posted and are dropped by the device, instead of taking the
  // next receive's first request and shifting every packet after it by one.
  uint64_t stopped_tick() const { return stopped_tick_; }

  // Lends the lane to a receive: `lkey` is the registration of [t.base, t.base + t.capacity).
  void start(const AimTarget& t, uint32_t lkey);
  // The receive ended, or asks again: true once the device writes into its buffer no more
  // (the lane is then idle); false while its flush is under way. `wait`: until it is done (a
  // connection that closes).
  bool stop(bool wait);
  // The flush stop() asked for: the QP to the error state, every posted request back, reset,
  // RTS (or, failing that or past kFlushWait, a new QP). Runs on the flusher's thread; the
  // lane is the flusher's alone until it is done.
  void flush_now() override;
  // Up to `max` datagrams: reposts what the last call handed out, then takes completions.
  int poll(RxPacket* out, int max, SourceCheck& src);
  // DATA of this lane's receive whose place a request owns, posted or still to be posted: it
  // must not be copied there now (it came another way: the endpoint's shared QP).
  bool owns(uint64_t token, uint32_t msg_seq, uint64_t offset) const;

  const LaneCounters& counters() const { return counters_; }
  // Whether the QP was recreated in mid-receive since the last call: the receive's sender
  // still sends to lent_qpn_, which no longer exists, until the receive tells it otherwise
  // (Endpoint::aim_moves). Recovery resets in place to avoid this; recreating is its fallback.
  bool take_moved() { return std::exchange(moved_, false); }

 private:
  struct Entry {
    bool aimed = false;
    uint64_t index = 0;  // aimed: the packet; plain: the plain slot's sequence
  };
  struct Held {
    int stage = -1;
    uint64_t wait_seq = 0;  // the request whose completion frees the datagram's place
    bool due = false;       // that request completed
    RxPacket pkt;
  };
  AimLane(PortContext* port, uint32_t depth, uint32_t max_datagram, uint64_t* stop_clock,
          LaneFlusher* flusher)
      : port_(port),
        ibv_(&port->ibv()),
        depth_(depth),
        max_datagram_(max_datagram),
        stop_clock_(stop_clock),
        flusher_(flusher) {}
  Status create(ibv_cq* send_cq);
  Status make_qp();
  void recreate(LaneCounters& c);  // counted in `c`
  bool move_to(LaneState to);  // false, and logged, for a move the states above do not allow
  // Draining: once the flush is done (or, with `wait`, after waiting for it), takes its
  // counts and goes idle; false while it is under way.
  bool finish_drain(bool wait);
  void finish_stop();  // Draining or Lent -> Idle
  // The flush, `left` requests still to come back, on the flusher's thread (or this one's, if
  // it cannot take it); flush_done_ says when it is done.
  void hand_to_flusher(uint64_t left);
  // A finished flush's counts into counters_, its in-place resets as `in_place`.
  void take_flush_counts(uint64_t LaneCounters::*in_place);
  // An error completion in mid-receive: the QP is in the error state (Lent -> Recovering).
  void begin_recovery();
  // Recovering and every request back: the reset and RTS, under the same QPN, handed to the
  // flusher (resetting_); end_recovery takes the result and lends the lane again.
  void start_reset();
  void end_recovery();
  Status bring_up();
  void top_up();
  // One completion: hands out its datagram (unless it must wait) and any datagram that waited
  // for it; returns how many (0 to 2).
  int take(const ibv_wc& wc, RxPacket* out, SourceCheck& src);
  int take_one(const ibv_wc& wc, const Entry& e, uint64_t seq, RxPacket* out, SourceCheck& src);
  int emit_due(RxPacket* out, int max);
  // A whole datagram (`st`: the stage buffer it is in, or -1 for a plain slot): out[0] now, or
  // held until its place is free; returns how many went out (0 or 1).
  int hand_out(RxPacket p, int st, RxPacket* out);
  // A request of the receive took something other than the packet it was posted for.
  void note_miss();
  // Whether the datagram in request `seq` is the packet that request was posted for (true
  // once something missed: from then on nothing is expected anywhere in particular).
  bool expected_in(uint64_t seq, const uint8_t* dgram, uint32_t len) const;
  int alloc_stage();
  uint8_t* hdr_slot(uint64_t seq) const {
    return hdr_mem_ + size_t(seq & (depth_ - 1)) * kHdrStride;
  }
  uint8_t* plain_slot(uint64_t pseq) const {
    return plain_mem_ + size_t(pseq & (kPlainSlots - 1)) * plain_stride_;
  }
  uint8_t* stage(int i) const { return stage_mem_ + size_t(i) * max_datagram_; }
  // The aimed request of packet q is posted and not completed.
  bool aimed_posted(uint64_t q) const {
    return q >= aim_from_ && q < next_aim_ && first_seq_ + q >= done_;
  }

  PortContext* port_;
  const IbvSymbols* ibv_;
  const uint32_t depth_;
  const uint32_t max_datagram_;
  uint64_t* const stop_clock_;
  LaneFlusher* const flusher_;
  uint64_t stopped_tick_ = 0;
  uint32_t plain_stride_ = 0;
  ibv_cq* cq_ = nullptr;
  ibv_cq* send_cq_ = nullptr;  // the endpoint's
  ibv_qp* qp_ = nullptr;
  uint8_t* hdr_mem_ = nullptr;    // depth_ header slots
  uint8_t* plain_mem_ = nullptr;  // kPlainSlots slots of plain_stride_
  uint8_t* stage_mem_ = nullptr;  // kStageSlots stage buffers of max_datagram_ (not registered)
  ibv_mr* hdr_mr_ = nullptr;
  ibv_mr* plain_mr_ = nullptr;
  std::unique_ptr<Entry[]> entries_;   // per request, by its sequence
  std::unique_ptr<ibv_recv_wr[]> wr_;  // per request slot
  std::unique_ptr<ibv_sge[]> sge_;     // two per request slot

  // Requests, free-running: [done_, posted_) are posted. wr_id is the sequence.
  uint64_t posted_ = 0;
  uint64_t done_ = 0;
  uint64_t pposted_ = 0;  // plain slots, free-running, the same way
  uint64_t pdone_ = 0;

  LaneState state_ = LaneState::kIdle;
  // Draining: the flush's, until flush_done_ says it is done.
  uint64_t drain_left_ = 0;    // requests not yet back
  LaneCounters flush_counts_;  // stale, flushed, recreated: added to counters_ afterwards
  std::atomic<bool> flush_done_{false};
  // The receive the lane is lent to.
  AimTarget t_{};
  uint32_t lkey_ = 0;
  uint32_t lent_qpn_ = 0;   // qpn() when start() lent the lane
  uint64_t first_seq_ = 0;  // packet q's request is first_seq_ + q until a miss
  uint64_t aim_from_ = 0;   // the first packet aimed (those below land in idle plain slots)
  uint64_t nfull_ = 0;      // packets aimed at most: those the buffer holds whole, until a miss
  uint64_t next_aim_ = 0;   // the next packet to aim a request at
  bool tail_pending_ = false;  // a plain request for the partial last packet is still to post
  bool missed_ = false;        // something missed: keep plain requests posted after the aimed
  uint64_t aimed_out_ = 0;     // aimed requests posted and not completed

  Held held_[kStageSlots];
  int held_n_ = 0;
  bool stage_used_[kStageSlots] = {};
  int handed_[kStageSlots];  // stage buffers handed out by the last poll, freed by the next
  int handed_n_ = 0;
  bool error_seen_ = false;
  int recover_idle_ = 0;    // Recovering: polls in a row that brought back no request
  bool resetting_ = false;  // Recovering: the reset is the flusher's until flush_done_
  bool moved_ = false;      // recreated while lent (take_moved)
  LaneCounters counters_;
};

}  // namespace optireduce::verbs
