// FileStore and TcpStore (see store.h). The TCP protocol is one request, one reply:
//   request: u8 op (1 set, 2 get, 3 erase the keys with this prefix) | u32 timeout_ms |
//            u32 key length | key | u32 value length |
//   value reply:   u8 status (0 ok, 1 timed out) | u32 value length | value
// Lengths are little-endian host order: every rank runs the same binary on the same ABI.
#include "collectives/store.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace optireduce::coll {
namespace {

constexpr uint8_t kSet = 1, kGet = 2, kErasePrefix = 3;
constexpr uint32_t kMaxValueBytes = 1u << 20;  // handles and seeds are tiny; bounds a bad peer

bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= size_t(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, b, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= size_t(r);
  }
  return true;
}

bool read_string(int fd, std::string* s) {
  uint32_t len = 0;
  if (!read_all(fd, &len, 4) || len > kMaxValueBytes) return false;
  s->resize(len);
  return len == 0 || read_all(fd, s->data(), len);
}

bool write_string(int fd, const std::string& s) {
  const uint32_t len = uint32_t(s.size());
  return write_all(fd, &len, 4) && write_all(fd, s.data(), s.size());
}

Status resolve(const std::string& host, int port, sockaddr_storage* out, socklen_t* len,
               std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string p = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), p.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    *error = "cannot resolve MASTER_ADDR '" + host + "': " + gai_strerror(rc);
    return Status(Errc::kInvalidUsage);
  }
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return Status::ok();
}

}  // namespace

// ---------------------------------------------------------------- FileStore

std::string FileStore::file_name(const std::string& key) const {
  std::string safe = key;
  for (char& c : safe)
    if (c == '/') c = '_';
  return safe;
}

std::string FileStore::path(const std::string& key) const {
  return dir_ + "/" + file_name(key);
}

void FileStore::erase_prefix(const std::string& prefix) {
  const std::string start = file_name(prefix);
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return;
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d))
    if (std::string_view(e->d_name).starts_with(start)) names.emplace_back(e->d_name);
  ::closedir(d);
  for (const std::string& n : names) ::unlink((dir_ + "/" + n).c_str());
}

Status FileStore::set(const std::string& key, const std::string& value) {
  const std::string final_path = path(key);
  const std::string tmp = final_path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(value.data(), std::streamsize(value.size()));
    if (!f) {
      error_ = "file store: cannot write " + tmp;
      return Status(Errc::kSystem, errno);
    }
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    error_ = "file store: cannot rename to " + final_path + ": " + std::strerror(errno);
    return Status(Errc::kSystem, errno);
  }
  return Status::ok();
}

Status FileStore::get(const std::string& key, std::string* value, int timeout_ms) {
  const std::string p = path(key);
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    std::ifstream f(p, std::ios::binary);
    if (f) {
      std::ostringstream ss;
      ss << f.rdbuf();
      *value = ss.str();
      return Status::ok();
    }
    if (std::chrono::steady_clock::now() > end) {
      error_ = "file store: timed out waiting for key '" + key + "' in " + dir_;
      return Status(Errc::kRemote);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// ---------------------------------------------------------------- TcpStore server

// One server per address for the rest of the process, shared by every communicator rank 0
// makes through it. A server per communicator could not serve two at once (the second bind
// failed), and one that closed with the last communicator raced the next: a peer done with
// the old one could connect to it in the moment before it closed, and lose its keys with it.
// Communicators keep apart by their keys' prefix (api.cc), as over any shared store.
class TcpStore::Server {
 public:
  // The server of host:port, started on the first call; later calls find it running.
  static Status ensure(const std::string& host, int port, std::string* error) {
    static std::mutex mu;
    // Never destroyed: its threads serve until the process ends (reachable, not leaked).
    static auto* servers = new std::map<std::pair<std::string, int>, Server*>();
    std::lock_guard<std::mutex> lk(mu);
    // A child forked after its parent started one finds it listed, but its threads are the
    // parent's: it starts its own (and fails to bind while the parent serves there).
    if (auto it = servers->find({host, port});
        it != servers->end() && it->second->pid_ == ::getpid())
      return Status::ok();
    auto* s = new Server();
    if (Status st = s->start(host, port, error); !st) {
      delete s;
      return st;
    }
    (*servers)[{host, port}] = s;
    return Status::ok();
  }

  ~Server() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  Status start(const std::string& host, int port, std::string* error) {
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (Status s = resolve(host, port, &addr, &len, error); !s) return s;
    fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(fd_, 128) != 0) {
      const int err = errno;
      *error = "TCP store: cannot serve on " + host + ":" + std::to_string(port) + ": " +
               std::strerror(err);
      if (err == EADDRINUSE)
        *error +=
            " (another program serves MASTER_PORT: a launcher's own store, or a second "
            "job; give this one a free port, or its store through optiHostCommInitStore)";
      return Status(Errc::kSystem, err);
    }
    std::thread([this] {
      (void)pthread_setname_np(pthread_self(), "optireduce-stor");  // for top -H, perf, gdb
      accept_loop();
    }).detach();
    return Status::ok();
  }

  // A thread per client, ended by its client's close: every rank of a communicator is one
  // client for the communicator's life.
  void accept_loop() {
    for (;;) {
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        // Out of descriptors or memory: a client retries its connect until its timeout.
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      // Bounded: a client beyond the cap (a port scanner, a runaway job) is turned away; a
      // real rank then fails its first request, and says so.
      if (clients_.fetch_add(1) >= kMaxClients) {
        clients_.fetch_sub(1);
        ::close(c);
        continue;
      }
      std::thread([this, c] {
        serve(c);
        ::close(c);
        clients_.fetch_sub(1);
      }).detach();
    }
  }

  void serve(int c) {
    for (;;) {
      uint8_t op = 0;
      uint32_t timeout_ms = 0;
      std::string key, value;
      if (!read_all(c, &op, 1) || !read_all(c, &timeout_ms, 4) || !read_string(c, &key) ||
          !read_string(c, &value))
        return;
      uint8_t status = 0;
      if (op == kSet) {
        std::lock_guard<std::mutex> lk(mu_);
        kv_[key] = value;
        cv_.notify_all();
        value.clear();
      } else if (op == kErasePrefix) {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = kv_.lower_bound(key);
        while (it != kv_.end() && it->first.starts_with(key)) it = kv_.erase(it);
      } else if (op == kGet) {
        std::unique_lock<std::mutex> lk(mu_);
        const bool found = cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms),
                                        [&] { return kv_.count(key) > 0; });
        if (found) {
          value = kv_[key];
        } else {
          status = 1;
          value.clear();
        }
      } else {
        return;  // not our protocol: drop the client
      }
      if (!write_all(c, &status, 1) || !write_string(c, value)) return;
    }
  }

  // Clients served at once: far above ranks x communicators open together.
  static constexpr int kMaxClients = 4096;
  const pid_t pid_ = ::getpid();
  std::atomic<int> clients_{0};
  int fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

// ---------------------------------------------------------------- TcpStore client

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

Status TcpStore::open(const std::string& host, int port, bool serve, int timeout_ms,
                      std::unique_ptr<TcpStore>* out, std::string* error) {
  std::unique_ptr<TcpStore> s(new TcpStore());
  if (serve) {
    if (Status st = Server::ensure(host, port, error); !st) return st;
  }
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (Status st = resolve(host, port, &addr, &len, error); !st) return st;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      s->fd_ = fd;
      break;
    }
    const int err = errno;
    if (fd >= 0) ::close(fd);
    if (std::chrono::steady_clock::now() > end) {
      *error = "TCP store: cannot reach " + host + ":" + std::to_string(port) + ": " +
               std::strerror(err);
      return Status(Errc::kRemote, err);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // rank 0 not up yet
  }
  *out = std::move(s);
  return Status::ok();
}

Status TcpStore::request(uint8_t op, const std::string& key, const std::string& value,
                         std::string* reply, int timeout_ms) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint32_t t = uint32_t(timeout_ms);
  uint8_t status = 0;
  if (!write_all(fd_, &op, 1) || !write_all(fd_, &t, 4) || !write_string(fd_, key) ||
      !write_string(fd_, value) || !read_all(fd_, &status, 1) || !read_string(fd_, reply)) {
    error_ = "TCP store: connection to the store (rank 0) lost";
    return Status(Errc::kRemote);
  }
  if (status != 0) {
    error_ = "TCP store: timed out waiting for key '" + key + "'";
    return Status(Errc::kRemote);
  }
  return Status::ok();
}

Status TcpStore::set(const std::string& key, const std::string& value) {
  std::string ignored;
  return request(kSet, key, value, &ignored, 0);
}

Status TcpStore::get(const std::string& key, std::string* value, int timeout_ms) {
  return request(kGet, key, std::string(), value, timeout_ms);
}

void TcpStore::erase_prefix(const std::string& prefix) {
  std::string ignored;
  (void)request(kErasePrefix, prefix, std::string(), &ignored, 0);
}

Status store_barrier(Store* s, const std::string& prefix, int rank, int nranks, int timeout_ms) {
  if (Status st = s->set(prefix + "/" + std::to_string(rank), "1"); !st) return st;
  std::string v;
  for (int r = 0; r < nranks; ++r)
    if (Status st = s->get(prefix + "/" + std::to_string(r), &v, timeout_ms); !st) return st;
  return Status::ok();
}

Status CallbackStore::set(const std::string& key, const std::string& value) {
  const int rc = cb_.set(cb_.user, key.c_str(), value.data(), value.size());
  if (rc == 0) return Status();
  error_ =
      "the caller's store failed to set '" + key + "' (set returned " + std::to_string(rc) + ")";
  return Status(Errc::kSystem);
}

Status CallbackStore::get(const std::string& key, std::string* value, int timeout_ms) {
  // Handles and seeds fit the first buffer; a longer value is asked for again at its length
  // (the key exists by then, so the second call does not wait).
  value->resize(256);
  for (int attempt = 0; attempt < 2; ++attempt) {
    size_t len = 0;
    const int rc = cb_.get(cb_.user, key.c_str(), value->data(), value->size(), &len, timeout_ms);
    if (rc == 1) {
      error_ = "timed out after " + std::to_string(timeout_ms) + " ms waiting for '" + key +
               "' in the caller's store (did every rank join?)";
      return Status(Errc::kRemote);
    }
    if (rc != 0) {
      error_ = "the caller's store failed to get '" + key + "' (get returned " +
               std::to_string(rc) + ")";
      return Status(Errc::kSystem);
    }
    if (len > kMaxValueBytes) {
      error_ = "the caller's store holds " + std::to_string(len) + " bytes under '" + key +
               "', more than a rendezvous value can be";
      return Status(Errc::kRemote);
    }
    const size_t had = value->size();
    value->resize(len);
    if (len <= had) return Status();
  }
  error_ = "the value of '" + key + "' in the caller's store kept growing";
  return Status(Errc::kRemote);
}

}  // namespace optireduce::coll
