#include "rank_group/rank_group.h"

#include <cstring>
#include <string>

#include "rank_group/constants.h"

namespace ferry::rank_group {

Status validate_node_name(std::string_view node) {
  if (node.empty() || node.size() > kMaxNodeNameBytes || node == "." || node == "..") {
    return invalid_argument("node name '" + std::string(node) + "' must be 1-" +
                            std::to_string(kMaxNodeNameBytes) + " characters and not '.' or '..'");
  }
  for (char c : node) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return invalid_argument("node name '" + std::string(node) +
                              "' may hold only letters, digits, '.', '_' and '-'");
    }
  }
  return ok_status();
}

}  // namespace ferry::rank_group

namespace ferry::checkpoint {

Status RankGroup::fetch_into(int peer, std::string_view request, std::span<std::byte> out) {
  auto r = fetch(peer, request);
  if (!r.ok()) return r.status();
  if (r->size() != out.size()) {
    return corruption("rank " + std::to_string(peer) + " answered " + std::to_string(r->size()) +
                      " bytes, expected " + std::to_string(out.size()));
  }
  std::memcpy(out.data(), r->data(), r->size());
  return ok_status();
}

}  // namespace ferry::checkpoint
