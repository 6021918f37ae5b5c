// vLLM's tensor-parallel slices of Hugging Face tensors (ferry/vllm_slices.h).
#include "ferry/vllm_slices.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#include "base/status_macros.h"

namespace ferry::convert {
namespace {

// How vLLM cuts one Hugging Face tensor.
enum class Rule { kWhole, kQ, kKv, kColumn, kRow, kVocab };

// The rule for `name`, from its module ("q_proj") and parameter ("weight"); nullopt when no
// rule covers it (the caller errs rather than guess).
std::optional<Rule> rule_for(std::string_view name) {
  const auto last_dot = name.rfind('.');
  if (last_dot == std::string_view::npos) return std::nullopt;
  const std::string_view param = name.substr(last_dot + 1);
  const std::string_view path = name.substr(0, last_dot);
  const auto module_dot = path.rfind('.');
  const std::string_view module =
      module_dot == std::string_view::npos ? path : path.substr(module_dot + 1);
  const bool weight = param == "weight";
  if (!weight && param != "bias") return std::nullopt;
  if (module == "q_proj") return Rule::kQ;
  if (module == "k_proj" || module == "v_proj") return Rule::kKv;
  if (module == "gate_proj" || module == "up_proj") return Rule::kColumn;
  // RowParallelLinear splits its input dimension; its bias (output-sized) is whole on every rank.
  if (module == "o_proj" || module == "down_proj") return weight ? Rule::kRow : Rule::kWhole;
  if ((module == "embed_tokens" || module == "lm_head") && weight) return Rule::kVocab;
  if (module.ends_with("norm") && weight) return Rule::kWhole;
  return std::nullopt;
}

std::uint64_t row_bytes(const TensorSpec& spec) {
  return spec.shape.empty() || spec.shape[0] == 0 ? 0 : spec.bytes() / spec.shape[0];
}

// Rows [first, first + count) of the whole tensor, at the start of a local tensor of
// `local_rows` rows (the rest padding).
Result<TensorSlice> rows(const TensorSpec& whole, std::int64_t first, std::int64_t count,
                         std::int64_t local_rows) {
  std::vector<std::int64_t> shape = whole.shape;
  shape[0] = local_rows;
  FERRY_ASSIGN_OR_RETURN(TensorSpec local, TensorSpec::make(whole.name, whole.dtype, shape));
  TensorSlice slice{whole, std::move(local), {}};
  if (count > 0) {
    const std::uint64_t row = row_bytes(whole);
    slice.runs.push_back({.slice_offset = 0,
                          .whole_offset = static_cast<std::uint64_t>(first) * row,
                          .block_bytes = static_cast<std::uint64_t>(count) * row});
  }
  return slice;
}

// Columns [first, first + count) of a matrix: one block per row.
Result<TensorSlice> columns(const TensorSpec& whole, std::int64_t first, std::int64_t count) {
  FERRY_ASSIGN_OR_RETURN(TensorSpec local,
                         TensorSpec::make(whole.name, whole.dtype, {whole.shape[0], count}));
  FERRY_ASSIGN_OR_RETURN(std::uint64_t element,
                         byte_size(whole.dtype, 1, fmt::format("tensor '{}'", whole.name)));
  const std::uint64_t row = static_cast<std::uint64_t>(whole.shape[1]) * element;
  TensorSlice slice{whole, std::move(local), {}};
  if (whole.shape[0] > 0 && count > 0) {
    slice.runs.push_back({.slice_offset = 0,
                          .whole_offset = static_cast<std::uint64_t>(first) * element,
                          .block_bytes = static_cast<std::uint64_t>(count) * element,
                          .count = static_cast<std::uint64_t>(whole.shape[0]),
                          .whole_stride = row});
  }
  return slice;
}

class Slicer {
 public:
  Slicer(const model::ModelConfig& config, int tp_rank, int tp_size)
      : c_(config), rank_(tp_rank), tp_(tp_size) {}

  Status check_layout() const {
    if (tp_ < 1 || rank_ < 0 || rank_ >= tp_) {
      return invalid_argument(
          fmt::format("tensor-parallel rank {} of size {}: give 0 <= rank < size", rank_, tp_));
    }
    if (c_.num_heads % tp_ != 0) {
      return invalid_argument(
          fmt::format("tensor-parallel size {} does not divide the model's {} attention heads", tp_,
                      c_.num_heads));
    }
    const bool replicated = tp_ >= c_.num_kv_heads;
    if (c_.num_kv_heads < 1 || (replicated ? tp_ % c_.num_kv_heads : c_.num_kv_heads % tp_) != 0) {
      return invalid_argument(fmt::format(
          "tensor-parallel size {} and the model's {} key/value heads: one must divide the other",
          tp_, c_.num_kv_heads));
    }
    if (c_.intermediate_size % tp_ != 0) {
      return invalid_argument(
          fmt::format("tensor-parallel size {} does not divide the MLP's intermediate size {}", tp_,
                      c_.intermediate_size));
    }
    return ok_status();
  }

  Result<TensorSlice> slice(const TensorSpec& t) const {
    const std::optional<Rule> rule = rule_for(t.name);
    if (!rule) {
      return invalid_argument(fmt::format(
          "'{}': no vLLM tensor-parallel rule for this tensor (ferry knows the Llama, Qwen2 and "
          "Qwen3 dense families); receive it whole",
          t.name));
    }
    if (*rule == Rule::kWhole) {
      TensorSlice whole{t, t, {}};
      if (t.bytes() != 0) whole.runs.push_back({.block_bytes = t.bytes()});
      return whole;
    }
    const std::int64_t head = c_.head_dim;
    switch (*rule) {
      case Rule::kQ: {
        const std::int64_t per = c_.num_heads / tp_ * head;
        FERRY_RETURN_IF_ERROR(expect_dim0(t, c_.num_heads * head, "attention heads x head_dim"));
        return rows(t, rank_ * per, per, per);
      }
      case Rule::kKv: {
        FERRY_RETURN_IF_ERROR(expect_dim0(t, c_.num_kv_heads * head, "key/value heads x head_dim"));
        if (tp_ >= c_.num_kv_heads) {  // one head per rank, each head on tp / kv ranks
          const std::int64_t replicas = tp_ / c_.num_kv_heads;
          return rows(t, rank_ / replicas * head, head, head);
        }
        const std::int64_t per = c_.num_kv_heads / tp_ * head;
        return rows(t, rank_ * per, per, per);
      }
      case Rule::kColumn: {
        FERRY_RETURN_IF_ERROR(expect_dim0(t, c_.intermediate_size, "intermediate_size"));
        const std::int64_t per = c_.intermediate_size / tp_;
        return rows(t, rank_ * per, per, per);
      }
      case Rule::kRow: {
        if (t.shape.size() != 2 || t.shape[1] % tp_ != 0) {
          return invalid_argument(fmt::format(
              "'{}' is {}: a row-parallel weight must be a matrix whose dim 1 tensor-parallel "
              "size {} divides",
              t.name, t.shape_string(), tp_));
        }
        const std::int64_t per = t.shape[1] / tp_;
        return columns(t, rank_ * per, per);
      }
      case Rule::kVocab: {
        FERRY_RETURN_IF_ERROR(expect_dim0(t, c_.vocab_size, "vocab_size"));
        const std::int64_t padded =
            (c_.vocab_size + kVllmVocabPadding - 1) / kVllmVocabPadding * kVllmVocabPadding;
        if (padded % tp_ != 0) {
          return invalid_argument(fmt::format(
              "'{}': tensor-parallel size {} does not divide the padded vocabulary ({} rows)",
              t.name, tp_, padded));
        }
        const std::int64_t per = padded / tp_;
        const std::int64_t first = rank_ * per;
        const std::int64_t count = std::clamp<std::int64_t>(c_.vocab_size - first, 0, per);
        return rows(t, first, count, per);
      }
      case Rule::kWhole:
        break;
    }
    return internal_error(fmt::format("'{}': rule without a slicing", t.name));
  }

 private:
  static Status expect_dim0(const TensorSpec& t, std::int64_t rows, std::string_view what) {
    if (t.shape.empty() || t.shape.size() > 2 || t.shape[0] != rows) {
      return invalid_argument(fmt::format("'{}' is {}, but the config's {} gives {} rows", t.name,
                                          t.shape_string(), what, rows));
    }
    return ok_status();
  }

  const model::ModelConfig& c_;
  int rank_;
  int tp_;
};

}  // namespace

Result<std::vector<TensorSlice>> vllm_tp_slices(const model::ModelConfig& config,
                                                std::span<const TensorSpec> tensors, int tp_rank,
                                                int tp_size) {
  Slicer slicer(config, tp_rank, tp_size);
  FERRY_RETURN_IF_ERROR(slicer.check_layout());
  std::vector<TensorSlice> slices;
  slices.reserve(tensors.size());
  for (const TensorSpec& t : tensors) {
    FERRY_ASSIGN_OR_RETURN(TensorSlice s, slicer.slice(t));
    FERRY_RETURN_IF_ERROR(s.check());
    slices.push_back(std::move(s));
  }
  return slices;
}

}  // namespace ferry::convert
