// HF tensors as views into Megatron shards, for Sender::send_round_gathered.
#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "ferry/convert.h"

namespace ferry::convert {

Result<std::vector<sync::GatheredTensor>> gather_hf_tensors(
    const Mapping& mapping, std::span<const std::vector<TensorView>> shards) {
  const int tp = mapping.layout.tp;
  if (static_cast<int>(shards.size()) != tp) {
    return invalid_argument(
        fmt::format("gather_hf_tensors: shards of {} rank(s) given, the "
                    "layout has tp = {}",
                    shards.size(), tp));
  }
  std::vector<std::vector<HfPiece>> by_tensor(mapping.hf_tensors.size());
  std::vector<HfPiece> pieces;
  for (int r = 0; r < tp; ++r) {
    auto stream = MegatronToHfStream::create(mapping, r);
    if (!stream.ok()) return stream.status();
    std::unordered_map<std::string_view, const TensorView*> given;
    for (const TensorView& v : shards[static_cast<std::size_t>(r)]) given[v.spec.name] = &v;
    for (const MegatronParam& p : mapping.params) {
      auto it = given.find(p.name);
      if (it == given.end()) {
        return not_found(fmt::format("rank {} gave no shard of '{}'", r, p.name));
      }
      const TensorSpec want = mapping.shard_spec(p);
      if (it->second->data.size() != want.bytes()) {
        return invalid_argument(fmt::format("rank {}'s shard of '{}' has {} bytes, {} needs {}", r,
                                            p.name, it->second->data.size(), want.to_string(),
                                            want.bytes()));
      }
      pieces.clear();
      Status s = stream->split(*it->second, &pieces);
      if (!s.ok()) return s.with_context(fmt::format("rank {}", r));
      for (const HfPiece& piece : pieces) by_tensor[piece.hf_index].push_back(piece);
    }
  }
  std::vector<sync::GatheredTensor> out(mapping.hf_tensors.size());
  for (std::size_t t = 0; t < out.size(); ++t) {
    std::vector<HfPiece>& list = by_tensor[t];
    // stable: of the copies of a replicated tensor (the norms), rank 0's comes first.
    std::stable_sort(list.begin(), list.end(),
                     [](const HfPiece& a, const HfPiece& b) { return a.hf_offset < b.hf_offset; });
    out[t].spec = mapping.hf_tensors[t];
    std::uint64_t covered = 0;
    for (const HfPiece& piece : list) {
      const std::uint64_t end = piece.hf_offset + piece.data.size();
      if (piece.hf_offset > covered) {
        return internal_error(fmt::format("bytes [{}, {}) of '{}' are in no shard", covered,
                                          piece.hf_offset, out[t].spec.name));
      }
      if (end <= covered) continue;  // another rank's copy of replicated bytes
      out[t].parts.push_back(piece.data.subspan(covered - piece.hf_offset));
      covered = end;
    }
    if (covered != out[t].spec.bytes()) {
      return internal_error(fmt::format("'{}': shards hold {} of its {} bytes", out[t].spec.name,
                                        covered, out[t].spec.bytes()));
    }
  }
  return out;
}

}  // namespace ferry::convert
