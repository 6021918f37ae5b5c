// Visible-device masks parsed as each runtime parses them. The rules and their
// sources are in docs/doctor.md ("How masks are read").
#include <algorithm>
#include <cctype>
#include <set>

#include "device/text_util.h"
#include "ferry/device.h"

namespace ferry::device {

std::string_view mask_variable(MaskKind kind) {
  switch (kind) {
    case MaskKind::kAscend:
      return "ASCEND_RT_VISIBLE_DEVICES";
    case MaskKind::kCuda:
      return "CUDA_VISIBLE_DEVICES";
    case MaskKind::kHip:
      return "HIP_VISIBLE_DEVICES";
    case MaskKind::kRocr:
      return "ROCR_VISIBLE_DEVICES";
  }
  return "";
}

std::string ray_noset_variable(MaskKind kind) {
  return "RAY_EXPERIMENTAL_NOSET_" + std::string(mask_variable(kind));
}

namespace {

// CANN: "ids separated by English commas, no other characters and no invalid
// ids; reading stops before the first other character or invalid id", and
// "only ascending ids are supported".
void parse_ascend(std::string_view value, const DeviceInventory& inv, VisibleDevices* out) {
  std::size_t pos = 0;
  int previous = -1;
  while (pos < value.size()) {
    std::size_t end = pos;
    while (end < value.size() && std::isdigit(static_cast<unsigned char>(value[end]))) ++end;
    const bool at_separator = end == value.size() || value[end] == ',';
    if (end == pos || !at_separator) {
      out->ignored = std::string(value.substr(pos));
      out->ignored_reason =
          end == pos ? "not a device id" : "a character other than a digit or ','";
      if (end > pos && end < value.size()) {
        out->ignored_reason = "'" + std::string(1, value[end]) + "' is neither a digit nor ','";
      }
      break;
    }
    const auto id = parse_uint(value.substr(pos, end - pos));
    if (!id || (inv.count >= 0 && *id >= inv.count)) {
      out->ignored = std::string(value.substr(pos));
      out->ignored_reason = "device " + std::string(value.substr(pos, end - pos)) +
                            " does not exist (the node has " + std::to_string(inv.count) + ")";
      break;
    }
    const int v = static_cast<int>(*id);
    if (v <= previous && out->violation.empty()) {
      out->violation = v == previous ? "device " + std::to_string(v) + " is listed twice"
                                     : "ids must be in ascending order (" + std::to_string(v) +
                                           " follows " + std::to_string(previous) + ")";
    }
    previous = std::max(previous, v);
    out->accepted.emplace_back(value.substr(pos, end - pos));
    out->physical.push_back(v);
    pos = end == value.size() ? end : end + 1;
    if (end < value.size() && pos == value.size()) {
      out->ignored = ",";
      out->ignored_reason = "a trailing ','";
    }
  }
}

// strtoul-style: the leading digits of the entry (PyTorch's _strtoul mirrors
// the driver: "1gpu2" reads as 1); -1 when there are none or a '-' sign.
long leading_number(std::string_view s) {
  if (s.empty()) return -1;
  std::size_t i = 0;
  if (s[0] == '+') i = 1;
  if (s[0] == '-') return -1;
  std::size_t start = i;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == start || i - start > 9) return -1;
  return static_cast<long>(parse_uint(s.substr(start, i - start)).value_or(-1));
}

// Unique prefix match ("GPU-8932f937" names GPU-8932f937-d72c-...): the index,
// -2 when no device matches or several do.
int match_uuid(std::string_view token, const std::vector<std::string>& uuids) {
  int found = -2;
  for (std::size_t i = 0; i < uuids.size(); ++i) {
    if (uuids[i].compare(0, token.size(), token) == 0) {
      if (found != -2) return -2;
      found = static_cast<int>(i);
    }
  }
  return found;
}

// CUDA (and PyTorch's model of it for HIP/ROCR): entries are indices or UUIDs;
// the list stops at the first invalid entry; a repeated device empties it.
void parse_gpu_list(MaskKind kind, std::string_view value, const DeviceInventory& inv,
                    VisibleDevices* out) {
  const bool uuids_allowed = kind != MaskKind::kHip;
  const std::vector<std::string> entries = split(value, ',');
  std::set<int> seen;
  for (std::size_t e = 0; e < entries.size(); ++e) {
    const std::string_view entry = trim(entries[e]);
    int physical = -1;
    std::string reason;
    if (uuids_allowed && (starts_with_ci(entry, "GPU-") || starts_with_ci(entry, "MIG-"))) {
      const bool mig = starts_with_ci(entry, "MIG-");
      const std::vector<std::string>& pool = mig ? inv.mig_uuids : inv.uuids;
      if (pool.empty() && (inv.count < 0 || mig)) {
        physical = -1;  // cannot resolve without a device list; the runtime may accept it
      } else {
        const int at = match_uuid(entry, pool);
        if (at < 0) {
          reason = "no single device has a UUID starting with " + std::string(entry);
        } else {
          physical = mig ? inv.mig_parent[static_cast<std::size_t>(at)] : at;
        }
      }
    } else {
      const long n = leading_number(entry);
      if (n < 0) {
        reason = "'" + std::string(entry) + "' is not a device index";
      } else if (inv.count >= 0 && n >= inv.count) {
        reason = "device " + std::to_string(n) + " does not exist (the node has " +
                 std::to_string(inv.count) + ")";
      } else {
        physical = static_cast<int>(n);
      }
    }
    if (!reason.empty()) {
      std::string rest;
      for (std::size_t r = e; r < entries.size(); ++r) rest += (r > e ? "," : "") + entries[r];
      out->ignored = rest;
      out->ignored_reason = reason;
      break;
    }
    if (physical >= 0 && !seen.insert(physical).second) {
      out->violation = "device " + std::to_string(physical) +
                       " is listed twice, which makes the runtime see no device at all";
      out->accepted.clear();
      out->physical.clear();
      return;
    }
    out->accepted.emplace_back(entry);
    out->physical.push_back(physical);
  }
}

}  // namespace

VisibleDevices parse_visible_devices(MaskKind kind, std::optional<std::string_view> value,
                                     const DeviceInventory& inventory) {
  VisibleDevices out;
  out.kind = kind;
  if (!value) {
    for (int i = 0; i < inventory.count; ++i) out.physical.push_back(i);
    return out;
  }
  out.set = true;
  out.raw = std::string(*value);
  // An empty value hides every device (CUDA documents it; the others follow).
  if (value->empty()) return out;
  if (kind == MaskKind::kAscend) {
    parse_ascend(*value, inventory, &out);
  } else {
    parse_gpu_list(kind, *value, inventory, &out);
  }
  return out;
}

}  // namespace ferry::device
