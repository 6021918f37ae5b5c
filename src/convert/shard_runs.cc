// Byte runs between whole HF tensors and one TP rank's Megatron shard.
#include <cassert>

#include "ferry/convert.h"

namespace ferry::convert {
namespace {

std::uint64_t u(std::int64_t v) { return static_cast<std::uint64_t>(v); }

}  // namespace

std::vector<Run> shard_runs(const Mapping& m, const MegatronParam& p, int rank) {
  assert(rank >= 0 && rank < m.layout.tp);
  const std::uint64_t e = u(dtype_bits(m.dtype) / 8);
  const std::uint64_t t = u(m.layout.tp), r = u(rank);
  // Bytes of one dim-0 row of the whole tensor (1-D tensors: one element).
  std::uint64_t row = e;
  for (std::size_t d = 1; d < p.shape.size(); ++d) row *= u(p.shape[d]);
  std::vector<Run> runs;
  switch (p.split) {
    case SplitKind::kReplicated:
      runs.push_back(Run{0, 0, 0, row * u(p.shape[0]), 1, 0});
      break;
    case SplitKind::kColumn: {
      // Rows [r * n, (r + 1) * n) of the padded table; rows past vocab_size are padding.
      const std::uint64_t n = u(p.shard_shape[0]), first = r * n;
      const std::uint64_t vocab = u(m.config.vocab_size);
      const std::uint64_t real = first >= vocab ? 0 : std::min(n, vocab - first);
      if (real > 0) runs.push_back(Run{0, 0, first * row, real * row, 1, 0});
      if (real < n) runs.push_back(Run{Run::kZeros, real * row, 0, (n - real) * row, 1, 0});
      break;
    }
    case SplitKind::kRow: {
      // Each of the R rows contributes its columns [r * c, (r + 1) * c).
      const std::uint64_t rows = u(p.shape[0]), cols = u(p.shape[1]), c = cols / t;
      if (t == 1) {
        runs.push_back(Run{0, 0, 0, rows * cols * e, 1, 0});
      } else {
        runs.push_back(Run{0, 0, r * c * e, c * e, rows, cols * e});
      }
      break;
    }
    case SplitKind::kQkv: {
      // Megatron-core views linear_qkv's output as [ng, (np/ng + 2) * hn] and splits each group
      // into q heads, k, v (attention.py, get_query_key_value_tensors); rank r holds groups
      // [r * ng/t, (r + 1) * ng/t).
      const std::uint64_t hd = u(m.config.head_dim);
      const std::uint64_t groups = u(m.config.num_kv_heads) / t;
      const std::uint64_t qpg = u(m.config.num_heads / m.config.num_kv_heads);
      const std::uint64_t qb = qpg * hd * row, kb = hd * row;
      for (std::uint64_t j = 0; j < groups; ++j) {
        const std::uint64_t g = r * groups + j, base = j * (qb + 2 * kb);
        runs.push_back(Run{0, base, g * qb, qb, 1, 0});
        runs.push_back(Run{1, base + qb, g * kb, kb, 1, 0});
        runs.push_back(Run{2, base + qb + kb, g * kb, kb, 1, 0});
      }
      break;
    }
    case SplitKind::kGateUp: {
      // Split first, fused per rank: rank r holds [gate_r; up_r], not a slice of [gate; up].
      const std::uint64_t n = u(p.shard_shape[0]) / 2, bytes = n * row;
      runs.push_back(Run{0, 0, r * bytes, bytes, 1, 0});
      runs.push_back(Run{1, bytes, r * bytes, bytes, 1, 0});
      break;
    }
  }
  return runs;
}

}  // namespace ferry::convert
