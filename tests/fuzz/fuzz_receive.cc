// libFuzzer target: arbitrary bytes, cut into datagrams, go through decode() and into a receive
// connection with posted buffers in both delivery modes. Built with ASan+UBSan, so any write
// outside the posted buffers or any undefined behaviour is a crash; the guards around the
// buffers are checked as well.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/fuzz/input.h"
#include "tests/unit/mem_link.h"
#include "transport/log.h"
#include "transport/recv.h"
#include "transport/wire.h"

namespace {

using optireduce::Config;
using optireduce::ConnParams;
using optireduce::Delivery;
using optireduce::FakeClock;
using optireduce::Fill;
using optireduce::RecvConn;
using optireduce::Request;

constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xA5;

void run(const uint8_t* data, size_t size, Delivery delivery) {
  FakeClock clock;
  Config cfg;
  cfg.timeout_ms = 1;
  auto pair = optireduce::testing::make_mem_pair(1048);
  auto to_rx = pair.ab;
  ConnParams p;
  // The first input bytes choose the token, so matching tokens are reachable.
  p.token = size >= 1 ? data[0] : 0;
  p.pkt_payload = optireduce::payload_for_datagram(1048);
  p.peer_window = 1 << 20;
  p.delivery = delivery;
  p.fill = Fill::kMarker;
  RecvConn r(cfg, clock, std::move(pair.b), p, nullptr);
  // Bounded receives divide a downlink's credit, as the engine's do.
  if (delivery == Delivery::kBounded) r.set_downlink(std::make_shared<optireduce::Downlink>());
  // Three posted receives of different capacities, each between guards.
  std::vector<uint8_t> mem[3];
  Request* req[3] = {};
  const size_t caps[3] = {0, 1000, 4096};
  for (int i = 0; i < 3; ++i) {
    mem[i].assign(caps[i] + 2 * kGuard, kGuardByte);
    (void)r.irecv(mem[i].data() + kGuard, caps[i], &req[i]);
  }
  // Input: records. Kind byte odd: a structured packet built from the next bytes with a real
  // header (so most reach the bounds checks); even: raw bytes [len u16][bytes].
  optireduce::fuzz::Input in(data, size, 1);
  const auto take = [&in](size_t n) { return in.take(n); };
  while (in.more()) {
    std::vector<uint8_t> d;
    if (take(1) & 1) {
      optireduce::PacketHeader h;
      h.type = static_cast<optireduce::PacketType>(1 + take(1) % optireduce::kMaxPacketType);
      h.flags = static_cast<uint16_t>(take(1) & optireduce::kKnownFlags);
      h.token = p.token;
      h.msg_seq = take(1) % 6;
      h.msg_size = take(2) % 5000;
      const uint32_t grid = take(1);
      h.offset = (grid & 1) ? (grid >> 1) % 6 * p.pkt_payload : take(2) % 5000;
      const uint32_t len = take(2) % 1100;
      h.payload_len = len;
      d.assign(optireduce::kHeaderBytes + len, 0x3C);
      optireduce::encode(h, d.data());
    } else {
      d = in.raw();
    }
    to_rx->q.push_back(std::move(d));
    clock.advance_us(300);
    for (int i = 0; i < 3; ++i) {
      bool done = false;
      size_t got = 0;
      if (req[i] != nullptr && r.test(req[i], &done, &got).is_ok() && done) {
        if (got > caps[i]) __builtin_trap();
        req[i] = nullptr;
      }
    }
  }
  for (auto& m : mem) {
    for (size_t i = 0; i < kGuard; ++i)
      if (m[i] != kGuardByte || m[m.size() - 1 - i] != kGuardByte) __builtin_trap();
  }
}

}  // namespace

// The connection's warnings are still formatted (that code runs too), but not printed: a peer
// that closed or a spoofed token is what most inputs are, and stderr would be most of the time.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  optireduce::log_set_sink([](optireduce::LogLevel, const char*, int, const char*) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  optireduce::PacketHeader h;
  (void)optireduce::decode(data, size, &h);
  run(data, size, Delivery::kExact);
  run(data, size, Delivery::kBounded);
  return 0;
}
