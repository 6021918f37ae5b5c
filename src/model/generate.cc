// Synthetic Hugging Face model folders with real shapes.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "base/atomic_file.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "ferry/model.h"
#include "ferry/safetensors.h"

namespace ferry::model {
namespace {

constexpr std::size_t kChunkBytes = 8 << 20;

std::string shard_name(std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

Status generate_model_folder(const ModelConfig& config, const std::string& folder,
                             const GenerateOptions& options) {
  if (config.num_layers < 0 || config.hidden_size <= 0 || config.vocab_size <= 0) {
    return invalid_argument("model config has non-positive sizes");
  }
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) return io_error("create folder " + folder + ": " + ec.message());

  // Shards in order; a shard closes once it reaches max_shard_bytes, as HF's save_pretrained does.
  const std::vector<TensorSpec> specs = hf_tensor_specs(config, options.dtype);
  std::vector<std::vector<TensorSpec>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (const TensorSpec& t : specs) {
    if (in_shard > 0 && in_shard + t.bytes() > options.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += t.bytes();
    total += t.bytes();
  }

  std::vector<std::byte> chunk(kChunkBytes);
  std::vector<ModelTensor> index;
  std::uint64_t done = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        shards.size() == 1 ? "model.safetensors" : shard_name(s, shards.size());
    auto writer = SafetensorsWriter::create(folder + "/" + file, shards[s], {{"format", "pt"}});
    if (!writer.ok()) return writer.status();
    for (const TensorSpec& t : shards[s]) {
      for (std::uint64_t off = 0; off < t.bytes(); off += kChunkBytes) {
        const std::size_t n =
            static_cast<std::size_t>(std::min<std::uint64_t>(kChunkBytes, t.bytes() - off));
        std::span<std::byte> piece(chunk.data(), n);
        fill_synthetic(options.seed, t.name, off, piece);
        FERRY_RETURN_IF_ERROR(writer->write(piece));
        done += n;
        if (options.progress) options.progress(done, total);
      }
      index.push_back({SafetensorsEntry{t, 0, 0}, file});
    }
    FERRY_RETURN_IF_ERROR(writer->finish());
  }
  if (shards.size() > 1) {
    FERRY_RETURN_IF_ERROR(write_model_index(folder, index, total));
  }
  return write_file_atomic(folder + "/config.json", hf_config_json(config, options.dtype));
}

}  // namespace ferry::model
