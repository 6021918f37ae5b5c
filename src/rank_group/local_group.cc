// RankGroup for ranks on one machine: UNIX-domain stream sockets.
//
// Rank 0 listens on the root address; every other rank connects and says who it
// is (rank, node, its own fetch address). Collectives go through rank 0: each
// rank sends its part, rank 0 answers everyone with all parts. Fetches go
// straight to the peer's own listener, answered by a server thread there.
// Stream sockets (not the shm transport's SEQPACKET channel) because fetches
// move whole slices of hundreds of MB in one message. The messages are the net
// group's (rank_group/messages.h), each sent as one frame: a u32 length, then the
// message; a fetch answer's bytes follow its kAnswer raw on the stream.
// Protocol: docs/protocol.md, "Rank groups".
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
#include "rank_group/messages.h"
#include "transport/shm/local_address.h"

namespace ferry::rank_group {
namespace {

using checkpoint::LocalGroupOptions;
using msg::Kind;
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

// A frame's length: 4 bytes, little-endian; then one message of rank_group/messages.h.
constexpr std::size_t kFrameHeadBytes = 4;
std::uint32_t frame_length(std::span<const std::byte> head) { return coding::Reader(head).u32(); }

// A frame of `head` and `tail` (one message, at most kMaxMessageBytes, sent in two parts so
// that a blob chunk's bytes are not copied).
Status send_frame(int fd, std::span<const std::byte> head, std::string_view tail,
                  std::optional<Clock::time_point> dl, const std::string& what) {
  std::byte length[kFrameHeadBytes];
  coding::encode_u32(length, static_cast<std::uint32_t>(head.size() + tail.size()));
  FERRY_RETURN_IF_ERROR(send_all(fd, length, sizeof length, dl, what));
  FERRY_RETURN_IF_ERROR(send_all(fd, head.data(), head.size(), dl, what));
  return send_all(fd, tail.data(), tail.size(), dl, what);
}
Status send_frame(int fd, std::span<const std::byte> m, std::optional<Clock::time_point> dl,
                  const std::string& what) {
  return send_frame(fd, m, {}, dl, what);
}

// The next frame's message; a length over kMaxMessageBytes is refused before anything is
// allocated for it.
Result<std::vector<std::byte>> recv_frame(int fd, std::optional<Clock::time_point> dl,
                                          const std::string& what) {
  std::byte head[kFrameHeadBytes];
  FERRY_RETURN_IF_ERROR(recv_all(fd, head, sizeof head, dl, what));
  const std::uint32_t n = frame_length(head);
  if (n > transport::kMaxMessageBytes) {
    return corruption(what + ": a frame of " + std::to_string(n) + " bytes (at most " +
                      std::to_string(transport::kMaxMessageBytes) + ")");
  }
  std::vector<std::byte> out(n);
  FERRY_RETURN_IF_ERROR(recv_all(fd, out.data(), n, dl, what));
  return out;
}

// A part or result of any size, as kPart / kResult chunks.
Status send_blob(int fd, Kind kind, std::uint64_t seq, std::string_view data, Clock::time_point dl,
                 const std::string& what) {
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(msg::kBlobChunkBytes, data.size() - at);
    const std::vector<std::byte> head = msg::encode_blob_chunk(kind, seq, data.size(), {});
    FERRY_RETURN_IF_ERROR(send_frame(fd, head, data.substr(at, n), dl, what));
    at += n;
  } while (at < data.size());
  return ok_status();
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
  msg::Join join;
  std::string who;  // "pid 1234"
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
      const std::uint32_t n = frame_length(std::as_bytes(std::span(p.bytes)));
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
        auto join = msg::decode_join(std::as_bytes(std::span(done.bytes)).subspan(kFrameHeadBytes));
        if (join.ok()) return Joined{std::move(done.fd), std::move(*join), std::move(done.who)};
        why = join.status().message();
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
    if (opts_.rank == 0) return gather_members(deadline);
    const std::string what = "rank " + std::to_string(opts_.rank) + " joining";
    auto fd = connect_to(opts_.root_address, deadline);
    if (!fd.ok()) return fd.status().with_context(what);
    root_ = std::move(*fd);
    const std::vector<std::byte> join =
        msg::encode_join({kVersion, static_cast<std::uint32_t>(opts_.rank),
                          static_cast<std::uint32_t>(opts_.size), opts_.node, my_address_});
    FERRY_RETURN_IF_ERROR(send_frame(root_.get(), join, deadline, "rank 0"));
    auto table = recv_frame(root_.get(), deadline, "rank 0 (the group's member table)");
    if (!table.ok()) return table.status();
    if (msg::kind_of(*table) == static_cast<std::uint8_t>(Kind::kAbort)) {
      return read_abort(*table).with_context(what);
    }
    auto members = msg::decode_table(*table, static_cast<std::uint32_t>(opts_.size));
    if (!members.ok()) return members.status().with_context("rank 0");
    nodes_ = std::move(members->nodes);
    addresses_ = std::move(members->addresses);
    return ok_status();
  }

  Result<std::vector<std::string>> all_gather(std::string_view mine) override {
    if (!broken_.ok()) return broken_;
    const std::uint64_t seq = ++seq_;
    auto r = gather_impl(mine, seq);
    if (!r.ok()) {
      broken_ = r.status();
      tell_members(broken_);
      root_.reset();  // peers see EOF at once instead of waiting for their timeout
      for (ScopedFd& p : peers_) p.reset();
    }
    return r;
  }

 private:
  struct Conn {
    Mutex mu;  // one fetch at a time on the stream
    ScopedFd fd FERRY_GUARDED_BY(mu);
    std::uint32_t next_id FERRY_GUARDED_BY(mu) = 0;
  };

  // Rank 0: accepts every other rank's kJoin on the root address, then sends every rank
  // the member table. A join that names a wrong version, size or rank fails the group: the
  // joiners so far are told with kAbort.
  Status gather_members(Clock::time_point deadline) {
    auto root = listen_on(opts_.root_address);
    if (!root.ok()) return root.status().with_context("rank 0 listening for the group");
    peers_.resize(opts_.size);
    std::vector<PendingHello> pending;
    for (int joined = 1; joined < opts_.size; ++joined) {
      auto j = accept_hello(root->get(), pending, deadline,
                            "rank 0 waiting for " + std::to_string(opts_.size - joined) +
                                " more rank(s) on " + opts_.root_address);
      if (!j.ok()) return j.status();
      const std::uint32_t r = j->join.rank;
      Status bad = check_join(j->join, "rank " + std::to_string(r) + " (" + j->who + ")",
                              opts_.root_address, r < peers_.size() && peers_[r].valid());
      if (!bad.ok()) {
        send_abort(j->fd.get(), bad);
        tell_members(bad);
        return bad;
      }
      nodes_[r] = std::move(j->join.node);
      addresses_[r] = std::move(j->join.address);
      peers_[r] = std::move(j->fd);
    }
    for (const PendingHello& p : pending) {
      log::warn(
          "checkpoint group: dropped {}: it sent {} bytes of a hello and the group is complete",
          p.who, p.bytes.size());
    }
    const std::vector<std::byte> table = msg::encode_table({nodes_, addresses_});
    for (int r = 1; r < opts_.size; ++r) {
      FERRY_RETURN_IF_ERROR(send_frame(peers_[r].get(), table, deadline, peer_name(r)));
    }
    return ok_status();
  }

  static void send_abort(int fd, const Status& why) {
    (void)send_frame(fd, msg::encode_abort(why), Clock::now() + kAbortSendTimeout, "abort");
  }

  // Rank 0: tells every member that the group failed and why, so that none of them waits
  // for its own timeout. A member reads it in its current or next collective.
  void tell_members(const Status& why) {
    for (ScopedFd& p : peers_) {
      if (p.valid()) send_abort(p.get(), why);
    }
  }

  Result<std::vector<std::string>> gather_impl(std::string_view mine, std::uint64_t seq) {
    const auto deadline = Clock::now() + opts_.collective_timeout;
    if (opts_.rank == 0) {
      std::vector<std::string> all(opts_.size);
      all[0] = std::string(mine);
      for (int r = 1; r < opts_.size; ++r) {
        const std::string what = peer_name(r) + " in a collective";
        msg::Blob part;
        while (!part.complete()) {
          auto m = recv_frame(peers_[r].get(), deadline, what);
          if (!m.ok()) return m.status();
          FERRY_RETURN_IF_ERROR(part.feed(*m, Kind::kPart, seq, peer_name(r)));
        }
        all[r] = std::move(part.data);
      }
      const std::string out = msg::encode_parts(all);
      for (int r = 1; r < opts_.size; ++r) {
        FERRY_RETURN_IF_ERROR(send_blob(peers_[r].get(), Kind::kResult, seq, out, deadline,
                                        peer_name(r) + " in a collective"));
      }
      return all;
    }
    const std::string what = peer_name(0) + " in a collective";
    FERRY_RETURN_IF_ERROR(send_blob(root_.get(), Kind::kPart, seq, mine, deadline, what));
    msg::Blob result;
    while (!result.complete()) {
      auto m = recv_frame(root_.get(), deadline, what);
      if (!m.ok()) return m.status();
      if (msg::kind_of(*m) == static_cast<std::uint8_t>(Kind::kAbort)) return read_abort(*m);
      FERRY_RETURN_IF_ERROR(result.feed(*m, Kind::kResult, seq, peer_name(0)));
    }
    auto parts = msg::decode_parts(result.data, static_cast<std::uint32_t>(opts_.size));
    if (!parts.ok()) return parts.status().with_context(peer_name(0));
    return parts;
  }

  // ---- fetches (caller side) ----

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
      const std::vector<std::byte> hello =
          msg::encode_fetch_hello({kVersion, static_cast<std::uint32_t>(opts_.rank)});
      if (Status s = send_frame(conn->fd.get(), hello, deadline, what); !s.ok()) {
        conn->fd.reset();
        return s;
      }
    }
    bool out_of_step = false;
    Status s = exchange(conn->fd.get(), peer, ++conn->next_id, request, deadline, what, into, text,
                        &out_of_step);
    if (out_of_step) conn->fd.reset();  // it may hold half an answer: reconnect next time
    return s;
  }

  // One request and its answer on `fd`. *out_of_step: the stream failed or may hold the
  // rest of an answer, so it must not be used again.
  Status exchange(int fd, int peer, std::uint32_t id, std::string_view request,
                  Clock::time_point deadline, const std::string& what, std::span<std::byte>* into,
                  std::string* text, bool* out_of_step) {
    const std::uint64_t expected = into != nullptr ? into->size() : kAnySize;
    const std::vector<std::byte> m = msg::encode_fetch({id, expected, std::string(request)});
    if (m.size() > transport::kMaxMessageBytes) {
      return invalid_argument("a fetch request of " + std::to_string(request.size()) +
                              " bytes is over the limit of " +
                              std::to_string(transport::kMaxMessageBytes));
    }
    *out_of_step = true;
    FERRY_RETURN_IF_ERROR(send_frame(fd, m, deadline, what));
    auto reply = recv_frame(fd, deadline, what);
    if (!reply.ok()) return reply.status();
    auto answer = check_answer(*reply, id, peer, expected);
    if (!answer.ok()) return answer.status();
    if (answer->code != Code::kOk) {
      *out_of_step = false;  // no bytes follow an error
      return Status(answer->code, answer->error);
    }
    const std::uint64_t bytes = answer->size;
    std::span<std::byte> dst;
    if (into != nullptr) {
      dst = *into;
    } else {
      text->resize(bytes);
      dst = std::as_writable_bytes(std::span(*text));
    }
    FERRY_RETURN_IF_ERROR(recv_all(fd, dst.data(), dst.size(), deadline, what));
    *out_of_step = false;
    return ok_status();
  }

  // ---- fetches (serving side) ----

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
    const std::string who = describe_peer(fd.get()) + " (fetch client)";
    if (Status s = serve_requests(fd.get(), who); !s.ok() && !stop_.load()) {
      log::warn("checkpoint group: rank {} drops a fetch connection: {}", opts_.rank,
                s.to_string());
    }
    MutexLock lock(conn_mu_);
    std::erase(open_server_fds_, fd.get());
  }

  // Reads the kFetchHello, then answers each kFetch until the fetcher closes; an error
  // (a malformed message, the fetcher gone mid-answer) ends the connection.
  Status serve_requests(int fd, const std::string& who) {
    auto m = recv_frame(fd, std::nullopt, who);
    if (!m.ok()) return ok_status();  // closed before it said hello
    auto from = check_fetch_hello(*m, who);
    if (!from.ok()) return from.status();
    const std::string fetcher = "rank " + std::to_string(*from) + " (fetch client)";
    while (!stop_.load()) {
      m = recv_frame(fd, std::nullopt, fetcher);
      if (!m.ok()) return m.status().code() == Code::kAborted ? ok_status() : m.status();
      auto fetch = msg::decode_fetch(*m);
      if (!fetch.ok()) return fetch.status().with_context(fetcher);
      // The ANSWER, then the answer's bytes straight from the handler's memory (a mapped
      // shard) to the socket.
      FetchReply reply;
      FERRY_RETURN_IF_ERROR(
          send_frame(fd, answer_fetch(*from, *fetch, &reply), std::nullopt, fetcher));
      const std::span<const std::byte> bytes = reply.bytes();
      FERRY_RETURN_IF_ERROR(send_all(fd, bytes.data(), bytes.size(), std::nullopt, fetcher));
    }
    return ok_status();
  }

  LocalGroupOptions opts_;
  std::string my_address_;
  std::vector<std::string> addresses_;
  ScopedFd root_;                // ranks > 0: connection to rank 0
  std::vector<ScopedFd> peers_;  // rank 0: connection to each rank
  std::uint64_t seq_ = 0;        // the collective this rank is at
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
