// Where a node-local socket lives, in the three forms users write:
//   "@name"      the Linux abstract namespace: no file, gone with the process, but any
//                user on the machine can bind the name first (squat it) or connect;
//   "name"       (no '/') a socket file in this user's private directory,
//                $XDG_RUNTIME_DIR/ferry/name if that is set, else /tmp/ferry-<uid>/name;
//                the directory is 0700 and ours, so no other user can take the name;
//   "a/path"     (any '/') that socket file path, as given.
// The shm transport and the checkpoint local group both resolve addresses here.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <string>

#include "ferry/status.h"

namespace ferry::shm {

struct LocalAddress {
  std::string display;  // what the user wrote, for messages
  std::string path;     // the socket file; empty for an abstract name
  sockaddr_un addr{};
  socklen_t len = 0;
  bool abstract() const { return path.empty(); }
};

// Resolves `address`; for "name", creates the private directory (0700) when missing and
// refuses one that is a symlink, not ours, or open to others.
Result<LocalAddress> resolve_local_address(const std::string& address);

// The private directory "name" resolves into (created and checked as above).
Result<std::string> private_socket_dir();

// `fd` is a fresh socket of `type` that failed to bind `a` because the name is in use (or
// the file exists): says who holds it, from SO_PEERCRED of a connection to it (pid, uid),
// or that nothing answers there (a stale file, which is then removed so a retry binds;
// *stale is set). The Status is kAlreadyExists naming the holder.
Status explain_address_in_use(const LocalAddress& a, int type, bool* stale);

}  // namespace ferry::shm
