// Internals of the tools for verl / Megatron-LM distributed checkpoint folders
// (global_step_<N> or iter_<N> step folders of torch.distributed.checkpoint shards and
// metadata), shared by scanning, verify and replication (public API:
// include/ferry/megatron.h). Not convert's own Megatron layout
// (src/convert/ferry_megatron_layout.cc).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/file_util.h"
#include "ferry/megatron.h"
#include "ferry/status.h"

namespace ferry::checkpoint::megatron {

// A verl or Megatron-LM step folder: "global_step_12" (verl) or "iter_0000012" (Megatron-LM)
// -> 12; nullopt for anything else (ferry's own "step_12" too: format::parse_ferry_step_folder).
std::optional<std::int64_t> parse_megatron_step_folder(std::string_view name);

// The step a tracker's text names: decimal digits, surrounding whitespace allowed.
// invalid_argument saying why not ("is empty", "names 'release'", ...).
Result<std::int64_t> parse_tracker(std::string_view text);

// Whether a relative path (already through validate_relative_path) is one replication may
// write: the tracker at the top, or a metadata file (common.pt, .metadata, metadata.json)
// inside a step folder, at most 8 components deep.
bool is_replica_path(std::string_view path);

// Opening below a folder without ever following a symbolic link: every component of a
// relative path is opened with openat(O_NOFOLLOW) from the folder before it, so a link
// swapped in anywhere (a race with the checks) fails the open instead of leading outside.
// Errors name `root` and the path; a link met on the way is failed_precondition.
Result<ScopedFd> open_root(const std::string& root);
// The folder holding `rel`'s last component (`rel` itself excluded); with `create`, missing
// folders are made (mkdirat) on the way.
Result<ScopedFd> open_parent_beneath(int root_fd, const std::string& root, std::string_view rel,
                                     bool create);
// The regular file `rel` below `root_fd`, its fstat() in `st`; a FIFO, a device or a link
// is refused (failed_precondition).
Result<ScopedFd> open_file_beneath(int root_fd, const std::string& root, std::string_view rel,
                                   struct stat* st);
// All of an fd opened so, read to its end (a file that grew gives the longer content).
Result<std::string> read_open_file(int fd, const struct stat& st, const std::string& what);
// The whole content of the regular file `rel` below `root_fd`, read from the one fd whose
// fstat() goes in `st`: a FIFO, a device or a link is refused (failed_precondition).
Result<std::string> read_beneath(int root_fd, const std::string& root, std::string_view rel,
                                 struct stat* st);
// Writes `data` to `rel` below `root_fd`: into a fresh temp name made with O_CREAT|O_EXCL|
// O_NOFOLLOW beside it, fsync, then renameat over `rel` (which replaces a link there rather
// than writing through it). Parent folders are made; a link on the way is refused.
Status write_beneath(int root_fd, const std::string& root, std::string_view rel,
                     std::span<const std::byte> data);

// XXH3-64 and size of files, remembered by (size, mtime, ctime, inode) so a server or a
// watch does not re-read unchanged files every round.
class FileHashes {
 public:
  struct Entry {
    std::uint64_t bytes = 0;
    std::uint64_t xxh3 = 0;
  };
  // `rel` below `root`, opened and read as read_beneath() does. Errors name the path
  // (not_found when it is gone, failed_precondition for a link or a non-regular file).
  Result<Entry> get(const std::string& root, const std::string& rel);

 private:
  struct Key {
    std::uint64_t bytes, inode;
    std::int64_t mtime_ns, ctime_ns;
    bool operator==(const Key&) const = default;
  };
  std::map<std::string, std::pair<Key, Entry>> cache_;
};

// replica_set() with a hash cache kept by the caller.
Result<ReplicaSet> replica_set(const std::string& root, FileHashes& hashes);

}  // namespace ferry::checkpoint::megatron
