// Internals of the verl / Megatron folder tools shared by scanning, verify and replication
// (public API: include/ferry/checkpoint_tools.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "ferry/checkpoint_tools.h"
#include "ferry/status.h"

namespace ferry::checkpoint::megatron {

// "global_step_12" (verl) or "iter_0000012" (Megatron-LM) -> 12; nullopt for anything else.
std::optional<std::int64_t> parse_step_folder(std::string_view name);

// The step a tracker's text names: decimal digits, surrounding whitespace allowed.
// invalid_argument saying why not ("is empty", "names 'release'", ...).
Result<std::int64_t> parse_tracker(std::string_view text);

// Whether a relative path (already through validate_relative_path) is one replication may
// write: the tracker at the top, or a metadata file (common.pt, .metadata, metadata.json)
// inside a step folder, at most 8 components deep.
bool is_replica_path(std::string_view path);

// XXH3-64 and size of files, remembered by (size, mtime, ctime, inode) so a server or a
// watch does not re-read unchanged files every round.
class FileHashes {
 public:
  struct Entry {
    std::uint64_t bytes = 0;
    std::uint64_t xxh3 = 0;
  };
  // Errors name the path (not_found when it is gone).
  Result<Entry> get(const std::string& path);

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
