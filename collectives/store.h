// Rendezvous stores of the host path: a key-value store every rank of a communicator reaches
// at init, to agree on a seed and swap connection handles. FileStore (a shared folder; tests),
// TcpStore (rank 0 serves on MASTER_ADDR:MASTER_PORT, torchrun-style) and CallbackStore (the
// caller's own store through optiStore_t: the Python package hands PyTorch's c10d store).
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/optireduce.h"
#include "transport/status.h"

namespace optireduce::coll {

class Store {
 public:
  virtual ~Store() = default;
  virtual Status set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists (at most timeout_ms).
  virtual Status get(const std::string& key, std::string* value, int timeout_ms) = 0;
  // Forgets every key that starts with `prefix`, once no rank reads them any more (a destroyed
  // communicator's): a store that outlives communicators does not grow with them, and a folder
  // used again does not hand a new run the last one's keys. Best effort; the caller's own store
  // (CallbackStore) keeps them, having no call for it.
  virtual void erase_prefix(const std::string& /*prefix*/) {}
  const std::string& error() const { return error_; }

 protected:
  std::string error_;
};

// One file per key in `dir`, written to a temporary name and renamed, so a reader never sees
// a partial value.
class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  Status set(const std::string& key, const std::string& value) override;
  Status get(const std::string& key, std::string* value, int timeout_ms) override;
  void erase_prefix(const std::string& prefix) override;

 private:
  std::string file_name(const std::string& key) const;
  std::string path(const std::string& key) const;
  std::string dir_;
};

// A client of the TCP store. Rank 0's first one starts the server of its address, which serves
// every later one until the process ends (store.cc says why).
class TcpStore final : public Store {
 public:
  ~TcpStore() override;
  // Rank 0 (`serve`) serves host:port unless it does already; every rank (rank 0 too)
  // connects as a client, retrying until timeout_ms while the server is not up yet.
  static Status open(const std::string& host, int port, bool serve, int timeout_ms,
                     std::unique_ptr<TcpStore>* out, std::string* error);
  Status set(const std::string& key, const std::string& value) override;
  Status get(const std::string& key, std::string* value, int timeout_ms) override;
  void erase_prefix(const std::string& prefix) override;

 private:
  class Server;
  TcpStore() = default;
  Status request(uint8_t op, const std::string& key, const std::string& value, std::string* reply,
                 int timeout_ms);

  int fd_ = -1;
  std::mutex mu_;  // one request at a time on the client socket
};

// The caller's store through the C API's two callbacks.
class CallbackStore final : public Store {
 public:
  explicit CallbackStore(const optiStore_t& cb) : cb_(cb) {}
  Status set(const std::string& key, const std::string& value) override;
  Status get(const std::string& key, std::string* value, int timeout_ms) override;

 private:
  optiStore_t cb_;
};

// Every rank sets `prefix/<rank>` and waits for all of them.
Status store_barrier(Store* s, const std::string& prefix, int rank, int nranks, int timeout_ms);

}  // namespace optireduce::coll
