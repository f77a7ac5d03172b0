// Handshake state machines: HELLO / HELLO_ACK with token checks and retransmission.
#include "transport/handshake.h"

#include <algorithm>

#include "transport/bounded.h"
#include "transport/engine.h"
#include "transport/log.h"
#include "transport/recv.h"
#include "transport/send.h"

namespace optireduce {

namespace {
constexpr uint64_t kHelloFirstRetryNs = 10'000'000;  // well above any LAN RTT, well below NCCL's patience
constexpr uint64_t kHelloMaxRetryNs = 500'000'000;

// Both sides' transition: moves *state to `to` where Side::legal_transition allows it, else
// fails the handshake (kFailed) and says so.
template <typename Side>
bool move_to(typename Side::State* state, typename Side::State to, const char* side,
             uint64_t token) {
  if (!Side::legal_transition(*state, to)) {
    OR_WARN("%s %016llx: illegal handshake state change %d -> %d", side,
            static_cast<unsigned long long>(token), static_cast<int>(*state), static_cast<int>(to));
    *state = Side::State::kFailed;
    return false;
  }
  *state = to;
  return true;
}
}  // namespace

bool ListenCommImpl::set_state(State to) {
  return move_to<ListenCommImpl>(&state_, to, "listen", token_);
}

ListenCommImpl::ListenCommImpl(EngineImpl* engine, int dev, std::unique_ptr<Endpoint> ep,
                               uint64_t token, BoundedGroup* group)
    : engine_(engine), dev_(dev), ep_(std::move(ep)), token_(token), group_(group) {}

Status ListenCommImpl::accept(std::unique_ptr<RecvComm>* out) {
  *out = nullptr;
  if (state_ != State::kListening) {
    // NCCL accepts once per listen comm; the endpoint went to that connection (or broke).
    OR_WARN("listen %016llx: accept called again after the handshake %s",
            static_cast<unsigned long long>(token_),
            state_ == State::kAccepted ? "completed" : "failed");
    return Status(Errc::kInternal);
  }
  RxPacket pkts[16];
  const int n = ep_->rx_burst(pkts, 16);
  if (n < 0) {
    set_state(State::kFailed);
    return Status(Errc::kSystem, -n);
  }
  for (int i = 0; i < n; ++i) {
    PacketHeader h;
    HelloBody peer;
    if (decode(pkts[i].data, pkts[i].len, &h) != DecodeError::kNone ||
        h.type != PacketType::kHello || h.token != token_ ||
        !decode_hello(pkts[i].data + kHeaderBytes, h.payload_len, &peer)) {
      ++dropped_;  // a stray, stale or spoofed datagram on a fresh port
      continue;
    }
    Status st = ep_->set_peer(pkts[i].from);
    if (!st) {
      set_state(State::kFailed);
      return st;
    }
    const Config& cfg = engine_->config();
    HelloBody mine;
    mine.max_datagram_bytes = ep_->max_datagram_bytes_to(pkts[i].from);
    const uint32_t pkt_payload =
        payload_for_datagram(std::min(mine.max_datagram_bytes, peer.max_datagram_bytes));
    // What this endpoint can hold: the window the sender keeps to (never the size asked for).
    mine.window_bytes = receive_window_bytes(*ep_, pkt_payload);
    mine.features = peer.features;
    uint8_t body[kHelloBodyBytes];
    encode_hello(mine, body);
    PacketHeader a;
    a.type = PacketType::kHelloAck;
    a.token = reply_token(token_);
    a.payload_len = kHelloBodyBytes;
    uint8_t hdr[kHeaderBytes];
    encode(a, hdr);
    TxPacket p{hdr, kHeaderBytes, kHelloBodyBytes, body};
    if (ep_->tx_burst(&p, 1) < 0) {
      set_state(State::kFailed);
      return Status(Errc::kSystem);
    }
    if (!set_state(State::kAccepted)) return Status(Errc::kInternal);
    ConnParams params;
    params.token = token_;
    params.pkt_payload = pkt_payload;
    params.peer_window = peer.window_bytes;
    params.delivery = (peer.features & kFeatureBounded) ? Delivery::kBounded : Delivery::kExact;
    params.fill = (peer.features & kFeatureMarkerFill) ? Fill::kMarker : Fill::kZero;
    params.until_started =
        params.delivery == Delivery::kBounded && (peer.features & kFeatureUntilStarted) != 0;
    auto conn = std::make_unique<RecvConn>(cfg, engine_->clock(), std::move(ep_), params,
                                           engine_->registry());
    conn->set_hello_ack(body);
    if (params.delivery == Delivery::kBounded) conn->set_downlink(engine_->downlink(dev_));
    if (group_ != nullptr) {
      conn->set_deadline_policy(group_);
      conn->set_conn_group(group_);
    }
    conn->activate();
    if (dropped_) OR_INFO("listen: %llu stray datagrams dropped before accept",
                          static_cast<unsigned long long>(dropped_));
    *out = std::move(conn);
    return Status::ok();
  }
  return Status::ok();
}

bool PendingConnect::set_state(State to) {
  return move_to<PendingConnect>(&state_, to, "connect", handle_.token);
}

PendingConnect::PendingConnect(int dev, std::unique_ptr<Endpoint> ep, const ConnectionHandle& h,
                               const ConnOptions& opts)
    : dev_(dev),
      ep_(std::move(ep)),
      handle_(h),
      opts_(opts),
      max_datagram_(ep_->max_datagram_bytes_to(h.addr)),
      backoff_ns_(kHelloFirstRetryNs) {}

int PendingConnect::find_hello_ack(const RxPacket* pkts, int n, HelloBody* peer) {
  if (state_ == State::kIdle) return -1;  // none answers a HELLO of ours: none has left
  for (int i = 0; i < n; ++i) {
    PacketHeader h;
    if (decode(pkts[i].data, pkts[i].len, &h) != DecodeError::kNone ||
        h.type != PacketType::kHelloAck || h.token != reply_token(handle_.token) ||
        !decode_hello(pkts[i].data + kHeaderBytes, h.payload_len, peer))
      continue;
    return i;
  }
  return -1;
}

Status PendingConnect::send_hello(uint64_t now) {
  HelloBody mine;
  mine.max_datagram_bytes = max_datagram_;
  // The peer's datagram size is unknown until it answers, so packets of our largest size;
  // only control packets travel this way (the receiver sends no data).
  mine.window_bytes = receive_window_bytes(*ep_, payload_for_datagram(mine.max_datagram_bytes));
  mine.features = (opts_.delivery == Delivery::kBounded ? kFeatureBounded : 0) |
                  (opts_.fill == Fill::kMarker ? kFeatureMarkerFill : 0) |
                  (opts_.until_started ? kFeatureUntilStarted : 0);
  uint8_t body[kHelloBodyBytes];
  encode_hello(mine, body);
  PacketHeader hh;
  hh.type = PacketType::kHello;
  hh.token = handle_.token;
  hh.payload_len = kHelloBodyBytes;
  uint8_t hdr[kHeaderBytes];
  encode(hh, hdr);
  TxPacket p{hdr, kHeaderBytes, kHelloBodyBytes, body};
  const int sent = ep_->tx_burst(&p, 1);
  if (sent < 0) {
    set_state(State::kFailed);
    return Status(Errc::kSystem, -sent);
  }
  next_hello_ns_ = now + backoff_ns_;
  backoff_ns_ = std::min(backoff_ns_ * 2, kHelloMaxRetryNs);
  if (state_ == State::kIdle && !set_state(State::kWaitAck)) return Status(Errc::kInternal);
  return Status::ok();
}

Status PendingConnect::poll(EngineImpl* engine, std::unique_ptr<SendComm>* out) {
  *out = nullptr;
  if (state_ == State::kDone || state_ == State::kFailed) {
    OR_WARN("connect %016llx: polled again after the handshake %s",
            static_cast<unsigned long long>(handle_.token),
            state_ == State::kDone ? "completed" : "failed");
    return Status(Errc::kInternal);
  }
  const uint64_t now = engine->clock().now_ns();
  RxPacket pkts[16];
  const int n = ep_->rx_burst(pkts, 16);
  if (n < 0) {
    set_state(State::kFailed);
    return Status(Errc::kSystem, -n);
  }
  HelloBody peer;
  const int i = find_hello_ack(pkts, n, &peer);
  if (i >= 0) {
    if (!set_state(State::kDone)) return Status(Errc::kInternal);
    ConnParams params;
    params.token = handle_.token;
    params.pkt_payload = payload_for_datagram(std::min(max_datagram_, peer.max_datagram_bytes));
    params.peer_window = peer.window_bytes;
    params.delivery = opts_.delivery;
    params.fill = opts_.fill;
    params.until_started = opts_.delivery == Delivery::kBounded && opts_.until_started;
    auto path = engine->path_to(dev_, *ep_, params.pkt_payload);
    auto conn = std::make_unique<SendConn>(engine->config(), engine->clock(), std::move(ep_),
                                           params, engine->registry(), std::move(path));
    if (opts_.group != nullptr) {
      conn->set_group(opts_.group);
      conn->set_conn_group(opts_.group);
    }
    // A CTS can follow the HELLO_ACK in the same burst; it belongs to the new connection.
    for (int j = i + 1; j < n; ++j) conn->receive_datagram(pkts[j].data, pkts[j].len);
    conn->activate();
    *out = std::move(conn);
    return Status::ok();
  }
  if (now >= next_hello_ns_) return send_hello(now);
  return Status::ok();
}

}  // namespace optireduce
