// Hugging Face <-> Megatron-core weights for the Llama 3, Qwen2/2.5 and Qwen3 dense families:
// names, fused layouts (QKV per KV group, gate/up), tensor-parallel shards, grouped errors,
// and a streaming transform for the sync sender. docs/convert.md explains every layout and
// cites the Megatron-core and verl source it follows.
//
// The whole mapping reduces to one primitive: for each Megatron parameter and TP rank, a
// list of Runs saying which bytes of which HF tensor sit where in that rank's shard. Both
// directions copy along the same Runs, so a round trip is bit-exact by construction, and
// nothing ever needs a second copy of the model in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ferry/export.h"
#include "ferry/model.h"
#include "ferry/status.h"
#include "ferry/sync.h"
#include "ferry/tensor.h"

namespace ferry::convert {

// Where the two RMSNorms of a layer live on the Megatron side.
enum class NormLayout : std::uint8_t {
  // Transformer Engine spec (what verl builds): fused into the following linear as
  // self_attention.linear_qkv.layer_norm_weight and mlp.linear_fc1.layer_norm_weight.
  kFused = 0,
  // Megatron-core local spec: input_layernorm.weight and pre_mlp_layernorm.weight.
  kSeparate,
};
FERRY_EXPORT std::string_view norm_layout_name(NormLayout layout);  // "fused" / "separate"
FERRY_EXPORT Result<NormLayout> parse_norm_layout(std::string_view text);

struct MegatronLayout {
  int tp = 1;                             // tensor-parallel size; must divide the head counts
  NormLayout norms = NormLayout::kFused;  // TE spec, as verl's mcore models use
  // Rows of embedding/output_layer on the Megatron side. 0 means vocab_size. Megatron pads
  // the vocabulary (make_vocab_size_divisible_by * tp); padded rows are written as zeros
  // and dropped on the way back.
  std::int64_t padded_vocab_size = 0;
};

// How a Megatron parameter is cut across TP ranks.
enum class SplitKind : std::uint8_t {
  kReplicated,  // norms: every rank holds the whole tensor
  kColumn,      // dim 0 split (embedding rows, output_layer rows)
  kRow,         // dim 1 split (linear_proj, linear_fc2)
  kQkv,         // dim 0, by KV group; per group [q heads; k; v]
  kGateUp,      // dim 0; each rank holds [gate_r; up_r]
};
FERRY_EXPORT std::string_view split_kind_name(SplitKind kind);

// `count` blocks of `block_bytes`: block i is HF bytes [hf_offset + i * hf_stride, +block_bytes)
// and shard bytes [shard_offset + i * block_bytes, +block_bytes). The shard side of a run is
// contiguous; only the HF side strides (row-parallel splits).
struct Run {
  static constexpr int kZeros = -1;  // `source` of vocabulary padding: zeros, no HF tensor
  int source = 0;                    // index into MegatronParam::hf_names, or kZeros
  std::uint64_t shard_offset = 0;
  std::uint64_t hf_offset = 0;
  std::uint64_t block_bytes = 0;
  std::uint64_t count = 1;
  std::uint64_t hf_stride = 0;
  std::uint64_t bytes() const { return block_bytes * count; }
};

// One parameter of Megatron-core's GPTModel state dict.
struct MegatronParam {
  std::string name;  // "decoder.layers.0.self_attention.linear_qkv.weight"
  SplitKind split = SplitKind::kReplicated;
  std::vector<std::string> hf_names;      // q, k, v / gate, up / the one HF tensor
  std::vector<std::int64_t> shape;        // the whole (TP = 1) tensor
  std::vector<std::int64_t> shard_shape;  // what each TP rank holds
  std::int64_t layer = -1;                // -1 outside the decoder layers
};

// The full correspondence for one model, layout and dtype. Immutable once built.
struct FERRY_EXPORT Mapping {
  model::ModelConfig config;
  MegatronLayout layout;  // padded_vocab_size resolved (never 0)
  DType dtype = DType::kBF16;
  std::vector<TensorSpec> hf_tensors;  // HF names and shapes, in HF order
  std::vector<MegatronParam> params;   // Megatron names, in GPTModel state-dict order

  const MegatronParam* find_param(std::string_view name) const;
  // Index into hf_tensors, or -1.
  std::ptrdiff_t find_hf(std::string_view name) const;
  // What rank r's file holds for `param` (the same for every rank).
  TensorSpec shard_spec(const MegatronParam& param) const;
  std::vector<TensorSpec> shard_specs() const;

 private:
  friend Result<Mapping> build_mapping(const model::ModelConfig&, const MegatronLayout&, DType);
  std::unordered_map<std::string, std::size_t> param_index_;
  std::unordered_map<std::string, std::size_t> hf_index_;
};

// Checks the config against the layout (heads, KV groups, intermediate size and the padded
// vocabulary must divide by tp; dtype must be whole bytes); errors name the field.
FERRY_EXPORT Result<Mapping> build_mapping(const model::ModelConfig& config,
                                           const MegatronLayout& layout, DType dtype);

// Rank `rank`'s runs for `param`, sorted by shard_offset and tiling the shard exactly.
// REQUIRES: 0 <= rank < layout.tp.
FERRY_EXPORT std::vector<Run> shard_runs(const Mapping& mapping, const MegatronParam& param,
                                         int rank);

// --- Names and shapes: every problem at once, grouped, with the likely cause. ---

enum class Side : std::uint8_t { kHf, kMegatron };

// Names that differ only by layer number, folded into one line.
struct NameGroup {
  std::string pattern;               // "decoder.layers.N.self_attention.q_layernorm.weight"
  std::vector<std::int64_t> layers;  // sorted; empty for a name outside the layers
};

struct FERRY_EXPORT CheckReport {
  Side side = Side::kHf;
  std::string source;  // the folder or file checked, for messages
  std::vector<NameGroup> missing;
  std::vector<NameGroup> unexpected;
  std::vector<std::string> bad_tensors;  // shape or dtype mismatches, one line each
  std::vector<std::string> causes;       // likely causes, most specific first

  bool ok() const { return missing.empty() && unexpected.empty() && bad_tensors.empty(); }
  // Multi-line: "24 layers lack decoder.layers.N.self_attention.q_layernorm.weight (layers
  // 0-23)", ..., then "likely cause: ...".
  std::string to_string() const;
  // OK, or not_found (names missing) / failed_precondition (otherwise) carrying to_string().
  Status to_status() const;
};

// Compares tensors found in a checkpoint with what `mapping` expects on `side`. On the
// Megatron side `found` is one rank's file (shard shapes). Never stops at the first problem.
FERRY_EXPORT CheckReport check_tensors(const Mapping& mapping, Side side,
                                       std::span<const TensorSpec> found, std::string source = "");

// --- Streaming (sync sender: Megatron in, HF out). ---

// A piece of an HF tensor: a view of Megatron bytes that belong at `hf_offset` of
// mapping.hf_tensors[hf_index]. No bytes are copied to make one.
struct HfPiece {
  std::size_t hf_index = 0;
  std::uint64_t hf_offset = 0;
  std::span<const std::byte> data;
};

// Splits one TP rank's Megatron tensors into HF pieces as they pass, in any piece sizes: a
// fused QKV or fc1 tensor never has to be whole in memory, and no second model copy exists.
// Thread-safe (const after creation).
class FERRY_EXPORT MegatronToHfStream {
 public:
  static Result<MegatronToHfStream> create(Mapping mapping, int rank);

  const Mapping& mapping() const { return mapping_; }
  int rank() const { return rank_; }
  // The Megatron tensors this rank feeds in (names and shard shapes), in state-dict order.
  std::vector<TensorSpec> inputs() const { return mapping_.shard_specs(); }

  // Appends the HF pieces of shard bytes [offset, offset + data.size()) of tensor `name`.
  // Vocabulary padding yields no piece. Errors: unknown name, range past the shard's end.
  Status split(std::string_view name, std::uint64_t offset, std::span<const std::byte> data,
               std::vector<HfPiece>* out) const;

  // Convenience: a whole shard.
  Status split(const TensorView& shard, std::vector<HfPiece>* out) const {
    return split(shard.spec.name, 0, shard.data, out);
  }

 private:
  MegatronToHfStream(Mapping mapping, int rank);
  Mapping mapping_;
  int rank_ = 0;
  std::vector<std::vector<Run>> runs_;  // per param, this rank
};

// The HF tensors of a model whose TP ranks hold Megatron shards, for
// sync::Sender::send_round_gathered: each HF tensor, in HF order, as the parts of the shards that
// hold its bytes. Views only: a fused QKV or fc1 shard is split as the sender packs it,
// never copied whole. shards[r] holds rank r's Megatron tensors, for r = 0..tp-1; bytes
// every rank holds (the norms) are read from rank 0. Errors name the rank and tensor.
FERRY_EXPORT Result<std::vector<sync::GatheredTensor>> gather_hf_tensors(
    const Mapping& mapping, std::span<const std::vector<TensorView>> shards);

// --- Folders. ---
//
// Megatron side on disk (docs/convert.md):
//   DST/config.json                   the HF config (shapes are checked against it)
//   DST/ferry_megatron.json           {"format": "ferry-megatron", "version": 1, "tp": 2, ...}
//   DST/mp_rank_00/model.safetensors  rank 0's shards under Megatron names, and so on.

inline constexpr std::string_view kLayoutFileName = "ferry_megatron.json";

struct MegatronFolderInfo {
  MegatronLayout layout;
  DType dtype = DType::kBF16;
  std::vector<std::string> rank_files;  // relative to the folder, rank order
};
// "mp_rank_03/model.safetensors"
FERRY_EXPORT std::string rank_file_name(int rank);
FERRY_EXPORT Result<MegatronFolderInfo> read_megatron_layout(const std::string& folder);

struct ConvertOptions {
  MegatronLayout layout;  // used by hf -> megatron; megatron -> hf reads the folder's own
  // HF output shards close past this size (HF's save_pretrained default: 5 GB).
  std::uint64_t max_shard_bytes = 5'000'000'000ULL;
  bool overwrite = false;  // write into a non-empty destination
  // (bytes written, bytes in total); may be empty.
  std::function<void(std::uint64_t, std::uint64_t)> progress;
};

// What a conversion produced (for the CLI's summary).
struct ConvertSummary {
  std::size_t tensors_in = 0;
  std::size_t tensors_out = 0;
  std::uint64_t bytes_out = 0;
  std::vector<std::string> files;
};

// Both check all names and shapes first and write nothing if any problem is found. Each
// output file appears atomically; tensor bytes go from the mapped input straight to the
// writer, so memory use stays at one copy buffer, whatever the model size.
FERRY_EXPORT Result<ConvertSummary> hf_to_megatron(const std::string& src, const std::string& dst,
                                                   const ConvertOptions& options);
FERRY_EXPORT Result<ConvertSummary> megatron_to_hf(const std::string& src, const std::string& dst,
                                                   const ConvertOptions& options);

// What a conversion would find, without writing. One report per file checked (HF: one;
// Megatron: one per rank). A folder that cannot be read at all is an error Status.
FERRY_EXPORT Result<std::vector<CheckReport>> check_hf_folder(const std::string& src,
                                                              const MegatronLayout& layout);
FERRY_EXPORT Result<std::vector<CheckReport>> check_megatron_folder(const std::string& src);

}  // namespace ferry::convert
