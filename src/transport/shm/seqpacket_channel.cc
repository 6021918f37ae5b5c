#include "transport/shm/seqpacket_channel.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "base/clock.h"
#include "base/log.h"
#include "transport/shm/local_address.h"

namespace ferry::shm {
namespace {

int remaining_ms(Clock::time_point deadline, bool forever) {
  if (forever) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(std::min<long long>(left.count(), 1 << 30));
}

Status check_same_user(int fd, const std::string& peer, pid_t* pid = nullptr) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return errno_status("getsockopt(SO_PEERCRED)", peer, errno);
  }
  if (pid != nullptr) *pid = cred.pid;
  if (cred.uid != ::geteuid()) {
    return unauthenticated(fmt::format("{} (pid {}) runs as uid {}, not this process's uid {}",
                                       peer, cred.pid, cred.uid, ::geteuid()));
  }
  return ok_status();
}

}  // namespace

Status Channel::send(std::span<const std::byte> message, std::chrono::milliseconds timeout,
                     int pass_fd) {
  if (message.size() > kMaxMessageBytes) {
    return invalid_argument(fmt::format("a message of {} bytes for {} exceeds the limit of {}",
                                        message.size(), peer_, kMaxMessageBytes));
  }
  const auto deadline = Clock::now() + timeout;
  std::size_t off = 0;
  bool first = true;
  do {
    const std::size_t n = std::min(kChunkBytes, message.size() - off);
    std::uint8_t more = off + n < message.size() ? 1 : 0;
    iovec iov[2] = {{&more, 1}, {const_cast<std::byte*>(message.data() + off), n}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (first && pass_fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    while (true) {
      // MSG_NOSIGNAL: a dead peer is EPIPE here, not SIGPIPE for the whole process.
      const ssize_t sent = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent >= 0) break;
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd_.get(), POLLOUT, 0};
        const int r = ::poll(&p, 1, remaining_ms(deadline, false));
        if (r == 0) {
          return timeout_error(
              fmt::format("{} did not read its messages within {} ms", peer_, timeout.count()));
        }
        if (r < 0 && errno != EINTR) return errno_status("poll", peer_, errno);
        continue;
      }
      if (errno == EPIPE || errno == ECONNRESET) {
        return aborted(
            fmt::format("{} closed the connection (process exited or was killed)", peer_));
      }
      return errno_status("sendmsg", peer_, errno);
    }
    off += n;
    first = false;
  } while (off < message.size());
  return ok_status();
}

Result<Received> Channel::receive(std::chrono::milliseconds timeout) {
  const bool forever = timeout.count() < 0;
  const auto deadline = Clock::now() + timeout;
  Received out;
  bool reset_seen = false;
  std::vector<std::byte> chunk(kChunkBytes + 1);
  while (true) {
    pollfd p{fd_.get(), POLLIN, 0};
    const int r = ::poll(&p, 1, remaining_ms(deadline, forever));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_status("poll", peer_, errno);
    }
    if (r == 0) {
      return timeout_error(fmt::format("no message from {} within {} ms", peer_, timeout.count()));
    }
    iovec iov{chunk.data(), chunk.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t got = ::recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      // A peer that closed with our messages unread leaves ECONNRESET pending, and Linux
      // reports it before messages the peer sent first (its ERROR). The error is cleared by
      // being reported, so read once more: the queued message or EOF comes next.
      if (errno == ECONNRESET && !reset_seen) {
        reset_seen = true;
        continue;
      }
      if (errno == ECONNRESET) {
        return aborted(fmt::format("{} reset the connection (process killed?)", peer_));
      }
      return errno_status("recvmsg", peer_, errno);
    }
    // Take ownership of any descriptor before looking at anything else, so no error leaks one.
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < n; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (!out.fd.valid()) {
          out.fd.reset(fd);
        } else {
          ::close(fd);
        }
      }
    }
    if (got == 0) {
      return aborted(fmt::format("{} closed the connection (process exited or was killed)", peer_));
    }
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
      return corruption(
          fmt::format("{} sent a datagram larger than {} bytes", peer_, chunk.size()));
    }
    const auto more = static_cast<std::uint8_t>(chunk[0]);
    if (more > 1) return corruption(fmt::format("{} sent a malformed chunk", peer_));
    if (out.bytes.size() + static_cast<std::size_t>(got) - 1 > kMaxMessageBytes) {
      return corruption(
          fmt::format("{} sent a message larger than {} bytes", peer_, kMaxMessageBytes));
    }
    out.bytes.insert(out.bytes.end(), chunk.begin() + 1, chunk.begin() + got);
    if (more == 0) return out;
  }
}

Result<Listener> Listener::bind(const std::string& address) {
  auto addr = resolve_local_address(address);
  if (!addr.ok()) return addr.status();
  Listener l;
  l.fd_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!l.fd_.valid()) return errno_status("socket", address, errno);
  if (addr->abstract()) {
    if (::bind(l.fd_.get(), reinterpret_cast<const sockaddr*>(&addr->addr), addr->len) != 0) {
      const int err = errno;
      bool stale = false;
      if (err == EADDRINUSE) return explain_address_in_use(*addr, SOCK_SEQPACKET, &stale);
      return errno_status("bind", address, err);
    }
  } else {
    // Bind on a private name, restrict it, then link it into place: no window in which
    // another user could connect to a 0777 socket file, and link() (unlike rename) never
    // replaces a live sender's socket.
    const std::string& path = addr->path;
    auto tmp = resolve_local_address(fmt::format("{}.tmp.{}", path, ::getpid()));
    if (!tmp.ok()) return tmp.status();
    ::unlink(tmp->path.c_str());
    if (::bind(l.fd_.get(), reinterpret_cast<const sockaddr*>(&tmp->addr), tmp->len) != 0) {
      return errno_status("bind", tmp->path, errno);
    }
    Status placed;
    if (::chmod(tmp->path.c_str(), 0600) != 0) placed = errno_status("chmod", tmp->path, errno);
    for (int attempt = 0; placed.ok() && attempt < 2; ++attempt) {
      if (::link(tmp->path.c_str(), path.c_str()) == 0) break;
      if (errno != EEXIST) {
        placed = errno_status("link", path, errno);
        break;
      }
      bool stale = false;
      placed = explain_address_in_use(*addr, SOCK_SEQPACKET, &stale);
      if (placed.ok() && attempt == 1) placed = already_exists(path + " is taken");
    }
    ::unlink(tmp->path.c_str());
    if (!placed.ok()) return placed;
    l.path_ = path;
  }
  l.address_ = address;
  if (::listen(l.fd_.get(), 64) != 0) return errno_status("listen", address, errno);
  return l;
}

Listener::Listener(Listener&& o) noexcept
    : fd_(std::move(o.fd_)), address_(std::move(o.address_)), path_(std::move(o.path_)) {
  o.path_.clear();
}

Listener& Listener::operator=(Listener&& o) noexcept {
  if (this != &o) {
    if (!path_.empty()) ::unlink(path_.c_str());
    fd_ = std::move(o.fd_);
    address_ = std::move(o.address_);
    path_ = std::move(o.path_);
    o.path_.clear();
  }
  return *this;
}

Listener::~Listener() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

Result<Channel> Listener::accept(std::chrono::milliseconds timeout) {
  const bool forever = timeout.count() < 0;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    pollfd p{fd_.get(), POLLIN, 0};
    const int r = ::poll(&p, 1, remaining_ms(deadline, forever));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno_status("poll", address_, errno);
    if (r == 0) {
      return timeout_error(
          fmt::format("no receiver connected to {} within {} ms", address_, timeout.count()));
    }
    ScopedFd fd(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      return errno_status("accept4", address_, errno);
    }
    pid_t pid = 0;
    Status s = check_same_user(fd.get(), fmt::format("a peer on {}", address_), &pid);
    if (!s.ok()) {
      // That peer's problem, not the caller's, who waits for a legitimate one.
      log::warn("shm: dropped a connection: {}", s.message());
      continue;
    }
    return Channel(std::move(fd), fmt::format("a receiver on {} (pid {})", address_, pid));
  }
}

Result<Channel> connect(const std::string& address, std::chrono::milliseconds timeout,
                        const std::string& role) {
  auto addr = resolve_local_address(address);
  if (!addr.ok()) return addr.status();
  const auto deadline = Clock::now() + timeout;
  const std::string peer = fmt::format("{} at {}", role, address);
  while (true) {
    ScopedFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return errno_status("socket", address, errno);
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr->addr), addr->len) == 0) {
      Status s = check_same_user(fd.get(), peer);
      if (!s.ok()) return s;
      return Channel(std::move(fd), peer);
    }
    const int err = errno;
    // Not listening yet: the two ends may start in either order.
    if (err == ENOENT || err == ECONNREFUSED || err == EAGAIN) {
      if (Clock::now() >= deadline) {
        return timeout_error(fmt::format("no {} listening at {} within {} ms ({})", role, address,
                                         timeout.count(), std::strerror(err)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    return errno_status("connect", address, err);
  }
}

}  // namespace ferry::shm
