// The file helpers of replication's file-set mode (ReplicateServeOptions::offer,
// ReplicatePullOptions::only): shard files of many GB, so nothing here holds a file whole in
// memory. The public xxh3_file() is declared in ferry/megatron.h.
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "base/file_util.h"
#include "ferry/status.h"

namespace ferry::checkpoint::replicate {

// Bytes per read when hashing a file: big enough that a read costs little beside its hash.
inline constexpr std::size_t kHashReadBytes = 8u << 20;

// An XXH3 streaming state, reset; internal_error when none can be made.
struct Xxh3Free {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using Xxh3State = std::unique_ptr<XXH3_state_t, Xxh3Free>;
Result<Xxh3State> new_xxh3_state();

// XXH3-64 of everything `fd` holds from offset 0 to its end (pread, kHashReadBytes at a
// time); `bytes` gets how many were hashed when not null. `what` names the file in errors.
Result<std::uint64_t> xxh3_fd(int fd, const std::string& what, std::uint64_t* bytes = nullptr);

// A file below a folder written as its bytes arrive and hashed as they are written: a fresh
// temp name beside the target made with O_CREAT|O_EXCL|O_NOFOLLOW, every folder on the way
// opened with O_NOFOLLOW (missing ones made), then commit(): fsync, renameat over the target
// (which replaces a link there rather than writing through it), fsync of the folder. Dropped
// before commit() succeeds, it removes its temp file: the target is never half written.
// Move-only.
class StreamedFile {
 public:
  // `rel` below `root` (made if missing); a link on the way is failed_precondition.
  static Result<StreamedFile> create(const std::string& root, const std::string& rel);

  StreamedFile(StreamedFile&&) noexcept = default;
  StreamedFile& operator=(StreamedFile&&) noexcept = default;
  ~StreamedFile();

  // Writes `data` at the end (Env::current(), so tests can fail it) and hashes it.
  Status append(std::span<const std::byte> data);
  // XXH3-64 and size of what was appended so far.
  std::uint64_t xxh3() const;
  std::uint64_t bytes() const { return bytes_; }
  // fsync, rename over the target, fsync of its folder. On failure the temp file is removed.
  Status commit();
  // "<root>/<rel>", for messages.
  const std::string& path() const { return full_; }

 private:
  StreamedFile() = default;
  void discard();

  ScopedFd dir_, fd_;
  std::string name_, temp_, full_;
  Xxh3State hash_;
  std::uint64_t bytes_ = 0;
};

}  // namespace ferry::checkpoint::replicate
