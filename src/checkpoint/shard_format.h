// How a rank's slices are stored in its shard file: the writer behind save(), the reader
// behind load() and the check behind `ferry ckpt verify`. Save, load and verify reach shard
// files through this interface only. A manifest names its format ("shard_format"; absent:
// safetensors) and shard_format_for() finds it. Safetensors is the only format so far
// (safetensors_shard.cc; docs/checkpoint-format.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/checkpoint.h"
#include "ferry/status.h"

namespace ferry::checkpoint {

inline constexpr std::string_view kDefaultShardFormat = "safetensors";

// What a writer wrote, as the manifest lists it.
struct WrittenShard {
  SavedFile file;  // file (relative to the step folder), rank, bytes; node left empty
  // One tensor per slice written, in the order given, each with that one slice (every
  // field of the SavedSlice set) and the tensor's dtype and global shape.
  std::vector<SavedTensor> tensors;
};

// A slice of the manifest with its tensor.
struct ManifestSlice {
  const SavedTensor* tensor;
  const SavedSlice* slice;
};

// What verify found in one shard file.
struct ShardCheck {
  struct Problem {
    std::string tensor;  // "" when the problem is the whole file
    std::string message;
  };
  std::vector<Problem> problems;  // empty: the file matches its manifest entries
  std::uint64_t slices_checked = 0;
  std::uint64_t bytes_checked = 0;
};

// One shard file, open for reading. Thread-safe: slice() may run on several threads at
// once. The bytes it hands out stay valid as long as the reader lives. Not copyable.
class ShardReader {
 public:
  virtual ~ShardReader() = default;
  // The bytes of saved slice `s` of tensor `t`, once the file is seen to hold it where the
  // manifest puts it (dtype, shape, offset, size); corruption naming the file and the tensor
  // otherwise. Not hashed: the caller checks the manifest's XXH3.
  virtual Result<std::span<const std::byte>> slice(const SavedTensor& t,
                                                   const SavedSlice& s) const = 0;
};

// A shard file format. Implementations are stateless singletons: every method is const and
// thread-safe.
class ShardFormat {
 public:
  virtual ~ShardFormat() = default;
  // The format's name in the manifest.
  virtual std::string_view name() const = 0;
  // The file rank `rank` writes, relative to the step folder.
  virtual std::string file_name(int rank) const = 0;
  // Writes rank `rank`'s slices of step `step` as its one file in the step folder `dir`,
  // durably (a temporary file, fsync, rename, fsync of the folder), with the XXH3 of each
  // slice; calls progress(bytes) after each slice (if set). A rank with no slices still
  // writes a file. The error names the file.
  virtual Result<WrittenShard> write(const std::string& dir, std::int64_t step, int rank,
                                     std::span<const SliceView* const> slices,
                                     const std::function<void(std::uint64_t)>& progress) const = 0;
  // Opens the shard file at `path`; the error names it.
  virtual Result<std::shared_ptr<const ShardReader>> open(const std::string& path) const = 0;
  // Checks the shard file at `path` (which exists) against its manifest entry `file` and
  // `slices` (its slices, in the manifest's order): its size, where each slice lies, and each
  // slice's XXH3. Calls progress(bytes) after each slice hashed (if set).
  virtual ShardCheck verify(const std::string& path, const SavedFile& file,
                            std::span<const ManifestSlice> slices,
                            const std::function<void(std::uint64_t)>& progress) const = 0;
};

// The format named `name`: "safetensors" only. failed_precondition naming it otherwise.
// The result lives as long as the process.
Result<const ShardFormat*> shard_format_for(std::string_view name);

}  // namespace ferry::checkpoint
