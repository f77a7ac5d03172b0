// Connection set-up: the listen side (ListenCommImpl) and a connect in progress
// (PendingConnect). Both are non-blocking state machines polled by NCCL's repeated calls:
//
//   sender (connect)                          receiver (listen/accept)
//   Idle --send HELLO--> WaitAck              Listening
//        (HELLO again every 10 ms, doubling)   --HELLO with our token--> make RecvConn,
//   WaitAck --HELLO_ACK with token--> make       answer HELLO_ACK, Accepted
//        SendConn, Done                        (a repeated HELLO is answered by the RecvConn)
//
// The legal edges, the only ones each side's transition accepts (an illegal one fails the
// handshake with kInternal and says so):
//   connect: Idle    -> WaitAck   the first HELLO left (later polls in WaitAck repeat it)
//            WaitAck -> Done      a HELLO_ACK with the reply token: the SendConn is handed out,
//                                 the endpoint with it
//            Idle    -> Failed    the endpoint failed
//            WaitAck -> Failed
//   listen:  Listening -> Accepted  a HELLO with our token: the RecvConn is handed out, the
//                                   endpoint with it
//            Listening -> Failed    the endpoint failed
// Done, Accepted and Failed are final: the endpoint is gone or broken, so a later call is the
// caller's error (kInternal), not a crash. A HELLO_ACK in Idle answers no HELLO of ours (none
// has left yet): it is dropped as stale or spoofed.
#pragma once

#include <memory>

#include "transport/conn.h"

namespace optireduce {

class EngineImpl;

class ListenCommImpl final : public ListenComm {
 public:
  enum class State : uint8_t { kListening, kAccepted, kFailed };
  static constexpr bool legal_transition(State from, State to) {
    return from == State::kListening && (to == State::kAccepted || to == State::kFailed);
  }

  ListenCommImpl(EngineImpl* engine, int dev, std::unique_ptr<Endpoint> ep, uint64_t token,
                 BoundedGroup* group);
  Status accept(std::unique_ptr<RecvComm>* out) override;

 private:
  // Moves to `to` if the edge is legal; else fails the handshake (false).
  bool set_state(State to);

  State state_ = State::kListening;
  EngineImpl* engine_;
  int dev_;                       // whose downlink the connection's credit divides
  std::unique_ptr<Endpoint> ep_;  // handed to the RecvConn on accept
  uint64_t token_;
  BoundedGroup* group_;
  uint64_t dropped_ = 0;
};

class PendingConnect {
 public:
  enum class State : uint8_t { kIdle, kWaitAck, kDone, kFailed };
  static constexpr bool legal_transition(State from, State to) {
    return (from == State::kIdle && (to == State::kWaitAck || to == State::kFailed)) ||
           (from == State::kWaitAck && (to == State::kDone || to == State::kFailed));
  }

  PendingConnect(int dev, std::unique_ptr<Endpoint> ep, const ConnectionHandle& h,
                 const ConnOptions& opts);
  // Advances the handshake; *out becomes non-null once it completed.
  Status poll(EngineImpl* engine, std::unique_ptr<SendComm>* out);

 private:
  // Moves to `to` if the edge is legal; else fails the handshake (false).
  bool set_state(State to);
  // The first HELLO_ACK of `pkts` that answers our HELLO, or -1; the others are dropped.
  int find_hello_ack(const RxPacket* pkts, int n, HelloBody* peer);
  Status send_hello(uint64_t now);

  State state_ = State::kIdle;
  int dev_;
  std::unique_ptr<Endpoint> ep_;
  ConnectionHandle handle_;
  ConnOptions opts_;
  // The largest datagram this side can exchange with the peer (Endpoint::max_datagram_bytes_to:
  // over UDP a probe of the route, so asked once, not per HELLO).
  uint32_t max_datagram_;
  uint64_t next_hello_ns_ = 0;
  uint64_t backoff_ns_;
};

}  // namespace optireduce
