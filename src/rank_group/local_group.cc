// RankGroup for ranks on one machine: UNIX-domain stream sockets.
//
// Rank 0 listens on the root address; every other rank connects and says who it
// is (rank, node, its own fetch address). Collectives go through rank 0: each
// rank sends its part, rank 0 answers everyone with all parts. Fetches go
// straight to the peer's own listener, answered by a server thread there.
// Stream sockets (not the shm transport's SEQPACKET channel) because fetches
// move whole slices of hundreds of MB in one message.
// Messages: docs/protocol.md, "Rank groups", and rank_group/local_messages.h.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "base/clock.h"
#include "base/coding.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/random.h"
#include "base/status_macros.h"
#include "rank_group/constants.h"
#include "rank_group/group_base.h"
#include "rank_group/local_messages.h"
#include "transport/shm/local_address.h"

namespace ferry::rank_group {
namespace {

using checkpoint::LocalGroupOptions;
using std::chrono::milliseconds;

Status check_peer_user(int fd, const std::string& what) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return errno_status("getsockopt(SO_PEERCRED)", what, errno);
  }
  if (cred.uid != ::getuid()) {
    return unauthenticated(what + ": peer runs as uid " + std::to_string(cred.uid) +
                           ", not as this process's uid " + std::to_string(::getuid()));
  }
  return ok_status();
}

// Waits for `events` on fd until `deadline` (nullopt: forever).
Status wait_fd(int fd, short events, std::optional<Clock::time_point> deadline,
               const std::string& what) {
  while (true) {
    int ms = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return timeout_error(what + ": no answer in time");
      ms = static_cast<int>(std::min<long long>(left, 1 << 30));
    }
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("poll", what, errno);
    if (n > 0) return ok_status();
  }
}

Status send_all(int fd, const void* data, std::size_t size, std::optional<Clock::time_point> dl,
                const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      FERRY_RETURN_IF_ERROR(wait_fd(fd, POLLOUT, dl, what));
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return aborted(what + ": peer closed the connection");
    }
    if (n < 0) return errno_status("send", what, errno);
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return ok_status();
}

Status recv_all(int fd, void* data, std::size_t size, std::optional<Clock::time_point> dl,
                const std::string& what) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      FERRY_RETURN_IF_ERROR(wait_fd(fd, POLLIN, dl, what));
      continue;
    }
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      return aborted(what + ": peer closed the connection (did it exit or crash?)");
    }
    if (n < 0) return errno_status("recv", what, errno);
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return ok_status();
}

// A frame's length: 8 bytes, little-endian.
constexpr std::size_t kFrameHeadBytes = 8;
std::uint64_t frame_length(std::span<const std::byte> head) { return coding::Reader(head).u64(); }

// A frame: its length, then the bytes.
Status send_frame(int fd, std::string_view bytes, std::optional<Clock::time_point> dl,
                  const std::string& what) {
  std::vector<std::byte> head;
  coding::put_u64(&head, bytes.size());
  FERRY_RETURN_IF_ERROR(send_all(fd, head.data(), head.size(), dl, what));
  return send_all(fd, bytes.data(), bytes.size(), dl, what);
}

Result<std::string> recv_frame(int fd, std::optional<Clock::time_point> dl,
                               const std::string& what) {
  std::byte head[kFrameHeadBytes];
  FERRY_RETURN_IF_ERROR(recv_all(fd, head, sizeof head, dl, what));
  const std::uint64_t n = frame_length(head);
  if (n > kMaxPayloadBytes) {
    return corruption(what + ": frame of " + std::to_string(n) + " bytes is over the limit");
  }
  std::string out(n, '\0');
  FERRY_RETURN_IF_ERROR(recv_all(fd, out.data(), n, dl, what));
  return out;
}

Result<ScopedFd> listen_on(const std::string& address) {
  auto addr = shm::resolve_local_address(address);
  if (!addr.ok()) return addr.status();
  ScopedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status("socket", address, errno);
  for (int attempt = 0;; ++attempt) {
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr->addr), addr->len) == 0) break;
    const int err = errno;
    if (err != EADDRINUSE || attempt > 0) return errno_status("bind", address, err);
    // Taken: name the holder, or remove a stale socket file and try once more.
    bool stale = false;
    FERRY_RETURN_IF_ERROR(shm::explain_address_in_use(*addr, SOCK_STREAM, &stale));
  }
  if (::listen(fd.get(), kListenBacklog) != 0) return errno_status("listen", address, errno);
  return fd;
}

Result<ScopedFd> connect_to(const std::string& address, Clock::time_point deadline) {
  auto addr = shm::resolve_local_address(address);
  if (!addr.ok()) return addr.status();
  while (true) {
    ScopedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return errno_status("socket", address, errno);
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr->addr), addr->len) == 0) {
      FERRY_RETURN_IF_ERROR(check_peer_user(fd.get(), address));
      return fd;
    }
    const int err = errno;
    if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN) {
      return errno_status("connect", address, err);
    }
    if (Clock::now() >= deadline) {
      return timeout_error("connect(" + address + "): nobody listening in time (" +
                           std::strerror(err) + ")");
    }
    std::this_thread::sleep_for(kConnectRetry);
  }
}

// One joining rank's connection and hello: who it is and where it serves fetches.
struct Joined {
  ScopedFd fd;
  local::Hello hello;
};

// A connection to rank 0 whose hello has not fully arrived. Its bytes are read as they
// come, so a peer that sends part of a hello (or nothing) holds up no one else.
struct PendingHello {
  ScopedFd fd;
  std::string who;    // "pid 1234", for warnings
  std::string bytes;  // the hello frame so far
};

std::string describe_peer(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return "an unknown process";
  return "pid " + std::to_string(cred.pid);
}

// How a pending hello stands after a read: still incomplete, complete, or to be dropped.
enum class HelloState { kPartial, kComplete, kDrop };

// Reads what `p` has sent without blocking and says where its hello stands; on kDrop,
// *why says what was wrong.
HelloState read_hello(PendingHello& p, std::string* why) {
  while (true) {
    std::uint64_t want = kFrameHeadBytes;
    if (p.bytes.size() >= kFrameHeadBytes) {
      const std::uint64_t n = frame_length(std::as_bytes(std::span(p.bytes)));
      if (n > kMaxHelloBytes) {
        *why = "a hello of " + std::to_string(n) + " bytes is over the limit";
        return HelloState::kDrop;
      }
      want = kFrameHeadBytes + n;
    }
    if (p.bytes.size() >= kFrameHeadBytes && p.bytes.size() == want) {
      return HelloState::kComplete;
    }
    char buf[4096];
    const std::size_t ask = std::min<std::size_t>(sizeof buf, want - p.bytes.size());
    const ssize_t n = ::recv(p.fd.get(), buf, ask, MSG_DONTWAIT);
    const int err = n < 0 ? errno : 0;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return HelloState::kPartial;
    if (n <= 0) {
      *why = "closed after " + std::to_string(p.bytes.size()) + " bytes of its hello";
      if (err != 0 && err != ECONNRESET) *why += std::string(" (") + std::strerror(err) + ")";
      return HelloState::kDrop;
    }
    p.bytes.append(buf, static_cast<std::size_t>(n));
  }
}

// Rank 0: the next rank that connects and says hello. Connections wait side by side and
// each hello is read as its bytes arrive, so a silent or half-sent one (a same-user
// process that connects and stops) delays nobody; a peer of another user, or one that
// closes or sends a malformed hello, is dropped with a warning and the wait goes on.
Result<Joined> accept_hello(int listen_fd, std::vector<PendingHello>& pending,
                            Clock::time_point deadline, const std::string& what) {
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      for (const PendingHello& p : pending) {
        log::warn("checkpoint group: {} connected to {} but sent only {} bytes of its hello", p.who,
                  what, p.bytes.size());
      }
      return timeout_error(what + ": no answer in time");
    }
    std::vector<pollfd> fds{{listen_fd, POLLIN, 0}};
    for (const PendingHello& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    const int n =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("poll", what, errno);
    for (std::size_t i = fds.size() - 1; i >= 1; --i) {
      if (fds[i].revents == 0) continue;
      PendingHello& p = pending[i - 1];
      std::string why;
      const HelloState state = read_hello(p, &why);
      if (state == HelloState::kPartial) continue;
      PendingHello done = std::move(p);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i - 1));
      if (state == HelloState::kComplete) {
        auto hello = local::decode_hello(std::string_view(done.bytes).substr(kFrameHeadBytes));
        if (hello.ok()) return Joined{std::move(done.fd), std::move(*hello)};
        why = hello.status().message();
      }
      log::warn("checkpoint group: dropped {} connected to {}: {}", done.who, what, why);
    }
    if ((fds[0].revents & POLLIN) == 0) continue;
    ScopedFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      return errno_status("accept", what, errno);
    }
    if (Status s = check_peer_user(fd.get(), what); !s.ok()) {
      log::warn("checkpoint group: dropped a connection: {}", s.message());
      continue;
    }
    std::string who = describe_peer(fd.get());
    if (pending.size() >= kMaxPendingHellos) {  // a flood must not run rank 0 out of fds
      log::warn("checkpoint group: dropped {}: {} connections to {} have not said hello yet", who,
                pending.size(), what);
      continue;
    }
    pending.push_back({std::move(fd), std::move(who), {}});
  }
}

std::string random_suffix() {
  const std::uint64_t v = random_u64();
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Responses to a fetch: one frame of one status byte (0 = OK, else the Code),
// then the payload or the error message. The payload goes straight from the
// handler's memory (a mapped shard) to the socket.
Status send_response(int fd, const Result<RankGroup::FetchReply>& r, const std::string& what) {
  const std::string error = r.ok() ? std::string() : r.status().message();
  const std::span<const std::byte> body = r.ok() ? r->bytes() : std::as_bytes(std::span(error));
  unsigned char head[local::kAnswerHeadBytes];
  local::encode_answer_head({static_cast<std::uint8_t>(r.status().code()), body.size()}, head);
  FERRY_RETURN_IF_ERROR(send_all(fd, head, sizeof head, std::nullopt, what));
  return send_all(fd, body.data(), body.size(), std::nullopt, what);
}

class LocalGroup final : public GroupBase {
 public:
  LocalGroup(const LocalGroupOptions& o) : GroupBase(o.rank, o.size, o.node), opts_(o) {}
  ~LocalGroup() override {
    stop_.store(true);
    if (server_.joinable()) server_.join();
    {
      MutexLock lock(conn_mu_);
      for (int fd : open_server_fds_) ::shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& t : conn_threads_) t.join();
  }

  Status start() {
    FERRY_RETURN_IF_ERROR(check_membership());
    const auto deadline = Clock::now() + opts_.timeout;
    my_address_ = "@ferry-ckpt-" + random_suffix() + "-r" + std::to_string(opts_.rank);
    auto listener = listen_on(my_address_);
    if (!listener.ok()) return listener.status();
    fetch_listener_ = std::move(*listener);
    server_ = std::thread([this] { serve_loop(); });

    nodes_.assign(opts_.size, "");
    addresses_.assign(opts_.size, "");
    nodes_[opts_.rank] = opts_.node;
    addresses_[opts_.rank] = my_address_;
    if (opts_.rank == 0) {
      auto root = listen_on(opts_.root_address);
      if (!root.ok()) return root.status().with_context("rank 0 listening for the group");
      peers_.resize(opts_.size);
      std::vector<PendingHello> pending;
      for (int joined = 1; joined < opts_.size; ++joined) {
        auto j = accept_hello(root->get(), pending, deadline,
                              "rank 0 waiting for " + std::to_string(opts_.size - joined) +
                                  " more rank(s) on " + opts_.root_address);
        if (!j.ok()) return j.status();
        const std::uint64_t r = j->hello.rank;
        if (r == 0 || r >= static_cast<std::uint64_t>(opts_.size) || peers_[r].valid()) {
          return invalid_argument("rank " + std::to_string(r) + " joined " + opts_.root_address +
                                  " twice or is outside the group of " +
                                  std::to_string(opts_.size));
        }
        nodes_[r] = std::move(j->hello.node);
        addresses_[r] = std::move(j->hello.address);
        peers_[r] = std::move(j->fd);
      }
      for (const PendingHello& p : pending) {
        log::warn(
            "checkpoint group: dropped {}: it sent {} bytes of a hello and the group is "
            "complete",
            p.who, p.bytes.size());
      }
      const std::string table = local::encode_member_table({nodes_, addresses_});
      for (int r = 1; r < opts_.size; ++r) {
        FERRY_RETURN_IF_ERROR(send_frame(peers_[r].get(), table, deadline, peer_name(r)));
      }
    } else {
      auto fd = connect_to(opts_.root_address, deadline);
      if (!fd.ok())
        return fd.status().with_context("rank " + std::to_string(opts_.rank) + " joining");
      root_ = std::move(*fd);
      const std::string hello =
          local::encode_hello({static_cast<std::uint64_t>(opts_.rank), opts_.node, my_address_});
      FERRY_RETURN_IF_ERROR(send_frame(root_.get(), hello, deadline, "rank 0"));
      auto table = recv_frame(root_.get(), deadline, "rank 0 (the group's member table)");
      if (!table.ok()) return table.status();
      auto members = local::decode_member_table(*table, opts_.size);
      if (!members.ok()) return members.status().with_context("rank 0");
      nodes_ = std::move(members->nodes);
      addresses_ = std::move(members->addresses);
    }
    return ok_status();
  }

  Result<std::vector<std::string>> all_gather(std::string_view mine) override {
    if (!broken_.ok()) return broken_;
    auto r = gather_impl(mine);
    if (!r.ok()) {
      broken_ = r.status();
      root_.reset();  // peers see EOF at once instead of waiting for their timeout
      for (ScopedFd& p : peers_) p.reset();
    }
    return r;
  }

 private:
  struct Conn {
    Mutex mu;  // one fetch at a time on the stream
    ScopedFd fd FERRY_GUARDED_BY(mu);
  };

  Status fetch_impl(int peer, std::string_view request, std::span<std::byte>* into,
                    std::string* text) override {
    const auto deadline = Clock::now() + opts_.timeout;
    std::shared_ptr<Conn> conn;
    {
      MutexLock lock(conn_mu_);
      auto& c = fetch_conns_[peer];
      if (!c) c = std::make_shared<Conn>();
      conn = c;
    }
    MutexLock lock(conn->mu);
    const std::string what = peer_name(peer) + " (fetch)";
    if (!conn->fd.valid()) {
      auto fd = connect_to(addresses_[peer], deadline);
      if (!fd.ok()) return fd.status().with_context(what);
      conn->fd = std::move(*fd);
      const std::string hello = local::encode_fetch_hello(static_cast<std::uint64_t>(opts_.rank));
      FERRY_RETURN_IF_ERROR(send_frame(conn->fd.get(), hello, deadline, what));
    }
    Status s = recv_reply(conn->fd.get(), request, deadline, what, into, text);
    if (!s.ok() &&
        (s.code() == Code::kAborted || s.code() == Code::kTimeout || s.code() == Code::kIoError)) {
      conn->fd.reset();  // the stream is out of step; reconnect next time
    }
    return s;
  }

  static Status recv_reply(int fd, std::string_view request, Clock::time_point deadline,
                           const std::string& what, std::span<std::byte>* into, std::string* text) {
    FERRY_RETURN_IF_ERROR(send_frame(fd, request, deadline, what));
    unsigned char raw_head[local::kAnswerHeadBytes];
    FERRY_RETURN_IF_ERROR(recv_all(fd, raw_head, sizeof raw_head, deadline, what));
    auto head = local::decode_answer_head(raw_head);
    // Aborted: the stream is out of step, so the connection is dropped.
    if (!head.ok()) return aborted(what + ": " + head.status().message());
    const std::uint64_t body = head->body_bytes;
    if (head->code != 0) {
      std::string msg(body, '\0');
      FERRY_RETURN_IF_ERROR(recv_all(fd, msg.data(), body, deadline, what));
      return Status(static_cast<Code>(head->code), msg);
    }
    if (into != nullptr) {
      if (body != into->size()) {
        // Drain it so the connection stays usable, then say what was wrong.
        std::string sink(body, '\0');
        FERRY_RETURN_IF_ERROR(recv_all(fd, sink.data(), body, deadline, what));
        return corruption(what + ": answered " + std::to_string(body) + " bytes, expected " +
                          std::to_string(into->size()));
      }
      return recv_all(fd, into->data(), body, deadline, what);
    }
    text->assign(body, '\0');
    return recv_all(fd, text->data(), body, deadline, what);
  }

  Result<std::vector<std::string>> gather_impl(std::string_view mine) {
    const auto deadline = Clock::now() + opts_.collective_timeout;
    std::vector<std::string> all(opts_.size);
    if (opts_.rank == 0) {
      all[0] = std::string(mine);
      for (int r = 1; r < opts_.size; ++r) {
        auto part = recv_frame(peers_[r].get(), deadline, peer_name(r) + " in a collective");
        if (!part.ok()) return part.status();
        all[r] = std::move(*part);
      }
      const std::string out = local::encode_parts(all);
      for (int r = 1; r < opts_.size; ++r) {
        if (Status s =
                send_frame(peers_[r].get(), out, deadline, peer_name(r) + " in a collective");
            !s.ok()) {
          return s;
        }
      }
      return all;
    }
    if (Status s = send_frame(root_.get(), mine, deadline, peer_name(0) + " in a collective");
        !s.ok()) {
      return s;
    }
    auto out = recv_frame(root_.get(), deadline, peer_name(0) + " in a collective");
    if (!out.ok()) return out.status();
    auto parts = local::decode_parts(*out, opts_.size);
    if (!parts.ok()) return parts.status().with_context(peer_name(0));
    return parts;
  }

  void serve_loop() {
    while (!stop_.load()) {
      pollfd p{fetch_listener_.get(), POLLIN, 0};
      int n = ::poll(&p, 1, static_cast<int>(kServePollInterval.count()));
      if (n <= 0) continue;
      ScopedFd fd(::accept4(fetch_listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!fd.valid()) continue;
      if (Status s = check_peer_user(fd.get(), my_address_); !s.ok()) {
        log::warn("checkpoint group: refused a fetch connection: {}", s.to_string());
        continue;
      }
      MutexLock lock(conn_mu_);
      const int raw = fd.get();
      open_server_fds_.push_back(raw);
      conn_threads_.emplace_back([this, f = std::move(fd)]() mutable { serve_conn(std::move(f)); });
    }
  }

  void serve_conn(ScopedFd fd) {
    auto hello = recv_frame(fd.get(), std::nullopt, "fetch client");
    auto from =
        hello.ok() ? local::decode_fetch_hello(*hello) : Result<std::uint64_t>(hello.status());
    if (from.ok()) {
      while (!stop_.load()) {
        auto req = recv_frame(fd.get(), std::nullopt, "fetch client");
        if (!req.ok()) break;
        Result<FetchReply> resp = answer(static_cast<int>(*from), *req);
        if (!send_response(fd.get(), resp, "fetch client").ok()) break;
      }
    }
    MutexLock lock(conn_mu_);
    std::erase(open_server_fds_, fd.get());
  }

  LocalGroupOptions opts_;
  std::string my_address_;
  std::vector<std::string> addresses_;
  ScopedFd root_;                // ranks > 0: connection to rank 0
  std::vector<ScopedFd> peers_;  // rank 0: connection to each rank
  Status broken_;

  ScopedFd fetch_listener_;
  std::thread server_;
  std::atomic<bool> stop_{false};
  Mutex conn_mu_;
  std::vector<int> open_server_fds_ FERRY_GUARDED_BY(conn_mu_);
  std::vector<std::thread> conn_threads_ FERRY_GUARDED_BY(conn_mu_);
  std::map<int, std::shared_ptr<Conn>> fetch_conns_ FERRY_GUARDED_BY(conn_mu_);
};

}  // namespace

}  // namespace ferry::rank_group

namespace ferry::checkpoint {

Result<std::unique_ptr<RankGroup>> connect_local_group(const LocalGroupOptions& options) {
  auto g = std::make_unique<rank_group::LocalGroup>(options);
  FERRY_RETURN_IF_ERROR(g->start());
  return std::unique_ptr<RankGroup>(std::move(g));
}

}  // namespace ferry::checkpoint
