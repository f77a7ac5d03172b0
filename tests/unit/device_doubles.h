// Test doubles of a device's side of the datapath, over the in-memory link (mem_link.h): a
// registration, an endpoint that forwards every call to the link (tests derive from it to
// watch or change what passes: a device's zero-copy sends, its receive lanes), and the header
// of a datagram as a tx_burst entry carries it.
#pragma once

#include <memory>
#include <vector>

#include "tests/unit/mem_link.h"
#include "transport/datapath.h"
#include "transport/wire.h"

namespace optireduce::testing {

// A registration of a test buffer; its domain is only an identity, as a datapath sees it.
class FakeRegion final : public MemoryRegion {
 public:
  FakeRegion(const void* base, size_t bytes) : MemoryRegion(base, bytes, &kDomain) {}
  static constexpr int kDomain = 0;
};

class ForwardingEndpoint : public Endpoint {
 public:
  explicit ForwardingEndpoint(std::unique_ptr<MemEndpoint> inner) : inner_(std::move(inner)) {}
  const PeerAddress& local_address() const override { return inner_->local_address(); }
  Status set_peer(const PeerAddress& p) override { return inner_->set_peer(p); }
  int tx_burst(const TxPacket* pkts, int n) override { return inner_->tx_burst(pkts, n); }
  int rx_burst(RxPacket* pkts, int max) override { return inner_->rx_burst(pkts, max); }
  uint32_t max_datagram_bytes() const override { return inner_->max_datagram_bytes(); }
  const DatapathCounters& counters() const override { return inner_->counters(); }
  uint64_t receive_buffer_bytes() const override { return inner_->receive_buffer_bytes(); }

 private:
  std::unique_ptr<MemEndpoint> inner_;
};

// Decodes the header of a tx_burst entry; false when it does not decode. decode checks the
// stated payload length against the datagram's, so the header is decoded as the head of a
// datagram of the entry's full length.
inline bool tx_header(const TxPacket& p, PacketHeader* h) {
  std::vector<uint8_t> d(static_cast<const uint8_t*>(p.hdr),
                         static_cast<const uint8_t*>(p.hdr) + p.hdr_len);
  d.resize(kHeaderBytes + p.payload_len);
  return decode(d.data(), d.size(), h) == DecodeError::kNone;
}

}  // namespace optireduce::testing
