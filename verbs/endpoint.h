// The UD verbs endpoint: one Unreliable Datagram queue pair with its own completion queues, a
// receive ring registered once and kept posted, a send ring of registered slots, and address
// handles from the port's cache.
//
// Sends: a datagram whose payload lies in a registration of this port (TxPacket::payload_mr,
// the plugin's regMr) is posted as two SGEs, the header from its slot and the payload straight
// from the caller's buffer (zero copy); the packet's fence is held until the send completes, and
// a chain holding such a post ends signaled so that the completion comes. Small datagrams go
// inline, the others are copied into their slot.
//
// Design: the endpoint is used in one of two ways, both behind the same QP code.
//  - Bound (set_peer): the QP serves one connection, is serialised by that connection's lock
//    (datapath.h), sends with the peer's address handle and drops datagrams from anyone else
//    (a compare on the completion). Costs a QP, two CQs and the ring memory per connection.
//    OPTIREDUCE_SHARED_ENDPOINT=0 makes every connection work this way.
//  - Unbound (EndpointOptions::unbound): the one QP of a device and thread, shared by all of
//    its connections through transport/endpoint_mux.h, which serialises every call into it,
//    tells the connections' datagrams apart by the token in their headers, and drops those
//    whose `from` is not the connection's peer. Each send names its destination (tx_burst_to);
//    the endpoint keeps the address handle of the last one, so a burst costs no cache lookup
//    and the port's cache creates a host's AH once. The receive ring is as large as the endpoint
//    and the device allow (recv_ring_slots), as every connection's datagrams land in it.
//    What is shared is shared in full: the 256-slot send ring and the receive ring are first
//    come, first served between connections, and an error completion (a datagram too large for
//    a slot, from any peer) resets the QP and discards what every connection had posted. The
//    protocol recovers the lost datagrams like any other loss. There is no per-destination
//    error report (UD has no ICMP): a dead peer is found by the keepalive alone.
//
// Receives into NCCL's buffer (aim_open): a receive with a writable registration of this port
// borrows a receive lane (aim_lane.h), a UD QP of its own whose requests point into the buffer;
// the lanes share nothing with the QP above but the send CQ, and rx_burst polls them after it.
// DATA whose receiver named a lane (TxPacket::steer) is posted to the lane's QPN.
//
// A caller that blocks between two passes (transport/wait.cc, the host path) sleeps on a
// completion channel that both CQs report to. It is armed only when such a caller prepares
// (prepare_wait), so NCCL's polling raises no events (docs/architecture.md, "Progress").
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "transport/datapath.h"
#include "verbs/address.h"
#include "verbs/aim_lane.h"
#include "verbs/device.h"
#include "verbs/lane_worker.h"
#include "verbs/ring.h"

namespace optireduce::verbs {

// What the verbs datapath counts beyond DatapathCounters. There, tx_syscalls and rx_syscalls
// count ibv_post_send and ibv_post_recv calls (one doorbell per burst or chain), rx_truncated
// datagrams larger than the receive slot, rx_errors other error completions of either queue.
struct UdCounters {
  uint64_t rx_foreign = 0;    // from a QPN or GID other than the peer's: dropped
  uint64_t rx_no_source = 0;  // no peer set and no GRH to reply to: dropped
  uint64_t rx_stale = 0;      // completions of work requests discarded by a QP reset
  uint64_t qp_resets = 0;     // recoveries of the QP from the error state
  uint64_t tx_inline = 0;     // datagrams sent inline (copied by the post, not into the ring)
  uint64_t tx_errors = 0;     // send completions with an error status (also in rx_errors)
  uint64_t aims = 0;          // receives lent a lane (aim_open that returned a steer)
  uint64_t aims_declined = 0;    // aim_open without one: region unusable, every lane lent
  uint64_t rx_aim_conflict = 0;  // DATA on the shared QP for a place a lane still owns: dropped
  LaneCounters lanes;            // summed over the endpoint's lanes (aim_lane.h)
};

class UdEndpoint final : public Endpoint, private SourceCheck {
 public:
  // Send ring depth: the most datagrams in flight between the post and their completion. 256
  // MTU-sized slots (1 MiB at 4 KiB) keep a 100 Gbit/s port busy for ~80 us, longer than a
  // progress-thread pass, while the copy into a slot stays in the L2 cache.
  static constexpr uint32_t kSendSlots = 256;
  // One signaled send per 32: a completion per datagram would double the CQ traffic, and the
  // ring must hold two groups so posting never waits for the group just signaled.
  static constexpr uint32_t kSignalEvery = 32;
  // Receives are reposted in chains of at least 32: one doorbell per chain.
  static constexpr uint32_t kRecvSlack = 32;
  // Receive ring bounds. Below 256 slots a burst of MTU-sized datagrams overruns the ring
  // between two polls; 16384 is the smallest max_qp_wr among current providers (rxe).
  static constexpr uint32_t kMinRecvSlots = 256;
  static constexpr uint32_t kMaxRecvSlots = 16384;
  // Completions taken per ibv_poll_cq call: the caller's bursts are at most this size in the
  // transport, and the array lives in the endpoint.
  static constexpr int kPollBatch = 32;
  // Datagrams up to this size are posted inline (the post copies them; no ring slot copy and
  // no DMA read). 256 covers every control packet: the 48-byte header plus a 128-byte SACK
  // bitmap or a 16-byte hello.
  static constexpr uint32_t kInlineBytes = 256;
  // Receive lanes (aim_lane.h) an endpoint lends at most at once, opened one per receive until
  // there are this many (in the background, lane_worker.h: the receive that asks first is
  // copied), then lent idle longest first: as many as NCCL's proxy keeps receives in
  // flight per connection (8 slots), and with fewer in flight a lane rests for a few receives
  // before it is lent again, long enough for its last receive's stragglers. Each costs a QP and,
  // at kMaxLaneDepth, about 1.3 MiB of requests, header, plain and stage slots; a receive that
  // finds none free is copied as before.
  static constexpr int kMaxLanes = 8;
  static_assert(kMaxLanes <= LaneWorker::kMaxFlushes, "every lane's flush may be queued at once");
  // A lane's receive requests: the endpoint's ring depth up to this. Beyond, a sender whose
  // window holds more of one message than this in flight, unreceived, meets an empty queue:
  // those datagrams are lost and repaired, and land out of place.
  static constexpr uint32_t kMaxLaneDepth = 4096;

  static_assert(is_pow2(kSendSlots) && is_pow2(kMinRecvSlots) && is_pow2(kMaxRecvSlots));
  static_assert(kSendSlots >= 2 * kSignalEvery, "posting must not wait for a signaled group");
  static_assert(kRecvSlack * 4 <= kMinRecvSlots, "slack must be small against the ring");
  static_assert(kRecvSlack + kPollBatch < kMinRecvSlots, "the ring must keep slots posted");

  // Creates the QP and rings on `port` and posts every receive slot.
  static Status open(std::shared_ptr<PortContext> port, const EndpointOptions& opts,
                     std::unique_ptr<UdEndpoint>* out);
  ~UdEndpoint() override;
  UdEndpoint(const UdEndpoint&) = delete;
  UdEndpoint& operator=(const UdEndpoint&) = delete;

  const PeerAddress& local_address() const override { return local_; }
  Status set_peer(const PeerAddress& peer) override;
  std::string peer_text() const override { return has_peer_ ? format_address(peer_) : std::string(); }
  std::string peer_host() const override { return has_peer_ ? format_gid(peer_) : std::string(); }
  std::string address_text(const PeerAddress& a) const override { return format_peer_address(a); }
  std::string address_host(const PeerAddress& a) const override { return format_peer_gid(a); }
  int tx_burst(const TxPacket* pkts, int n) override;
  // Works bound or unbound, and leaves the peer (if any) alone. -EINVAL, changing nothing, when
  // `to` is not a UD address; a negative errno when the port cannot make its address handle.
  // take_unreachable is not overridden: UD has no ICMP, nothing reports a destination dead, so
  // it always returns 0 and peer_unreachable stays 0.
  int tx_burst_to(const PeerAddress& to, const TxPacket* pkts, int n) override;
  int rx_burst(RxPacket* pkts, int max) override;
  uint32_t max_datagram_bytes() const override { return max_datagram_; }
  const DatapathCounters& counters() const override { return counters_; }
  uint64_t receive_buffer_bytes() const override;
  // A lane for a receive whose buffer a writable registration of this port covers.
  uint32_t aim_open(const AimTarget& t) override;
  bool aim_close(uint32_t steer, bool wait) override;
  // Lanes recreated in mid-receive (AimLane::take_moved): their QPN, which the receive's CTS
  // named, is gone, and a steer is reachable only while its lane still has it.
  uint64_t aim_moves() const override { return aim_moves_.load(std::memory_order_relaxed); }
  bool aim_reachable(uint32_t steer) override;
  std::string aim_text(uint32_t steer) const override;
  // The completion channel's descriptor, for a caller that blocks until a datagram comes
  // (transport/wait.cc); -1 without a channel, or once a receive lane is open: a lane's
  // completions go to a CQ of its own, which no channel reports.
  int readable_fd() const override;
  // The channel's descriptor while no lane is lent, receive lanes open or not: an idle lane's
  // completions (stragglers of a receive that ended) reach no channel, and nobody waits on them.
  int idle_fd() const override;
  // Drains the channel's events, arms the receive CQ (and the send CQ while a zero-copy send
  // waits for its completion), then polls once more: completions that came before the arm
  // raise no event, and any found are kept for the next rx_burst (false).
  bool prepare_wait() override;

  const UdCounters& ud_counters() const;
  uint32_t max_inline_bytes() const { return max_inline_; }
  uint32_t recv_slots() const { return recv_slots_; }

 private:
  // The channel's descriptor, or -1 without one, once arming failed, or when `lanes_hide`:
  // readable_fd() and idle_fd() differ only in which lanes hide completions from it.
  int channel_fd_unless(bool lanes_hide) const;
  explicit UdEndpoint(std::shared_ptr<PortContext> port) : port_(std::move(port)) {}
  Status create(const EndpointOptions& opts);
  Status bring_up();  // RESET -> INIT -> RTR -> RTS
  void reset_qp();    // from any state back to RTS, every posted work request discarded
  void check_qp();    // after an error completion: reset if the QP left RTS
  void repost_recvs();
  void reap_sends();
  // The device is done with every send below `upto` (a completion, a reset, the QP's end):
  // tx_done_ moves there and the fences of zero-copy posts among them are released.
  void retire_sends(uint64_t upto);
  // Releases the fence send number `send` holds, if any.
  void release_fence(uint64_t send);
  // The registration a zero-copy post of `p` reads from, or null: none, another domain's, the
  // payload outside it.
  const VerbsRegion* zero_copy_region(const TxPacket& p) const;
  // DatapathCounters::tx_zero_copy / tx_copied for the first `n` datagrams of a burst.
  void count_payloads(const TxPacket* pkts, int n);
  // tx_burst's contract, every datagram to (ah, qpn, qkey).
  int post_sends(ibv_ah* ah, uint32_t qpn, uint32_t qkey, const TxPacket* pkts, int n);
  // Handles one receive completion; true (and pkt filled) when it delivers a datagram.
  bool take_recv(const ibv_wc& wc, RxPacket* pkt);
  // SourceCheck: pkt->from for an unbound endpoint; false for a datagram to drop (not from
  // the peer of a bound one, no source to answer).
  bool fill_source(const ibv_wc& wc, const uint8_t* grh, RxPacket* pkt) override;
  // Takes in the lane the opener finished, if any.
  void adopt_lane();
  // Reads and acknowledges every event waiting on the channel (it is non-blocking): an event
  // left unacknowledged would make destroying its CQ wait for ever.
  void ack_channel_events();
  // The lane a receive was lent under `steer` (AimLane::lent_as), or null.
  AimLane* lane_lent_as(uint32_t steer) const;
  // A lane still owns the place of this datagram (DATA for its receive, its request posted).
  bool lane_owns(const uint8_t* dgram, uint32_t len) const;

  std::shared_ptr<PortContext> port_;
  const IbvSymbols* ibv_ = nullptr;
  ibv_cq* send_cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  // Both CQs report to it, but only once armed (prepare_wait): a pass that nobody blocks on
  // costs no event. Null where libibverbs or the device offers none.
  ibv_comp_channel* channel_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_mr* recv_mr_ = nullptr;
  ibv_mr* send_mr_ = nullptr;
  uint8_t* recv_mem_ = nullptr;  // recv_slots_ slots of recv_layout_ (page-aligned)
  uint8_t* send_mem_ = nullptr;  // kSendSlots slots of send_stride_ bytes (page-aligned)

  uint32_t max_datagram_ = 0;
  uint32_t max_inline_ = 0;
  uint32_t recv_slots_ = 0;
  RecvSlotLayout recv_layout_{};
  uint32_t send_stride_ = 0;

  // Receive ring, free-running: [rx_done_, rx_posted_) are posted; the other slots completed
  // and wait to be reposted at the start of the next rx_burst (the caller may still be
  // reading them until then). A work request's wr_id is its sequence number.
  uint64_t rx_posted_ = 0;
  uint64_t rx_done_ = 0;
  std::unique_ptr<ibv_recv_wr[]> recv_wr_;  // one per slot, pre-linked in ring order
  std::unique_ptr<ibv_sge[]> recv_sge_;     // one per slot, constant after open

  // Send ring, free-running: [tx_done_, tx_posted_) are posted and not known complete. A send
  // work request's wr_id is its sequence number + 1: the tx_done_ its completion implies.
  uint64_t tx_posted_ = 0;
  uint64_t tx_done_ = 0;
  std::unique_ptr<ibv_send_wr[]> send_wr_;  // one per slot
  std::unique_ptr<ibv_sge[]> send_sge_;     // two per slot (header, payload): inline, zero copy
  // Per slot, the fence a zero-copy post holds (null: none), released by retire_sends; fenced_
  // counts the non-null ones, so that rx_burst reaps sends only while someone waits on one.
  std::unique_ptr<TxFence*[]> send_fence_;
  uint64_t fenced_ = 0;

  bool has_peer_ = false;
  UdAddress peer_{};
  ibv_ah* peer_ah_ = nullptr;                  // owned by the port's cache
  // tx_burst_to's last destination (to_ah_ == nullptr: none yet): consecutive bursts mostly go
  // to one connection's peer, and the port's cache takes a lock and a search.
  PeerAddress to_;
  UdAddress to_ud_{};
  ibv_ah* to_ah_ = nullptr;                    // owned by the port's cache
  bool error_seen_ = false;                    // an error completion since the last QP state check
  ibv_wc_status last_error_ = IBV_WC_SUCCESS;  // its status, for the log
  bool reset_pending_ = false;

  PeerAddress local_;
  DatapathCounters counters_;
  mutable UdCounters ud_;  // its lane sums are gathered when read
  ibv_wc wc_[kPollBatch];
  // Receive completions prepare_wait polled after arming, handed out first by the next
  // rx_burst: [stash_at_, stash_n_).
  ibv_wc stash_[kPollBatch];
  int stash_n_ = 0;
  int stash_at_ = 0;
  // A lane was ever opened, or a CQ could not be armed: readable_fd() says -1 from then on
  // (read without the endpoint's lock).
  std::atomic<bool> has_lanes_{false};
  std::atomic<bool> arm_failed_{false};
  std::unique_ptr<AimLane> lanes_[kMaxLanes];
  int lanes_open_ = 0;
  int lanes_active_ = 0;
  uint64_t lane_stops_ = 0;   // the lanes' stop clock (AimLane::stopped_tick)
  bool lane_failed_ = false;  // opening a lane failed once: not tried again
  std::atomic<uint64_t> aim_moves_{0};
  LaneWorker worker_;         // opens lanes and flushes them, off NCCL's thread
};

}  // namespace optireduce::verbs
