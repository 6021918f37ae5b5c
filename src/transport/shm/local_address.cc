#include "transport/shm/local_address.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/file_util.h"

namespace ferry::shm {

Result<std::string> private_socket_dir() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  const std::string dir = (xdg != nullptr && xdg[0] == '/')
                              ? std::string(xdg) + "/ferry"
                              : fmt::format("/tmp/ferry-{}", ::geteuid());
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return errno_status("mkdir", dir, errno);
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return errno_status("lstat", dir, errno);
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) {
    return failed_precondition(fmt::format(
        "{} (ferry's private socket directory) is not a directory but a {}: remove it, or use "
        "an '@name' or a path with '/'",
        dir, S_ISLNK(st.st_mode) ? "symlink" : "file"));
  }
  if (st.st_uid != ::geteuid()) {
    return failed_precondition(fmt::format(
        "{} (ferry's private socket directory) belongs to uid {}, not to this process's uid {}: "
        "another user may have created it to catch ferry's sockets; remove it",
        dir, st.st_uid, ::geteuid()));
  }
  if ((st.st_mode & 077) != 0) {
    return failed_precondition(fmt::format(
        "{} (ferry's private socket directory) has mode {:o}; it must be 0700 (chmod 700 it)", dir,
        st.st_mode & 0777));
  }
  return dir;
}

Result<LocalAddress> resolve_local_address(const std::string& address) {
  LocalAddress a;
  a.display = address;
  a.addr.sun_family = AF_UNIX;
  std::string name;  // bytes for sun_path
  if (address.empty() || address == "@") {
    return invalid_argument(fmt::format(
        "socket address '{}' has no name: use '@name' (abstract), 'name' (a socket in this "
        "user's private directory) or a path with '/'",
        address));
  }
  if (address[0] == '@') {
    name = address;
  } else if (address.find('/') != std::string::npos) {
    a.path = address;
    name = address;
  } else {
    auto dir = private_socket_dir();
    if (!dir.ok()) return dir.status().with_context("socket address '" + address + "'");
    a.path = *dir + "/" + address;
    name = a.path;
  }
  if (name.size() >= sizeof(a.addr.sun_path)) {
    return invalid_argument(fmt::format("socket address '{}' ({}) is longer than {} characters",
                                        address, name, sizeof(a.addr.sun_path) - 1));
  }
  std::memcpy(a.addr.sun_path, name.data(), name.size());
  if (a.abstract()) a.addr.sun_path[0] = '\0';  // Linux abstract namespace
  a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() +
                                 (a.abstract() ? 0 : 1));
  return a;
}

Status explain_address_in_use(const LocalAddress& a, int type, bool* stale) {
  *stale = false;
  struct stat st {};
  if (!a.abstract() && ::lstat(a.path.c_str(), &st) == 0 && !S_ISSOCK(st.st_mode)) {
    return already_exists(
        fmt::format("socket address '{}': {} exists and is not a socket", a.display, a.path));
  }
  ScopedFd probe(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!probe.valid()) return errno_status("socket", a.display, errno);
  if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) != 0) {
    const int err = errno;
    if (!a.abstract() && err == ECONNREFUSED) {
      // A socket file nobody listens on: left by a process that died. Safe to replace.
      *stale = true;
      ::unlink(a.path.c_str());
      return ok_status();
    }
    return already_exists(fmt::format(
        "socket address '{}' is in use but does not answer a connection ({}); pick another name",
        a.display, std::strerror(err)));
  }
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(probe.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return errno_status("getsockopt(SO_PEERCRED)", a.display, errno);
  }
  const bool ours = cred.uid == ::geteuid();
  return already_exists(fmt::format(
      "socket address '{}' is already taken by pid {} (uid {}{}): {}", a.display, cred.pid,
      cred.uid, ours ? ", this user" : ", ANOTHER user",
      ours ? "a running ferry (or another program) listens there: stop it or pick another name"
           : "another user took this abstract name, possibly to intercept the session; use a "
             "name without '@' (a socket in this user's private directory)"));
}

}  // namespace ferry::shm
