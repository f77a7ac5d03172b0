// HostExchange (see host_exchange.h): connection set-up through the store, and one phase =
// all isends at once, irecvs round by round, then wait. This thread posts and tests; between
// tests it blocks until the network answers (wait_for_work), so that ranks sharing a few cores
// leave them to each other and to the kernel's packet processing.
#include "collectives/host_exchange.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "transport/bounded.h"
#include "transport/log.h"

namespace optireduce::coll {
namespace {

// A hard stop for waits that can only end by a peer's action: an exact receive from a rank that
// died. Long enough for any real exchange on the slowest link we support.
constexpr auto kHangLimit = std::chrono::seconds(300);

std::string key(const std::string& prefix, int mode, int from, int to) {
  return prefix + "/conn/" + std::to_string(mode) + "/" + std::to_string(from) + "/" +
         std::to_string(to);
}

// One line per connection at close (OPTIREDUCE_LOG=info), as the plugin logs its own: where a
// rank's time went under loss (retransmissions, timer expiries, probes) and what it dropped.
void log_close(const char* dir, int mode, int peer, const ConnStats& s) {
  OR_INFO("%s %s conn with rank %d: %s", mode == 0 ? "exact" : "bounded", dir, peer,
          conn_stats_text(s).c_str());
}

}  // namespace

HostExchange::~HostExchange() {
  if (log_enabled(LogLevel::kInfo)) {
    for (int m = 0; m < 2; ++m) {
      for (size_t p = 0; p < send_[m].size(); ++p)
        if (send_[m][p]) log_close("send", m, int(p), send_[m][p]->stats());
      for (size_t p = 0; p < recv_[m].size(); ++p)
        if (recv_[m][p]) log_close("recv", m, int(p), recv_[m][p]->stats());
    }
  }
  // Comms before the group their receives report to, and everything before the engine.
  for (int m = 0; m < 2; ++m) {
    send_[m].clear();
    recv_[m].clear();
    listen_[m].clear();
  }
  group_.reset();
  engine_.reset();
}

Status HostExchange::create(Store* store, const std::string& prefix, int rank, int nranks,
                            int timeout_ms, std::unique_ptr<HostExchange>* out,
                            std::string* error) {
  std::unique_ptr<HostExchange> ex(new HostExchange());
  ex->rank_ = rank;
  ex->nranks_ = nranks;
  if (Status s = Engine::acquire(&ex->engine_); !s) {
    *error = std::string("transport engine: ") + errc_name(s.code());
    return s;
  }
  if (ex->engine_->device_count() < 1) {
    *error = "transport engine: no device (check OPTIREDUCE_IFNAME / OPTIREDUCE_DATAPATH)";
    return Status(Errc::kInvalidUsage);
  }
  ex->group_ = std::make_unique<BoundedGroup>(ex->engine_->config());
  for (int m = 0; m < 2; ++m) {
    ex->listen_[m].resize(size_t(nranks));
    ex->send_[m].resize(size_t(nranks));
    ex->recv_[m].resize(size_t(nranks));
  }
  if (Status s = ex->connect_all(store, prefix, timeout_ms); !s) {
    *error = ex->error_;
    return s;
  }
  *out = std::move(ex);
  return Status::ok();
}

Status HostExchange::connect_all(Store* store, const std::string& prefix, int timeout_ms) {
  // Listen for every peer, in both modes, and publish the handles.
  for (int m = 0; m < 2; ++m) {
    for (int p = 0; p < nranks_; ++p) {
      if (p == rank_) continue;
      ConnectionHandle h;
      if (Status s = engine_->listen(0, &h, &listen_[m][size_t(p)], group_.get()); !s) {
        error_ = std::string("listen: ") + errc_name(s.code());
        return s;
      }
      std::string bytes(sizeof(h), '\0');
      std::memcpy(bytes.data(), &h, sizeof(h));
      if (Status s = store->set(key(prefix, m, p, rank_), bytes); !s) {
        error_ = store->error();
        return s;
      }
    }
  }
  // Fetch the peers' handles, then drive connects and accepts together until all are done
  // (each side's connect completes only while the other side accepts).
  std::vector<ConnectionHandle> handles(size_t(2 * nranks_));
  for (int m = 0; m < 2; ++m) {
    for (int p = 0; p < nranks_; ++p) {
      if (p == rank_) continue;
      std::string bytes;
      if (Status s = store->get(key(prefix, m, rank_, p), &bytes, timeout_ms); !s) {
        error_ = store->error();
        return s;
      }
      if (bytes.size() != sizeof(ConnectionHandle)) {
        error_ = "rendezvous: malformed connection handle from rank " + std::to_string(p);
        return Status(Errc::kRemote);
      }
      std::memcpy(&handles[size_t(m * nranks_ + p)], bytes.data(), bytes.size());
    }
  }
  std::vector<void*> states(size_t(2 * nranks_), nullptr);
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  PollBackoff backoff;
  for (;;) {
    bool all = true;
    for (int m = 0; m < 2; ++m) {
      ConnOptions o;
      o.delivery = m == 1 ? Delivery::kBounded : Delivery::kExact;
      o.fill = Fill::kMarker;
      o.group = group_.get();
      for (int p = 0; p < nranks_; ++p) {
        if (p == rank_) continue;
        const size_t i = size_t(m * nranks_ + p);
        if (!send_[m][size_t(p)]) {
          Status s = engine_->connect(0, handles[i], o, &states[i], &send_[m][size_t(p)]);
          if (!s) {
            error_ = "connect to rank " + std::to_string(p) + ": " + errc_name(s.code());
            return s;
          }
        }
        if (!recv_[m][size_t(p)]) {
          Status s = listen_[m][size_t(p)]->accept(&recv_[m][size_t(p)]);
          if (!s) {
            error_ = "accept from rank " + std::to_string(p) + ": " + errc_name(s.code());
            return s;
          }
        }
        all = all && send_[m][size_t(p)] && recv_[m][size_t(p)];
      }
    }
    if (all) break;
    if (std::chrono::steady_clock::now() > end) {
      error_ = "connecting the ranks timed out";
      return Status(Errc::kRemote);
    }
    backoff.pause();
  }
  for (int m = 0; m < 2; ++m) listen_[m].clear();
  return Status::ok();
}

Status HostExchange::wait(Request* req, size_t* size, bool is_send, int peer) {
  const auto end = std::chrono::steady_clock::now() + kHangLimit;
  PollBackoff backoff;
  for (;;) {
    bool done = false;
    Status s = test_request(req, &done, size);
    if (!s) {
      error_ = std::string(is_send ? "send to" : "receive from") + " rank " + std::to_string(peer) +
               " failed: " + errc_name(s.code());
      return s;
    }
    if (done) return Status::ok();
    if (std::chrono::steady_clock::now() > end) {
      error_ = std::string(is_send ? "send to" : "receive from") + " rank " + std::to_string(peer) +
               " did not complete (peer gone?)";
      return Status(Errc::kRemote);
    }
    backoff.pause(phase_requests());
  }
}

Status HostExchange::begin_phase(Mode mode, int, std::span<RecvOp> recvs,
                                 std::span<const uint32_t> round_end) {
  if (abandoned_) return failed_earlier();
  mode_ = lossy(mode) ? 1 : 0;
  recv_how_ = mode == Mode::kUntilStarted ? MsgDelivery::kUntilStarted : MsgDelivery::kAsConnection;
  recvs_ = recvs;
  round_end_ = round_end;
  recvs_done_ = 0;
  round_ = 0;
  arrival_backoff_.restart();
  sends_.clear();
  send_reqs_.clear();
  recv_reqs_.assign(recvs.size(), nullptr);
  recv_before_.resize(recvs.size());
  return round_end.empty() ? Status::ok() : abandon_unless_ok(post_round(0));
}

std::span<Request* const> HostExchange::phase_requests() {
  wait_set_.assign(recv_reqs_.begin(), recv_reqs_.end());
  wait_set_.insert(wait_set_.end(), send_reqs_.begin(), send_reqs_.end());
  return wait_set_;
}

Status HostExchange::failed_earlier() {
  error_ = "the exchange failed earlier and closed its connections";
  return Status(Errc::kInternal);
}

Status HostExchange::abandon_unless_ok(Status s) {
  if (s) return s;
  // Requests still posted would go on reading and writing the phase's buffers after the caller
  // got the error, and the caller may free them (the scratch of a communicator being aborted, a
  // tensor DDP drops): closing every connection ends them all now. The peers see the close and
  // fail at once instead of waiting for this rank; the ranks are out of step anyway.
  for (int m = 0; m < 2; ++m) {
    send_[m].clear();
    recv_[m].clear();
    listen_[m].clear();
  }
  send_reqs_.clear();
  recv_reqs_.clear();
  abandoned_ = true;
  return s;
}

Status HostExchange::post_round(size_t q) {
  const uint32_t begin = q == 0 ? 0 : round_end_[q - 1];
  for (uint32_t i = begin; i < round_end_[q]; ++i) {
    RecvOp& op = recvs_[i];
    RecvComm* c = recv_[mode_][size_t(op.peer)].get();
    recv_before_[i] = c->stats();
    PollBackoff backoff;
    const auto end = std::chrono::steady_clock::now() + kHangLimit;
    while (recv_reqs_[i] == nullptr) {
      if (Status s = c->irecv(op.data, op.bytes, recv_how_, &recv_reqs_[i]); !s) {
        error_ = "irecv from rank " + std::to_string(op.peer) + ": " + errc_name(s.code());
        return s;
      }
      if (recv_reqs_[i] == nullptr) {
        if (std::chrono::steady_clock::now() > end) {
          error_ = "irecv from rank " + std::to_string(op.peer) + " stayed back-pressured";
          return Status(Errc::kRemote);
        }
        backoff.pause(phase_requests());
      }
    }
  }
  return Status::ok();
}

Status HostExchange::post_sends(std::span<const SendOp> sends) {
  if (abandoned_) return failed_earlier();
  return abandon_unless_ok(post_sends_now(sends));
}

Status HostExchange::post_sends_now(std::span<const SendOp> sends) {
  for (const SendOp& op : sends) {
    const size_t i = sends_.size();
    sends_.push_back(op);
    sends_.back().ready = std::min(op.ready, op.bytes);
    send_reqs_.push_back(nullptr);
    SendComm* c = send_[mode_][size_t(op.peer)].get();
    PollBackoff backoff;
    const auto end = std::chrono::steady_clock::now() + kHangLimit;
    while (send_reqs_[i] == nullptr) {
      const Status s = op.ready >= op.bytes
                           ? c->isend(op.data, op.bytes, &send_reqs_[i])
                           : c->isend_held(op.data, op.bytes, op.ready, &send_reqs_[i]);
      if (!s) {
        error_ = "isend to rank " + std::to_string(op.peer) + ": " + errc_name(s.code());
        return s;
      }
      if (send_reqs_[i] == nullptr) {
        if (std::chrono::steady_clock::now() > end) {
          error_ = "isend to rank " + std::to_string(op.peer) + " stayed back-pressured";
          return Status(Errc::kRemote);
        }
        backoff.pause(phase_requests());
      }
    }
  }
  return Status::ok();
}

Status HostExchange::release_send(size_t k, size_t ready) {
  if (abandoned_) return failed_earlier();
  if (k >= sends_.size() || ready > sends_[k].bytes) {
    error_ = "release_send: no send " + std::to_string(k) + " of " + std::to_string(ready) +
             " bytes in this phase";
    return abandon_unless_ok(Status(Errc::kInvalidUsage));
  }
  if (ready <= sends_[k].ready) return Status::ok();
  sends_[k].ready = ready;
  Status s = send_[mode_][size_t(sends_[k].peer)]->release(send_reqs_[k], ready);
  if (!s) error_ = "release to rank " + std::to_string(sends_[k].peer) + ": " + errc_name(s.code());
  return abandon_unless_ok(s);
}

uint64_t HostExchange::sent_bytes(size_t k) {
  if (abandoned_ || k >= sends_.size() || send_reqs_[k] == nullptr) return 0;
  return send_[mode_][size_t(sends_[k].peer)]->sent_prefix(send_reqs_[k]);
}

Status HostExchange::end_phase() {
  if (abandoned_) return failed_earlier();
  return abandon_unless_ok(wait_phase());
}

Status HostExchange::wait_arrivals(size_t n, uint64_t step) {
  if (abandoned_) return failed_earlier();
  return abandon_unless_ok(wait_arrivals_now(n, step));
}

Status HostExchange::post_ready_rounds() {
  // Round q + 1 is posted once round q completed: this is how a receiver bounds its incast.
  // Rounds may be empty (no shard from those peers).
  while (round_ + 1 < round_end_.size() && recvs_done_ >= round_end_[round_]) {
    if (Status s = post_round(++round_); !s) return s;
  }
  return Status::ok();
}

Status HostExchange::finish_recv(size_t i, size_t got) {
  RecvOp& op = recvs_[i];
  if (got != op.bytes) {
    error_ = "receive from rank " + std::to_string(op.peer) + ": " + std::to_string(got) +
             " bytes, expected " + std::to_string(op.bytes) + " (ranks called differently)";
    return Status(Errc::kInternal);
  }
  const ConnStats after = recv_[mode_][size_t(op.peer)]->stats();
  op.lost_bytes = after.bytes_lost - recv_before_[i].bytes_lost;
  op.deadline_hit = after.deadline_hits > recv_before_[i].deadline_hits;
  op.arrived = op.bytes;
  op.done = true;
  recv_reqs_[i] = nullptr;
  while (recvs_done_ < recvs_.size() && recvs_[recvs_done_].done) ++recvs_done_;
  return Status::ok();
}

Status HostExchange::wait_recvs_now(size_t n) {
  n = std::min(n, recvs_.size());
  while (recvs_done_ < n) {
    if (Status s = post_ready_rounds(); !s) return s;
    // The first receive not done; every earlier one is, so its round is posted.
    const size_t i = recvs_done_;
    size_t got = 0;
    if (Status s = wait(recv_reqs_[i], &got, false, recvs_[i].peer); !s) return s;
    if (Status s = finish_recv(i, got); !s) return s;
  }
  return Status::ok();
}

Status HostExchange::wait_arrivals_now(size_t n, uint64_t step) {
  n = std::min(n, recvs_.size());
  const auto end = std::chrono::steady_clock::now() + kHangLimit;
  while (recvs_done_ < n) {
    if (Status s = post_ready_rounds(); !s) return s;
    const size_t posted = std::min<size_t>(n, round_end_[round_]);
    // One test per pass drives the transport (a drain of the shared endpoint serves every
    // connection), taking the posted receives in turn; the others' prefixes are only read.
    size_t probe = posted;
    for (size_t k = 0; k < posted - recvs_done_ && probe == posted; ++k) {
      const size_t i = recvs_done_ + (arrival_turn_ + k) % (posted - recvs_done_);
      if (!recvs_[i].done) probe = i;
    }
    ++arrival_turn_;
    bool moved = false;
    if (probe < posted) {
      RecvOp& op = recvs_[probe];
      bool done = false;
      size_t got = 0;
      if (Status s = test_request(recv_reqs_[probe], &done, &got); !s) {
        error_ = "receive from rank " + std::to_string(op.peer) + " failed: " + errc_name(s.code());
        return s;
      }
      if (done) {
        if (Status s = finish_recv(probe, got); !s) return s;
        moved = true;
      }
    }
    for (size_t i = recvs_done_; i < posted; ++i) {
      RecvOp& op = recvs_[i];
      if (op.done) continue;
      const uint64_t a = recv_[mode_][size_t(op.peer)]->arrived_prefix(recv_reqs_[i]);
      if (a >= op.arrived + step) {
        op.arrived = a;
        moved = true;
      }
    }
    if (moved) return Status::ok();
    if (std::chrono::steady_clock::now() > end) {
      error_ = "receives did not complete (peer gone?)";
      return Status(Errc::kRemote);
    }
    // The phase's spin budget, not the call's: these waits return every few packets.
    arrival_backoff_.pause(phase_requests());
  }
  return Status::ok();
}

Status HostExchange::wait_phase() {
  for (const SendOp& op : sends_) {
    if (op.ready < op.bytes) {  // it would never complete: a schedule bug, not a network's
      error_ = "a send to rank " + std::to_string(op.peer) + " ended its phase with " +
               std::to_string(op.bytes - op.ready) + " bytes never released";
      return Status(Errc::kInternal);
    }
  }
  if (Status s = wait_recvs_now(recvs_.size()); !s) return s;
  for (size_t i = 0; i < sends_.size(); ++i) {
    size_t ignored = 0;
    if (Status s = wait(send_reqs_[i], &ignored, true, sends_[i].peer); !s) return s;
  }
  return Status::ok();
}

void HostExchange::timing(uint32_t* tb_us, uint32_t* tc_us) const {
  const GroupStats g = group_->stats();
  *tb_us = g.tb_us;
  *tc_us = g.tc_us;
}

}  // namespace optireduce::coll
