// Endpoint-level datagram throughput and round-trip latency of the UD verbs datapath against
// the UDP datapath, over the same links: meant to run inside the Soft-RoCE VM
// (tests/verbs/run-in-rxe-vm.sh build/bench/verbs_bench), where rxe0/rxe1 and UDP on
// rxeveth0/rxeveth1 cross the same veth pair. rxe is software, so this measures our overheads
// plus the kernel's, never a NIC's speed.
// Usage: verbs_bench [seconds-per-run (default 2)] [udp ifnames (default rxeveth0,rxeveth1)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "transport/params.h"
#include "udp/device.h"
#include "verbs/device_api.h"

namespace optireduce {
namespace {

using Clock = std::chrono::steady_clock;

// Datagrams per tx_burst/rx_burst call: what the transport's progress loop hands over.
constexpr int kBurst = 32;
// Round trips timed for the latency figure (after kWarmup untimed ones).
constexpr int kPingPongs = 2000;
constexpr int kWarmup = 100;

struct Pair {
  std::unique_ptr<Endpoint> a, b;
};

bool open_pair(std::vector<std::unique_ptr<Device>>& devs, Pair* p) {
  if (devs.empty()) return false;
  EndpointOptions o;
  Device* da = devs[0].get();
  Device* db = devs[devs.size() > 1 ? 1 : 0].get();
  if (!da->open_endpoint(o, &p->a).is_ok() || !db->open_endpoint(o, &p->b).is_ok()) return false;
  return p->a->set_peer(p->b->local_address()).is_ok() &&
         p->b->set_peer(p->a->local_address()).is_ok();
}

void throughput(const char* name, Pair& p, uint32_t size, double seconds) {
  std::vector<uint8_t> buf(size, 0xA5);
  TxPacket tx[kBurst];
  for (auto& t : tx) t = TxPacket{buf.data(), 48, size - 48, buf.data() + 48};
  RxPacket rx[kBurst];
  uint64_t sent = 0, got = 0;
  const auto t0 = Clock::now();
  const auto end =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (Clock::now() < end) {
    const int k = p.a->tx_burst(tx, kBurst);
    if (k > 0) sent += static_cast<uint64_t>(k);
    for (int n; (n = p.b->rx_burst(rx, kBurst)) > 0;) got += static_cast<uint64_t>(n);
  }
  // Drain what is still in flight (bounded).
  for (auto t = Clock::now(); Clock::now() - t < std::chrono::milliseconds(300);) {
    const int n = p.b->rx_burst(rx, kBurst);
    if (n > 0) got += static_cast<uint64_t>(n);
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("%-6s %5u B  sent %8.0f/s  received %8.0f/s  %7.3f Gbit/s  delivered %.3f\n", name,
              size, sent / s, got / s, got * size * 8.0 / s / 1e9,
              sent ? double(got) / double(sent) : 0.0);
}

void latency(const char* name, Pair& p) {
  uint8_t msg[64] = {};
  TxPacket t{msg, sizeof(msg), 0, nullptr};
  RxPacket r[kBurst];
  std::vector<double> us;
  us.reserve(kPingPongs);
  for (int i = 0; i < kWarmup + kPingPongs; i++) {
    const auto t0 = Clock::now();
    if (p.a->tx_burst(&t, 1) != 1) continue;
    bool back = false;
    for (auto lim = Clock::now() + std::chrono::milliseconds(200); Clock::now() < lim && !back;) {
      if (p.b->rx_burst(r, kBurst) > 0) {
        while (p.b->tx_burst(&t, 1) == 0) {
        }
      }
      back = p.a->rx_burst(r, kBurst) > 0;
    }
    if (back && i >= kWarmup)
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  std::printf("%-6s round trip 64 B: P50 %.1f us  P99 %.1f us  (%zu of %d)\n", name,
              us[us.size() / 2], us[us.size() * 99 / 100], us.size(), kPingPongs);
}

}  // namespace
}  // namespace optireduce

int main(int argc, char** argv) {
  using namespace optireduce;
  const char* usage =
      "usage: verbs_bench [seconds per run (above 0, at most 3600; default 2)]\n"
      "                   [udp ifnames (default rxeveth0,rxeveth1)]\n";
  if (bench::asks_for_help(argc, argv)) {
    std::fputs(usage, stdout);
    return 0;
  }
  double seconds = 2.0;
  bool bad = argc > 3;
  if (argc > 1) {
    char* end = nullptr;
    seconds = std::strtod(argv[1], &end);
    bad = bad || end == argv[1] || *end != '\0' || !(seconds > 0 && seconds <= 3600);
  }
  if (bad) {
    std::fputs(usage, stderr);
    return 2;
  }
  Config cfg;
  cfg.ifname = argc > 2 ? argv[2] : "rxeveth0,rxeveth1";
  std::vector<std::unique_ptr<Device>> verbs_devs, udp_devs;
  Pair v, u;
  const bool have_verbs = open_verbs_devices(cfg, &verbs_devs).is_ok() && open_pair(verbs_devs, &v);
  bool have_udp = open_udp_devices(cfg, &udp_devs).is_ok() && open_pair(udp_devs, &u);
  if (!have_udp) {
    cfg.ifname = "lo";
    udp_devs.clear();
    have_udp = open_udp_devices(cfg, &udp_devs).is_ok() && open_pair(udp_devs, &u);
  }
  if (have_verbs)
    std::printf("verbs: %s -> %s, max datagram %u\n", verbs_devs[0]->info().name.c_str(),
                verbs_devs.back()->info().name.c_str(), v.a->max_datagram_bytes());
  if (have_udp)
    std::printf("udp:   %s -> %s, max datagram %u\n", udp_devs[0]->info().name.c_str(),
                udp_devs.back()->info().name.c_str(), u.a->max_datagram_bytes());
  for (uint32_t size : {256u, 1024u, 4096u}) {
    if (have_verbs && size <= v.a->max_datagram_bytes()) throughput("verbs", v, size, seconds);
    if (have_udp && size <= u.a->max_datagram_bytes()) throughput("udp", u, size, seconds);
  }
  if (have_verbs) latency("verbs", v);
  if (have_udp) latency("udp", u);
  return have_verbs || have_udp ? 0 : 1;
}
