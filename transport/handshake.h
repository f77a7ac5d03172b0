// Connection set-up: the listen side (ListenCommImpl) and a connect in progress
// (PendingConnect). Both are non-blocking state machines polled by NCCL's repeated calls:
//
//   sender (connect)                          receiver (listen/accept)
//   Idle --send HELLO--> WaitAck              Listening
//        (HELLO again every 10 ms, doubling)   --HELLO with our token--> make RecvConn,
//   WaitAck --HELLO_ACK with token--> make       answer HELLO_ACK, Accepted
//        SendConn, Done                        (a repeated HELLO is answered by the RecvConn)
#pragma once

#include <memory>

#include "transport/conn.h"

namespace optireduce {

class EngineImpl;

class ListenCommImpl final : public ListenComm {
 public:
  ListenCommImpl(EngineImpl* engine, int dev, std::unique_ptr<Endpoint> ep, uint64_t token,
                 BoundedGroup* group);
  Status accept(std::unique_ptr<RecvComm>* out) override;

 private:
  EngineImpl* engine_;
  int dev_;                       // whose downlink the connection's credit divides
  std::unique_ptr<Endpoint> ep_;  // handed to the RecvConn on accept
  uint64_t token_;
  BoundedGroup* group_;
  uint64_t dropped_ = 0;
};

class PendingConnect {
 public:
  PendingConnect(int dev, std::unique_ptr<Endpoint> ep, const ConnectionHandle& h,
                 const ConnOptions& opts);
  // Advances the handshake; *out becomes non-null once it completed.
  Status poll(EngineImpl* engine, std::unique_ptr<SendComm>* out);

 private:
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
