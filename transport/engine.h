// The process-wide transport state behind Engine (transport.h): devices, the registry of live
// connections, the progress thread, connects in progress.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/congestion.h"
#include "transport/conn.h"
#include "transport/credit.h"
#include "transport/endpoint_mux.h"
#include "transport/handshake.h"
#include "transport/progress_thread.h"

namespace optireduce {

class EngineImpl final : public Engine {
 public:
  EngineImpl(const Config& cfg, const Clock& clock, std::vector<std::unique_ptr<Device>> devices);
  ~EngineImpl() override;  // stop_progress(), then the members

  // Stops and joins the progress thread for good (issue 10: the end of the process, the unload
  // of the library that embeds the transport). Idempotent and callable from any thread but the
  // progress thread; comms stay valid memory, but nothing progresses them in the background.
  void stop_progress();

  int device_count() const override { return static_cast<int>(devices_.size()); }
  const DeviceInfo& device(int dev) const override { return devices_[dev]->info(); }
  const Config& config() const override { return cfg_; }
  const Clock& clock() const override { return clock_; }
  Status listen(int dev, ConnectionHandle* handle, std::unique_ptr<ListenComm>* out,
                BoundedGroup* group) override;
  Status connect(int dev, const ConnectionHandle& handle, const ConnOptions& opts, void** state,
                 std::unique_ptr<SendComm>* out) override;
  Status register_memory(int dev, void* data, size_t bytes, std::unique_ptr<MemoryRegion>* out,
                         int dmabuf_fd, uint64_t dmabuf_offset) override;

  const std::shared_ptr<Registry>& registry() const { return registry_; }
  EndpointOptions endpoint_options() const;
  // Opens an endpoint on `dev` for the connection end whose incoming datagrams carry
  // `rx_token`: a port of the calling thread's shared endpoint on that device where the device
  // can share (OPTIREDUCE_SHARED_ENDPOINT), else an endpoint of its own; behind the fault
  // injector when OPTIREDUCE_FAULT_* asks.
  Status open_endpoint(int dev, uint64_t rx_token, std::unique_ptr<Endpoint>* out);
  // The congestion state of the path from device `dev` to `ep`'s peer host, shared by every
  // connection between the two (congestion.h); a private one where the host is unknown.
  std::shared_ptr<Path> path_to(int dev, const Endpoint& ep, uint32_t pkt_payload);
  // The receiving side of device `dev`: the credit its bounded receives share (credit.h).
  std::shared_ptr<Downlink> downlink(int dev) { return downlinks_.get(dev); }

 private:
  void progress_loop();
  // The calling thread's shared endpoint on `dev`, opened on first use.
  Status mux_for(int dev, std::shared_ptr<EndpointMux>* out);
  // The shared endpoints open now into *out, after closing those that have had no port for
  // a peer timeout (see muxes_); the progress thread reuses one vector, so a pass allocates
  // nothing.
  void live_muxes(std::vector<std::shared_ptr<EndpointMux>>* out);

  const Config cfg_;
  const Clock& clock_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::shared_ptr<Registry> registry_;
  PathTable paths_;
  DownlinkTable downlinks_;
  std::atomic<uint64_t> endpoints_opened_{0};

  // Shared endpoints, one per device and thread that opened connections on it. Each stays
  // open for OPTIREDUCE_PEER_TIMEOUT_MS after its last port closed: it answers a peer that
  // missed a CLOSE (endpoint_mux.h), and a thread that connects again meanwhile reuses it.
  // Closed any sooner, the socket of a thread's last connection would go with that connection,
  // and a peer still retransmitting to it (its final ACK and both CLOSEs lost) would be told
  // "port unreachable" and fail a send the receiver had completed. A peer that hears nothing
  // for a peer timeout gives up anyway, so keeping it longer answers nobody.
  struct MuxEntry {
    int dev;
    std::thread::id thread;
    std::shared_ptr<EndpointMux> mux;
  };
  std::mutex muxes_mu_;
  std::vector<MuxEntry> muxes_;

  std::mutex pending_mu_;
  std::vector<std::unique_ptr<PendingConnect>> pending_;

  std::mutex thread_mu_;
  std::condition_variable thread_cv_;
  // Set under thread_mu_ (the timed sleep's predicate); read by the idle sleep without it.
  std::atomic<bool> stop_{false};
  // Ends the thread's idle sleep (idle_sleep.h); the registry and the shared endpoints hold it.
  const std::shared_ptr<ProgressWaker> waker_ = std::make_shared<ProgressWaker>();
  std::thread thread_;
  std::mutex join_mu_;  // a second stop_progress() waits for the first one's join
};

uint64_t random_token();

}  // namespace optireduce
