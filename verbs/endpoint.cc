// The UD endpoint's set-up, hot path and error recovery (see endpoint.h for the design).
// Nothing here allocates after open(): work requests and SGEs are built once per slot, and
// the hot path only fills the fields that change per datagram.
#include "verbs/endpoint.h"

#include <fcntl.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "transport/log.h"
#include "transport/wire.h"

namespace optireduce::verbs {
namespace {

uint32_t min_u32(uint32_t a, uint32_t b) {
  return a < b ? a : b;
}

// A device too small for the asked ring is the same for every endpoint: said once per process.
std::atomic<bool> g_short_ring_warned{false};
// The first zero-copy send of the process, said once (count_payloads).
std::atomic<bool> g_zero_copy_said{false};
// The first datagram a receive lane placed, said once (rx_burst).
std::atomic<bool> g_placed_said{false};

}  // namespace

Status UdEndpoint::open(std::shared_ptr<PortContext> port, const EndpointOptions& opts,
                        std::unique_ptr<UdEndpoint>* out) {
  std::unique_ptr<UdEndpoint> ep(new UdEndpoint(std::move(port)));
  Status st = ep->create(opts);
  if (st.is_ok()) *out = std::move(ep);
  return st;
}

UdEndpoint::~UdEndpoint() {
  // Once per endpoint (per connection at most): whether sends left without a copy is what a
  // user of regMr wants to see, and the counters are otherwise out of the plugin's reach.
  if (qp_ && (counters_.tx_zero_copy != 0 || counters_.tx_copied != 0)) {
    OR_INFO(
        "verbs: %s qpn %u closed: %llu datagrams sent, %llu of them from registered "
        "buffers without a copy, %llu copied though registered",
        port_->name.c_str(), qp_->qp_num, static_cast<unsigned long long>(counters_.tx_datagrams),
        static_cast<unsigned long long>(counters_.tx_zero_copy),
        static_cast<unsigned long long>(counters_.tx_copied));
  }
  if (lanes_open_ != 0) {
    // What the receive lanes did for this endpoint's receives (aim_lane.h), once per endpoint.
    const LaneCounters& c = ud_counters().lanes;
    OR_INFO(
        "verbs: %s qpn %u: %llu receives lent a lane (%llu declined): %llu datagrams placed, "
        "%llu missed (%llu of them waited for their place), %llu dropped, %llu lanes flushed "
        "in place (%llu on NCCL's thread), %llu recovered in place from an error, %llu "
        "recreated",
        port_->name.c_str(), qp_ ? qp_->qp_num : 0u, static_cast<unsigned long long>(ud_.aims),
        static_cast<unsigned long long>(ud_.aims_declined),
        static_cast<unsigned long long>(c.placed), static_cast<unsigned long long>(c.missed),
        static_cast<unsigned long long>(c.waited), static_cast<unsigned long long>(c.dropped),
        static_cast<unsigned long long>(c.flushed),
        static_cast<unsigned long long>(c.flushed_inline),
        static_cast<unsigned long long>(c.recovered), static_cast<unsigned long long>(c.recreated));
  }
  worker_.shutdown();                // its lane opening and flushes share the send CQ and the lanes
  for (auto& l : lanes_) l.reset();  // before the send CQ they share
  if (qp_) ibv_->destroy_qp(qp_);
  // The device reads nothing of a destroyed QP's: whoever still waits on a fence may go on (a
  // connection that closed meanwhile left its fences behind for this; send.h).
  if (send_fence_) retire_sends(tx_posted_);
  if (channel_) ack_channel_events();
  if (send_cq_) ibv_->destroy_cq(send_cq_);
  if (recv_cq_) ibv_->destroy_cq(recv_cq_);
  if (channel_) ibv_->destroy_comp_channel(channel_);
  if (recv_mr_) ibv_->dereg_mr(recv_mr_);
  if (send_mr_) ibv_->dereg_mr(send_mr_);
  std::free(recv_mem_);
  std::free(send_mem_);
}

Status UdEndpoint::create(const EndpointOptions& opts) {
  ibv_ = &port_->ibv();
  const PortContext& pc = *port_;
  // A UD message never exceeds the path MTU; rxe silently drops a larger send, so the MTU is
  // a hard ceiling whatever the options ask for.
  max_datagram_ = pc.mtu_bytes;
  if (opts.max_datagram_bytes != 0) max_datagram_ = min_u32(max_datagram_, opts.max_datagram_bytes);
  recv_layout_ = recv_slot_layout(max_datagram_);
  send_stride_ = round_up(max_datagram_, kCacheLineBytes);
  // The transport sizes its window against the receive ring (receive_buffer_bytes).
  const uint32_t dev_limit = min_u32(pc.max_qp_wr, pc.max_cqe);
  recv_slots_ = recv_ring_slots(opts.socket_buffer_bytes, max_datagram_, opts.unbound,
                                kMinRecvSlots, min_u32(kMaxRecvSlots, dev_limit));
  if (recv_slots_ < kMinRecvSlots || dev_limit < kSendSlots) {
    OR_WARN("verbs: %s: device queue limit %u too small", pc.name.c_str(), dev_limit);
    return Status(Errc::kSystem, ENOMEM);
  }
  if (uint64_t{recv_slots_} * max_datagram_ < opts.socket_buffer_bytes &&
      !g_short_ring_warned.exchange(true)) {
    OR_WARN(
        "verbs: %s: the receive ring holds %u datagrams of %u bytes where "
        "OPTIREDUCE_SOCKET_BUFFER asked for %u bytes (the device allows %u work requests per "
        "queue, the endpoint at most %u): connections offer their peers %llu bytes of receive "
        "window (said once per process).",
        pc.name.c_str(), recv_slots_, max_datagram_, opts.socket_buffer_bytes, dev_limit,
        kMaxRecvSlots, static_cast<unsigned long long>(receive_buffer_bytes()));
  }

  const size_t recv_bytes = size_t{recv_slots_} * recv_layout_.stride_bytes;
  const size_t send_bytes = size_t{kSendSlots} * send_stride_;
  recv_mem_ = alloc_ring_pages(recv_bytes);
  send_mem_ = alloc_ring_pages(send_bytes);
  if (recv_mem_ == nullptr || send_mem_ == nullptr) return Status(Errc::kSystem, ENOMEM);
  recv_mr_ = ibv_->reg_mr(pc.pd(), recv_mem_, recv_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (recv_mr_ == nullptr) return Status(Errc::kSystem, errno);
  send_mr_ = ibv_->reg_mr(pc.pd(), send_mem_, send_bytes, 0);
  if (send_mr_ == nullptr) return Status(Errc::kSystem, errno);

  // A channel that cannot be made non-blocking is no use: ack_channel_events must not wait.
  if (ibv_->has_comp_channel()) {
    channel_ = ibv_->create_comp_channel(pc.context());
    const int fl = channel_ != nullptr ? ::fcntl(channel_->fd, F_GETFL) : -1;
    if (channel_ != nullptr && (fl < 0 || ::fcntl(channel_->fd, F_SETFL, fl | O_NONBLOCK) < 0)) {
      ibv_->destroy_comp_channel(channel_);
      channel_ = nullptr;
    }
  }
  send_cq_ = ibv_->create_cq(pc.context(), static_cast<int>(kSendSlots), nullptr, channel_, 0);
  if (send_cq_ == nullptr && channel_ != nullptr) {
    // A provider that refuses a channel still serves the endpoint: its waiting callers nap.
    ibv_->destroy_comp_channel(channel_);
    channel_ = nullptr;
    send_cq_ = ibv_->create_cq(pc.context(), static_cast<int>(kSendSlots), nullptr, nullptr, 0);
  }
  if (send_cq_ == nullptr) return Status(Errc::kSystem, errno);
  recv_cq_ = ibv_->create_cq(pc.context(), static_cast<int>(recv_slots_), nullptr, channel_, 0);
  if (recv_cq_ == nullptr) return Status(Errc::kSystem, errno);

  ibv_qp_init_attr ia{};
  ia.send_cq = send_cq_;
  ia.recv_cq = recv_cq_;
  ia.qp_type = IBV_QPT_UD;
  ia.sq_sig_all = 0;
  ia.cap.max_send_wr = kSendSlots;
  ia.cap.max_recv_wr = recv_slots_;
  ia.cap.max_send_sge = 2;
  ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = kInlineBytes;
  qp_ = ibv_->create_qp(pc.pd(), &ia);
  if (qp_ == nullptr) {
    // Some providers cap inline data below kInlineBytes; inline is an optimisation only.
    ia.cap.max_inline_data = 0;
    qp_ = ibv_->create_qp(pc.pd(), &ia);
  }
  if (qp_ == nullptr) return Status(Errc::kSystem, errno);
  max_inline_ = min_u32(ia.cap.max_inline_data, kInlineBytes);

  // Work requests and SGEs are built once; the hot path touches only per-datagram fields.
  recv_wr_.reset(new ibv_recv_wr[recv_slots_]());
  recv_sge_.reset(new ibv_sge[recv_slots_]());
  for (uint32_t i = 0; i < recv_slots_; i++) {
    uint8_t* slot = recv_mem_ + size_t{i} * recv_layout_.stride_bytes;
    recv_sge_[i].addr = reinterpret_cast<uintptr_t>(slot + recv_layout_.grh_offset);
    recv_sge_[i].length = recv_layout_.sge_bytes;
    recv_sge_[i].lkey = recv_mr_->lkey;
    recv_wr_[i].sg_list = &recv_sge_[i];
    recv_wr_[i].num_sge = 1;
    recv_wr_[i].next = &recv_wr_[(i + 1) & (recv_slots_ - 1)];
  }
  send_wr_.reset(new ibv_send_wr[kSendSlots]());
  send_sge_.reset(new ibv_sge[2 * kSendSlots]());
  send_fence_.reset(new TxFence*[kSendSlots]());
  for (uint32_t i = 0; i < kSendSlots; i++) {
    send_wr_[i].sg_list = &send_sge_[2 * i];
    send_wr_[i].opcode = IBV_WR_SEND;
  }

  Status st = bring_up();
  if (!st.is_ok()) return st;
  repost_recvs();
  if (rx_posted_ != recv_slots_) return Status(Errc::kSystem, ENOMEM);

  UdAddress self;
  std::memcpy(self.gid, pc.gid, 16);
  self.qpn = qp_->qp_num;
  self.qkey = kDefaultQKey;
  self.lid = pc.lid;
  local_ = encode_address(self);
  OR_INFO(
      "verbs: %s endpoint %s, %u-byte datagrams, %u receive slots, inline <= %u, %s, "
      "%zu bytes registered",
      pc.name.c_str(), format_address(self).c_str(), max_datagram_, recv_slots_, max_inline_,
      opts.unbound ? "unbound (shared by the device's connections)" : "for one peer",
      recv_bytes + send_bytes);
  return Status::ok();
}

// Slots that stay posted whatever happens between two rx_burst calls: completed slots are
// reposted in chains of at least kRecvSlack, so up to kRecvSlack - 1 may wait, and the slots of
// the datagrams the last call handed out (at most kPollBatch: the transport takes 32 per call)
// are reposted only by the next, since the caller reads them in between. A slot holds one
// datagram whatever its length, so each counts max_datagram_ bytes and nothing more.
uint64_t UdEndpoint::receive_buffer_bytes() const {
  return uint64_t{recv_slots_ - (kRecvSlack - 1) - static_cast<uint32_t>(kPollBatch)} *
         max_datagram_;
}

Status UdEndpoint::bring_up() {
  return ud_qp_to_rts(*ibv_, qp_, port_->port);
}

void UdEndpoint::reset_qp() {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  if (ibv_->modify_qp(qp_, &a, IBV_QP_STATE) != 0) {
    reset_pending_ = true;  // try again on the next call
    return;
  }
  // Completions already queued belong to discarded requests; take them out now. Any that
  // still trail in are recognised by their sequence number (rx_stale).
  while (ibv_poll_cq(recv_cq_, kPollBatch, wc_) > 0) {
  }
  while (ibv_poll_cq(send_cq_, kPollBatch, wc_) > 0) {
  }
  stash_n_ = stash_at_ = 0;
  rx_done_ = rx_posted_;  // nothing is posted any more; rx_burst reposts every slot
  retire_sends(tx_posted_);
  reset_pending_ = !bring_up().is_ok();
  ud_.qp_resets++;
  OR_WARN("verbs: %s qpn %u: queue pair reset after an error completion (%s)%s",
          port_->name.c_str(), qp_->qp_num, ibv_->wc_status_str(last_error_),
          reset_pending_ ? "; the reset failed, will retry" : "");
}

void UdEndpoint::check_qp() {
  error_seen_ = false;
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  if (ibv_->query_qp(qp_, &a, IBV_QP_STATE, &ia) != 0 || a.qp_state != IBV_QPS_RTS) reset_qp();
}

Status UdEndpoint::set_peer(const PeerAddress& peer) {
  UdAddress a;
  if (!decode_address(peer, &a)) return Status(Errc::kInternal, EINVAL);
  ibv_ah* ah = nullptr;
  Status st = port_->address_handle(a, &ah);
  if (!st.is_ok()) return st;
  peer_ = a;
  peer_ah_ = ah;
  has_peer_ = true;
  return Status::ok();
}

void UdEndpoint::repost_recvs() {
  const uint64_t free_slots = recv_slots_ - (rx_posted_ - rx_done_);
  if (free_slots < kRecvSlack && rx_posted_ != rx_done_) return;
  if (free_slots == 0) return;
  // Cut the pre-linked ring after the last slot to post, post once, restore the link.
  const uint32_t first = ring_slot(rx_posted_, recv_slots_);
  const uint32_t last = ring_slot(rx_posted_ + free_slots - 1, recv_slots_);
  for (uint64_t s = rx_posted_; s < rx_posted_ + free_slots; s++)
    recv_wr_[ring_slot(s, recv_slots_)].wr_id = s;
  ibv_recv_wr* saved = recv_wr_[last].next;
  recv_wr_[last].next = nullptr;
  ibv_recv_wr* bad = nullptr;
  const int rc = ibv_post_recv(qp_, &recv_wr_[first], &bad);
  recv_wr_[last].next = saved;
  counters_.rx_syscalls++;
  uint64_t posted = free_slots;
  if (rc != 0) {
    posted = 0;
    for (ibv_recv_wr* w = &recv_wr_[first]; w != nullptr && w != bad; w = w->next) posted++;
  }
  rx_posted_ += posted;
}

bool UdEndpoint::take_recv(const ibv_wc& wc, RxPacket* pkt) {
  if (wc.wr_id != rx_done_) {  // left over from before a reset
    ud_.rx_stale++;
    return false;
  }
  const uint8_t* slot =
      recv_mem_ + size_t{ring_slot(rx_done_, recv_slots_)} * recv_layout_.stride_bytes;
  rx_done_++;
  if (wc.status != IBV_WC_SUCCESS) {
    // A datagram larger than the slot (the peer ignored our datagram size): hardware reports
    // a length error; rxe fails the copy into the too-short buffer and reports a local QP
    // operation error, the only receive-side error our constant, valid work requests can
    // meet. Either way the QP is now in the error state and check_qp() resets it.
    if (wc.status == IBV_WC_LOC_LEN_ERR || wc.status == IBV_WC_LOC_QP_OP_ERR) {
      counters_.rx_truncated++;
    } else if (wc.status != IBV_WC_WR_FLUSH_ERR) {
      counters_.rx_errors++;  // flushes follow an error already counted
    }
    if (wc.status != IBV_WC_WR_FLUSH_ERR) last_error_ = wc.status;
    error_seen_ = true;
    return false;
  }
  if (wc.byte_len < kGrhBytes) {
    counters_.rx_errors++;
    return false;
  }
  if (!fill_source(wc, slot + recv_layout_.grh_offset, pkt)) return false;
  pkt->data = slot + recv_layout_.payload_offset;
  pkt->len = wc.byte_len - kGrhBytes;
  pkt->rest = nullptr;
  pkt->aimed = false;
  // A lane's receive owns this place until its request completes: a copy now would be
  // overwritten by whatever that request takes (aim_lane.h). It came the wrong way; the sender
  // repairs it through the lane if it is needed.
  if (lanes_active_ != 0 && lane_owns(pkt->data, pkt->len)) {
    ud_.rx_aim_conflict++;
    return false;
  }
  return true;
}

bool UdEndpoint::fill_source(const ibv_wc& wc, const uint8_t* grh, RxPacket* pkt) {
  const bool has_grh = (wc.wc_flags & IBV_WC_GRH) != 0;
  uint8_t src_gid[16] = {};
  const bool has_src = has_grh && grh_source_gid(grh, src_gid);
  if (has_peer_) {
    // The QPN alone is not unique across hosts; the source GID (or LID without a GRH)
    // completes the identity.
    const bool same_host = has_src ? std::memcmp(src_gid, peer_.gid, 16) == 0
                                   : (!port_->ethernet && wc.slid == peer_.lid);
    if (wc.src_qp != peer_.qpn || !same_host) {
      ud_.rx_foreign++;
      return false;
    }
    pkt->from = PeerAddress();
    return true;
  }
  if (!has_src && port_->ethernet) {
    ud_.rx_no_source++;
    return false;
  }
  UdAddress from;
  std::memcpy(from.gid, src_gid, 16);
  from.qpn = wc.src_qp;
  from.qkey = kDefaultQKey;
  from.lid = port_->ethernet ? 0 : wc.slid;
  pkt->from = encode_address(from);
  return true;
}

bool UdEndpoint::lane_owns(const uint8_t* dgram, uint32_t len) const {
  PacketHeader h;
  if (decode(dgram, len, &h) != DecodeError::kNone || h.type != PacketType::kData) return false;
  for (const auto& lane : lanes_)
    if (lane && lane->owns(h.token, h.msg_seq, h.offset)) return true;
  return false;
}

uint32_t UdEndpoint::aim_open(const AimTarget& t) {
  const auto* mr = static_cast<const VerbsRegion*>(t.mr);
  // Only this port's own writable registrations; a packet's header and payload must fit the
  // lane's requests as they fit a datagram of the endpoint.
  if (mr == nullptr || mr->domain() != static_cast<const void*>(port_->pd()) || !mr->writable() ||
      !mr->contains(t.base, t.capacity) || t.pkt_payload == 0 ||
      uint64_t{t.pkt_payload} + kHeaderBytes > max_datagram_ || lane_failed_) {
    ud_.aims_declined++;
    return 0;
  }
  adopt_lane();
  // The lane idle longest (AimLane::stopped_tick): its last receive's stragglers had the most
  // time to arrive and be dropped.
  AimLane* lane = nullptr;
  for (int i = 0; i < lanes_open_; i++) {
    AimLane* l = lanes_[i].get();
    if (!l->busy() && l->usable() && (lane == nullptr || l->stopped_tick() < lane->stopped_tick()))
      lane = l;
  }
  // One more lane per receive asking while the pool has room, as the receives in flight grow.
  if (!lane_failed_ && lanes_open_ < kMaxLanes && !worker_.opening()) {
    const uint32_t depth = recv_slots_ < kMaxLaneDepth ? recv_slots_ : kMaxLaneDepth;
    worker_.start_open(port_.get(), send_cq_, depth, max_datagram_, &lane_stops_);
  }
  if (lane == nullptr) {
    ud_.aims_declined++;
    return 0;
  }
  lane->start(t, mr->lkey());
  lanes_active_++;
  ud_.aims++;
  return lane->qpn();
}

void UdEndpoint::adopt_lane() {
  std::unique_ptr<AimLane> fresh;
  Status st;
  if (!worker_.take_opened(&fresh, &st)) return;
  if (!st.is_ok()) {
    lane_failed_ = true;
    OR_WARN("verbs: %s: cannot open a receive lane (%s, errno %d): receives are copied",
            port_->name.c_str(), errc_name(st.code()), st.sys_errno());
    return;
  }
  lanes_[lanes_open_++] = std::move(fresh);
  has_lanes_.store(true, std::memory_order_relaxed);
}

int UdEndpoint::channel_fd_unless(bool lanes_hide) const {
  if (channel_ == nullptr || lanes_hide || arm_failed_.load(std::memory_order_relaxed)) return -1;
  return channel_->fd;
}

int UdEndpoint::readable_fd() const {
  return channel_fd_unless(has_lanes_.load(std::memory_order_relaxed));
}

int UdEndpoint::idle_fd() const {
  return channel_fd_unless(lanes_active_ != 0);
}

void UdEndpoint::ack_channel_events() {
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  while (ibv_->get_cq_event(channel_, &cq, &ctx) == 0) ibv_->ack_cq_events(cq, 1);
}

bool UdEndpoint::prepare_wait() {
  if (channel_ == nullptr) return true;  // readable_fd() said -1: nobody blocks on it
  // Events of earlier arms: read now, or the descriptor stays readable and the wait spins.
  ack_channel_events();
  if (stash_at_ < stash_n_) return false;
  // A CQ that cannot be armed would never wake the caller: from now on readable_fd() says
  // there is nothing to block on, and the caller naps.
  const auto arm = [this](ibv_cq* cq) {
    const int rc = ibv_req_notify_cq(cq, 0);  // 0, or an errno value
    if (rc == 0) return true;
    if (!arm_failed_.exchange(true))
      OR_WARN(
          "verbs: %s qpn %u: cannot arm a completion queue (errno %d): a waiting caller "
          "naps instead of blocking",
          port_->name.c_str(), qp_->qp_num, rc);
    return false;
  };
  if (!arm(recv_cq_)) return false;
  // A zero-copy send's request is done only once its completion is reaped (TxFence), and a
  // caller may be waiting on exactly that.
  if (fenced_ != 0) {
    if (!arm(send_cq_)) return false;
    const uint64_t before = tx_done_;
    reap_sends();
    if (tx_done_ != before) return false;
  }
  const int n = ibv_poll_cq(recv_cq_, kPollBatch, stash_);
  if (n <= 0) return n == 0;  // n < 0: the CQ is broken, and the next rx_burst says so
  stash_n_ = n;
  stash_at_ = 0;
  return false;
}

AimLane* UdEndpoint::lane_lent_as(uint32_t steer) const {
  for (const auto& l : lanes_)
    if (l && l->lent_as(steer)) return l.get();
  return nullptr;
}

bool UdEndpoint::aim_close(uint32_t steer, bool wait) {
  AimLane* l = lane_lent_as(steer);
  if (l == nullptr) return true;
  if (l->active()) lanes_active_--;
  return l->stop(wait);
}

bool UdEndpoint::aim_reachable(uint32_t steer) {
  const AimLane* l = lane_lent_as(steer);
  return l != nullptr && l->qpn() == steer;  // no lane holds it: nothing takes DATA sent to it
}

std::string UdEndpoint::aim_text(uint32_t steer) const {
  const AimLane* l = lane_lent_as(steer);
  if (l == nullptr) return "no lane holds it";
  return l->text() + "; " + std::to_string(ud_.rx_aim_conflict) +
         " datagrams of places a lane owned dropped on the shared QP";
}

const UdCounters& UdEndpoint::ud_counters() const {
  ud_.lanes = LaneCounters{};
  for (const auto& l : lanes_) {
    if (!l) continue;
    const LaneCounters& c = l->counters();
    ud_.lanes.placed += c.placed;
    ud_.lanes.missed += c.missed;
    ud_.lanes.waited += c.waited;
    ud_.lanes.flushed += c.flushed;
    ud_.lanes.flushed_inline += c.flushed_inline;
    ud_.lanes.recovered += c.recovered;
    ud_.lanes.recreated += c.recreated;
    ud_.lanes.dropped += c.dropped;
    ud_.lanes.stale += c.stale;
    ud_.lanes.errors += c.errors;
  }
  return ud_;
}

int UdEndpoint::rx_burst(RxPacket* pkts, int max) {
  if (reset_pending_) reset_qp();
  // Sends posted from a caller's buffer keep its request from completing until they are
  // reaped (datapath.h, TxFence); a connection that only polls, its last packets sent, would
  // otherwise wait for the next send of anyone on this QP.
  if (fenced_ != 0) reap_sends();
  repost_recvs();
  int got = 0;
  // What prepare_wait took off the CQ came before anything still on it.
  while (stash_at_ < stash_n_ && got < max)
    if (take_recv(stash_[stash_at_++], &pkts[got])) got++;
  while (got < max) {
    const int want = max - got < kPollBatch ? max - got : kPollBatch;
    const int n = ibv_poll_cq(recv_cq_, want, wc_);
    if (n < 0) return -EIO;  // the CQ itself is broken (overrun): nothing to recover
    for (int i = 0; i < n; i++)
      if (take_recv(wc_[i], &pkts[got])) got++;
    if (n < want) break;
  }
  // The lanes, lent or idle: an idle one hands up its last receive's stragglers (aim_lane.h).
  for (int i = 0; i < lanes_open_ && got < max; i++) {
    AimLane& lane = *lanes_[i];
    const int n = lane.poll(pkts + got, max - got, *this);
    if (n < 0) return n;
    got += n;
    if (lane.take_moved()) aim_moves_.fetch_add(1, std::memory_order_relaxed);
    // The proof a user (and the VM test) can see that regMr paid off on this side too.
    if (n > 0 && lane.counters().placed != 0 && !g_placed_said.exchange(true))
      OR_INFO(
          "verbs: %s: receives land in registered buffers without a copy (said once per "
          "process)",
          port_->name.c_str());
  }
  counters_.rx_datagrams += static_cast<uint64_t>(got);
  if (error_seen_) check_qp();
  return got;
}

void UdEndpoint::reap_sends() {
  for (;;) {
    const int n = ibv_poll_cq(send_cq_, kPollBatch, wc_);
    if (n <= 0) return;
    for (int i = 0; i < n; i++) {
      const ibv_wc& wc = wc_[i];
      if (wc.wr_id > tx_done_ && wc.wr_id <= tx_posted_) retire_sends(wc.wr_id);
      if (wc.status != IBV_WC_SUCCESS && wc.status != IBV_WC_WR_FLUSH_ERR) {
        counters_.rx_errors++;
        ud_.tx_errors++;
        last_error_ = wc.status;
        error_seen_ = true;
      }
    }
    if (n < kPollBatch) return;
  }
}

void UdEndpoint::retire_sends(uint64_t upto) {
  for (uint64_t s = tx_done_; fenced_ != 0 && s < upto; s++) release_fence(s);
  tx_done_ = upto;
}

void UdEndpoint::release_fence(uint64_t send) {
  TxFence*& f = send_fence_[ring_slot(send, kSendSlots)];
  if (f == nullptr) return;
  f->release();
  f = nullptr;
  fenced_--;
}

const VerbsRegion* UdEndpoint::zero_copy_region(const TxPacket& p) const {
  if (p.payload_mr == nullptr || p.payload_fence == nullptr || p.payload_len == 0) return nullptr;
  // Another port's or datapath's region has no lkey valid here (its domain is not our PD).
  if (p.payload_mr->domain() != static_cast<const void*>(port_->pd())) return nullptr;
  if (!p.payload_mr->contains(p.payload, p.payload_len)) return nullptr;
  return static_cast<const VerbsRegion*>(p.payload_mr);
}

void UdEndpoint::count_payloads(const TxPacket* pkts, int n) {
  for (int i = 0; i < n; i++) {
    if (pkts[i].payload_mr == nullptr) continue;
    const uint32_t len = pkts[i].hdr_len + pkts[i].payload_len;
    if (len > max_inline_ && zero_copy_region(pkts[i]) != nullptr)
      counters_.tx_zero_copy++;
    else
      counters_.tx_copied++;
  }
  // The proof a user (and the VM test) can see that regMr paid off: the counters stay inside
  // the endpoint, which a shared one keeps until the process ends.
  if (counters_.tx_zero_copy != 0 && !g_zero_copy_said.exchange(true)) {
    OR_INFO(
        "verbs: %s: sends leave from registered buffers without a copy (said once per "
        "process)",
        port_->name.c_str());
  }
}

int UdEndpoint::tx_burst(const TxPacket* pkts, int n) {
  if (!has_peer_) return -ENOTCONN;
  return post_sends(peer_ah_, peer_.qpn, peer_.qkey, pkts, n);
}

int UdEndpoint::tx_burst_to(const PeerAddress& to, const TxPacket* pkts, int n) {
  if (to_ah_ == nullptr || !(to == to_)) {
    UdAddress a;
    if (!decode_address(to, &a)) return -EINVAL;
    ibv_ah* ah = nullptr;
    Status st = port_->address_handle(a, &ah);  // creates the host's AH on its first use only
    if (!st.is_ok()) return st.sys_errno() > 0 ? -st.sys_errno() : -EIO;
    to_ = to;
    to_ud_ = a;
    to_ah_ = ah;
  }
  return post_sends(to_ah_, to_ud_.qpn, to_ud_.qkey, pkts, n);
}

int UdEndpoint::post_sends(ibv_ah* ah, uint32_t qpn, uint32_t qkey, const TxPacket* pkts, int n) {
  if (reset_pending_) reset_qp();
  reap_sends();
  if (error_seen_) check_qp();
  const uint64_t room = kSendSlots - (tx_posted_ - tx_done_);
  int m = n < static_cast<int>(room) ? n : static_cast<int>(room);
  for (int i = 0; i < m; i++) {
    if (pkts[i].hdr_len + uint64_t{pkts[i].payload_len} > max_datagram_) {
      if (i == 0) return -EMSGSIZE;  // the caller broke max_datagram_bytes()
      m = i;
    }
  }
  ibv_send_wr* first = nullptr;
  ibv_send_wr* prev = nullptr;
  bool fenced = false;  // the chain holds a zero-copy post
  for (int i = 0; i < m; i++) {
    const TxPacket& p = pkts[i];
    const uint64_t seq = tx_posted_ + static_cast<uint64_t>(i);
    const uint32_t slot = ring_slot(seq, kSendSlots);
    ibv_send_wr* wr = &send_wr_[slot];
    ibv_sge* sge = wr->sg_list;
    const uint32_t len = p.hdr_len + p.payload_len;
    uint8_t* dst = send_mem_ + size_t{slot} * send_stride_;
    unsigned flags = 0;
    const VerbsRegion* mr = nullptr;
    if (len <= max_inline_) {
      // Inline: the post copies straight from the caller's memory, which needs no lkey, and
      // costs less than a DMA read of a small payload.
      int k = 0;
      if (p.hdr_len) sge[k++] = ibv_sge{reinterpret_cast<uintptr_t>(p.hdr), p.hdr_len, 0};
      if (p.payload_len)
        sge[k++] = ibv_sge{reinterpret_cast<uintptr_t>(p.payload), p.payload_len, 0};
      wr->num_sge = k;
      flags = IBV_SEND_INLINE;
      ud_.tx_inline++;
    } else if ((mr = zero_copy_region(p)) != nullptr) {
      // Zero copy: the header (ours, on the caller's stack or batch) from its slot, the payload
      // straight from the caller's registered buffer, which the device reads until the send
      // completes: the packet's fence says so to the buffer's owner until then.
      if (p.hdr_len) std::memcpy(dst, p.hdr, p.hdr_len);
      int k = 0;
      if (p.hdr_len)
        sge[k++] = ibv_sge{reinterpret_cast<uintptr_t>(dst), p.hdr_len, send_mr_->lkey};
      sge[k++] = ibv_sge{reinterpret_cast<uintptr_t>(p.payload), p.payload_len, mr->lkey()};
      wr->num_sge = k;
      p.payload_fence->hold();
      send_fence_[slot] = p.payload_fence;
      fenced_++;
      fenced = true;
    } else {
      // No registration, or the payload outside it: the transport may reuse the memory as
      // soon as we return, so the datagram is copied into its registered slot.
      if (p.hdr_len) std::memcpy(dst, p.hdr, p.hdr_len);
      if (p.payload_len) std::memcpy(dst + p.hdr_len, p.payload, p.payload_len);
      sge[0] = ibv_sge{reinterpret_cast<uintptr_t>(dst), len, send_mr_->lkey};
      wr->num_sge = 1;
    }
    if (signal_wr(seq, kSignalEvery)) flags |= IBV_SEND_SIGNALED;
    wr->send_flags = flags;
    wr->wr_id = seq + 1;
    wr->wr.ud.ah = ah;
    // DATA for a receive that lent a lane goes to the lane, on the same port of the same host.
    wr->wr.ud.remote_qpn = p.steer != 0 ? p.steer : qpn;
    wr->wr.ud.remote_qkey = qkey;
    wr->next = nullptr;
    if (prev)
      prev->next = wr;
    else
      first = wr;
    prev = wr;
  }
  // A zero-copy post's fence is released only by a completion at or after it; unsignaled
  // groups complete only when a later send is signaled, which may never be posted if this was
  // the last burst for a while. One more completion per such chain: the CQ holds one per slot.
  if (fenced) prev->send_flags |= IBV_SEND_SIGNALED;
  int posted = 0;
  if (m > 0) {
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(qp_, first, &bad);
    counters_.tx_syscalls++;
    posted = m;
    if (rc != 0) {
      posted = 0;
      for (ibv_send_wr* w = first; w != nullptr && w != bad; w = w->next) posted++;
      // What was not posted is not read by the device.
      for (int i = posted; i < m; i++) release_fence(tx_posted_ + static_cast<uint64_t>(i));
      // The signaled last request may be among them, leaving posted zero-copy sends with no
      // completion to come: a reset discards them (lost datagrams, which the protocol repairs)
      // and releases their fences, rather than leave their requests waiting for good.
      if (posted > 0 && fenced) {
        tx_posted_ += static_cast<uint64_t>(posted);
        counters_.tx_datagrams += static_cast<uint64_t>(posted);
        count_payloads(pkts, posted);
        counters_.tx_would_block++;
        reset_qp();
        return posted;
      }
      if (posted == 0 && rc != ENOMEM) return -rc;  // ENOMEM: the send queue is full
    }
  }

  count_payloads(pkts, posted);
  tx_posted_ += static_cast<uint64_t>(posted);
  counters_.tx_datagrams += static_cast<uint64_t>(posted);
  if (posted < n) counters_.tx_would_block++;
  return posted;
}

}  // namespace optireduce::verbs
