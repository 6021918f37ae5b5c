// The safetensors format: a validating reader, a streaming writer, and sharded
// Hugging Face model folders (model.safetensors.index.json).
//
// File layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON,
// then the data section. Nothing in a header is trusted before it is checked;
// docs/safetensors.md lists every rule enforced.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.h"
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry {

// The spec's limit on the JSON header (safetensors' MAX_HEADER_SIZE).
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  TensorSpec spec;
  std::uint64_t begin = 0;  // offsets in the data section, [begin, end)
  std::uint64_t end = 0;
};

struct FERRY_EXPORT SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
  std::uint64_t data_offset = 0;  // 8 + N: where the data section starts in the file
  std::uint64_t data_bytes = 0;   // length of the data section

  const SafetensorsEntry* find(std::string_view name) const;
};

// Validates a header. `prefix` holds at least the file's first 8 + N bytes (or
// all of it if shorter); `file_size` is the whole file's size; `source` names
// the file in errors.
FERRY_EXPORT Result<SafetensorsHeader> parse_safetensors_header(std::span<const std::byte> prefix,
                                                                std::uint64_t file_size,
                                                                std::string_view source);

// Reads and validates only the header of a file: no tensor data is read.
FERRY_EXPORT Result<SafetensorsHeader> read_safetensors_header(const std::string& path);

// A memory-mapped, validated safetensors file. Views stay valid while it lives.
// Thread-safe for concurrent readers.
class FERRY_EXPORT SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const;
  const SafetensorsHeader& header() const;
  const std::vector<SafetensorsEntry>& tensors() const { return header().tensors; }
  // not_found when the file has no tensor of that name.
  Result<TensorView> view(std::string_view name) const;
  TensorView view(const SafetensorsEntry& entry) const;

 private:
  struct Impl;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Builds the header bytes (length prefix + JSON padded with spaces so the data
// section starts 8-byte aligned) for tensors laid out back to back in order.
FERRY_EXPORT Result<std::string> build_safetensors_header(
    const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata);

// Streams a safetensors file: the header is written first, then the caller's
// bytes in tensor order, in pieces of any size. finish() checks every byte
// arrived, fsyncs and renames into place; until then nothing exists under
// `path`, and destroying an unfinished writer removes its temporary file.
class FERRY_EXPORT SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> create(const std::string& path, std::vector<TensorSpec> tensors,
                                          std::map<std::string, std::string> metadata = {});
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept;
  ~SafetensorsWriter();

  // Appends data; more bytes than the tensors hold is an error.
  Status write(std::span<const std::byte> data);
  // Convenience: writes one whole tensor; REQUIRES it is the next one in order.
  Status write_tensor(const TensorView& tensor);
  Status finish();

  std::uint64_t bytes_written() const;
  std::uint64_t bytes_total() const;

 private:
  struct Impl;
  explicit SafetensorsWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A Hugging Face model folder: one model.safetensors, or shards listed by
// model.safetensors.index.json. Opening validates that every tensor of the
// index lives in exactly the shard it names and that every shard is present.
struct ModelTensor {
  SafetensorsEntry entry;
  std::string file;  // shard file name, relative to the folder
};

struct ModelIndex {
  std::string folder;
  std::vector<std::string> files;                      // shard names, in index order
  std::vector<ModelTensor> tensors;                    // in index (weight_map) order
  std::map<std::string, std::string> config_metadata;  // the index's "metadata" as text
};

// Headers only: no tensor data is read. Works on a folder or a single file.
FERRY_EXPORT Result<ModelIndex> read_model_index(const std::string& path);

// Opens every shard of a model folder (mapped) for reading tensor bytes.
class FERRY_EXPORT ModelFolder {
 public:
  static Result<ModelFolder> open(const std::string& path);
  ModelFolder(ModelFolder&&) noexcept;
  ModelFolder& operator=(ModelFolder&&) noexcept;
  ~ModelFolder();

  const ModelIndex& index() const;
  Result<TensorView> view(std::string_view name) const;
  // Every tensor in index order.
  std::vector<TensorView> views() const;

 private:
  struct Impl;
  explicit ModelFolder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes model.safetensors.index.json for shards already written.
FERRY_EXPORT Status write_model_index(const std::string& folder,
                                      const std::vector<ModelTensor>& tensors,
                                      std::uint64_t total_size);

}  // namespace ferry
