// Megatron shard bytes -> HF pieces, as views, for any piece boundaries.
#include <algorithm>

#include "ferry/convert.h"

namespace ferry::convert {

MegatronToHfStream::MegatronToHfStream(Mapping mapping, int rank)
    : mapping_(std::move(mapping)), rank_(rank) {
  runs_.reserve(mapping_.params.size());
  for (const MegatronParam& p : mapping_.params) runs_.push_back(shard_runs(mapping_, p, rank_));
}

Result<MegatronToHfStream> MegatronToHfStream::create(Mapping mapping, int rank) {
  if (rank < 0 || rank >= mapping.layout.tp) {
    return invalid_argument("TP rank " + std::to_string(rank) + " is outside [0, " +
                            std::to_string(mapping.layout.tp) + ")");
  }
  return MegatronToHfStream(std::move(mapping), rank);
}

Status MegatronToHfStream::split(std::string_view name, std::uint64_t offset,
                                 std::span<const std::byte> data, std::vector<HfPiece>* out) const {
  const MegatronParam* p = mapping_.find_param(name);
  if (p == nullptr) {
    return not_found("tensor '" + std::string(name) +
                     "' is not a Megatron-core parameter of this " + mapping_.config.family +
                     " model (check_tensors lists what is expected)");
  }
  const std::uint64_t shard_bytes = mapping_.shard_spec(*p).bytes();
  if (offset > shard_bytes || data.size() > shard_bytes - offset) {
    return invalid_argument("bytes [" + std::to_string(offset) + ", " +
                            std::to_string(offset + data.size()) + ") of '" + std::string(name) +
                            "' pass the end of its shard (" + std::to_string(shard_bytes) +
                            " bytes)");
  }
  const std::vector<Run>& runs = runs_[static_cast<std::size_t>(p - mapping_.params.data())];
  const std::uint64_t end = offset + data.size();
  // Runs tile the shard in order: the first that ends past `offset` is where the piece starts.
  auto it = std::upper_bound(runs.begin(), runs.end(), offset, [](std::uint64_t off, const Run& r) {
    return off < r.shard_offset + r.bytes();
  });
  for (; it != runs.end() && it->shard_offset < end; ++it) {
    const Run& run = *it;
    if (run.source == Run::kZeros) continue;
    const std::size_t hf = static_cast<std::size_t>(mapping_.find_hf(p->hf_names[run.source]));
    const std::uint64_t lo = std::max(offset, run.shard_offset);
    const std::uint64_t hi = std::min(end, run.shard_offset + run.bytes());
    for (std::uint64_t b = (lo - run.shard_offset) / run.block_bytes; b < run.count; ++b) {
      const std::uint64_t block_lo = run.shard_offset + b * run.block_bytes;
      if (block_lo >= hi) break;
      const std::uint64_t from = std::max(lo, block_lo);
      const std::uint64_t to = std::min(hi, block_lo + run.block_bytes);
      out->push_back(HfPiece{hf, run.hf_offset + b * run.hf_stride + (from - block_lo),
                             data.subspan(from - offset, to - from)});
    }
  }
  return ok_status();
}

}  // namespace ferry::convert
