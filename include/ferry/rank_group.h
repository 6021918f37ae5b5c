// How the ranks of one collective checkpoint save or load coordinate (docs/checkpoint.md):
// the RankGroup interface and its two implementations, ranks on one machine
// (connect_local_group) and ranks on any machines (connect_net_group).
//
//   auto group = ferry::checkpoint::connect_net_group({.rank = r, .size = n, ...});
//   ferry::checkpoint::Checkpointer ckpt(**group, {.root = "/local/ckpt"});
//
// Thread safety: as ferry/checkpoint.h says for a Checkpointer and its group.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.h"
#include "ferry/status.h"

namespace ferry::checkpoint {

// ---------------------------------------------------------------------------
// Rank group: how the ranks of one save or load coordinate.

// What a collective save or load needs from the ranks' transport. Every
// collective call (all_gather, broadcast, barrier) must be made by every rank,
// in the same order. Two ways to join one (a single implementation on two
// transports): connect_local_group() (threads or processes on one machine, the
// shm transport's UNIX sockets) and connect_net_group() (ranks on any machines,
// UCX with token authentication).
class FERRY_EXPORT RankGroup {
 public:
  virtual ~RankGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The name of this rank's node; ranks with the same name share a local root.
  // A path component: letters, digits, '.', '_', '-' (checked at group creation).
  virtual const std::string& node() const = 0;

  // Every rank's `mine`, indexed by rank.
  virtual Result<std::vector<std::string>> all_gather(std::string_view mine) = 0;
  // `data` of rank `root`; the others' `data` is ignored.
  virtual Result<std::string> broadcast(std::string_view data, int root) = 0;
  virtual Status barrier() = 0;

  // Point-to-point: sends `request` to rank `peer`, whose handler answers it.
  // Not collective; any number may be in flight from different threads.
  virtual Result<std::string> fetch(int peer, std::string_view request) = 0;
  // Like fetch(), but the answer must be exactly out.size() bytes and lands in
  // `out` without a copy in between where the transport allows. The default
  // calls fetch() and copies.
  virtual Status fetch_into(int peer, std::string_view request, std::span<std::byte> out);

  // A handler's answer: bytes it owns, or bytes it borrows (from a mapped shard)
  // that `keep_alive` keeps valid until they are sent.
  struct FetchReply {
    std::string owned;
    std::span<const std::byte> borrowed;
    std::shared_ptr<const void> keep_alive;
    std::span<const std::byte> bytes() const {
      return borrowed.data() != nullptr
                 ? borrowed
                 : std::span<const std::byte>(reinterpret_cast<const std::byte*>(owned.data()),
                                              owned.size());
    }
  };
  // Installs (or, with an empty function, removes) the handler that answers
  // other ranks' fetches. Called on server threads, possibly concurrently.
  using FetchHandler = std::function<Result<FetchReply>(int from, std::string_view request)>;
  virtual void set_fetch_handler(FetchHandler handler) = 0;
};

struct LocalGroupOptions {
  // Rank 0 listens here, the others connect (the shm transport; a "host:port"
  // address is refused: that is connect_net_group's): "@name" is an abstract UNIX socket
  // (nothing on disk, gone with the process, but another user can bind it first);
  // "name" (no '/') a socket in this user's private 0700 directory
  // ($XDG_RUNTIME_DIR/ferry, else /tmp/ferry-<uid>); a path with '/' that socket file.
  // A taken address fails with kAlreadyExists naming the holder's pid and uid. Rank 0
  // drops, with a warning, connections from another user (SO_PEERCRED) and ones that
  // say nothing, each of which has until `timeout` to speak beside the others.
  std::string root_address;
  int rank = 0;
  int size = 1;
  std::string node = "node0";
  // How long to wait for every rank to join, and for a peer to answer a fetch.
  // A dead peer is seen at once anyway (socket EOF); timeouts catch hung ones.
  std::chrono::milliseconds timeout{120'000};
  // How long a collective waits for the slowest rank: long, because ranks reach
  // a save's barriers after writing shards of very different sizes.
  std::chrono::milliseconds collective_timeout{1'800'000};
};

// Joins a group of ranks that are threads or processes on this machine. Each
// "node" is just a name with its own root folder, so tests model several nodes
// without shared storage. Blocks until all `size` ranks joined.
FERRY_EXPORT Result<std::unique_ptr<RankGroup>> connect_local_group(
    const LocalGroupOptions& options);

struct NetGroupOptions {
  // "host:port" (or "[v6]:port") that rank 0 listens on and every other rank
  // connects to, as torch's MASTER_ADDR:MASTER_PORT. Rank 0 stops listening
  // once every rank joined.
  std::string root_address;
  int rank = 0;
  int size = 1;
  std::string node = "node0";
  // Where this rank serves fetches, "host:port"; port 0 takes an ephemeral port.
  // A wildcard host (0.0.0.0 or [::]) listens on every interface and is
  // advertised to the others as the address rank 0 saw this rank connect from
  // (for rank 0: the host of root_address). Name one interface to pin it.
  std::string serve_address = "0.0.0.0:0";
  // The session secret every rank must share. "": FERRY_TOKEN, else the file
  // named by FERRY_TOKEN_FILE (which must have mode 0600 or 0400); with none of
  // them connect_net_group() fails. Never logged.
  std::string token;
  // How long to wait for every rank to join, and for a peer to answer a fetch.
  // A dead peer is seen at once anyway (UCX endpoint error); timeouts catch hung ones.
  std::chrono::milliseconds timeout{120'000};
  // How long a collective waits for the slowest rank (see LocalGroupOptions).
  std::chrono::milliseconds collective_timeout{1'800'000};
};

// Joins a group of ranks on any machines through UCX (docs/transport-net.md):
// TCP here, RDMA where the cluster has it. Every connection is authenticated
// with the token first; a peer with another token is refused and both sides
// name each other (rank 0 keeps waiting for the real rank, so a stranger cannot
// break the join; its timeout error lists whom it refused). Nothing assumes a
// shared filesystem. Blocks until all `size` ranks joined.
//
// Collectives go through rank 0 as in the local group. Fetch answers travel as
// UCX bulk transfers straight into the caller's buffer; each rank answers them
// on a thread of its own, so a rank serves while it waits in a collective (the
// local group does the same, its answers in sealed shared memory).
// Fetches and collectives from this rank are carried out one at a time (callers
// on several threads take turns). When a rank dies, a collective fails on every
// rank with aborted naming it, at once; a fetch from it fails likewise. After a
// collective failed the group is broken: every later collective returns that
// error. The handler set by set_fetch_handler() runs on the serving thread, one
// request at a time; set_fetch_handler() returns once no call of the previous
// handler is running.
FERRY_EXPORT Result<std::unique_ptr<RankGroup>> connect_net_group(const NetGroupOptions& options);

}  // namespace ferry::checkpoint
