// Validation of a safetensors header. Every rule of docs/safetensors.md is
// checked here, before any offset from the file is used.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "base/coding.h"
#include "ferry/safetensors.h"

namespace ferry {
namespace {

using json = nlohmann::json;

Status bad(std::string_view source, const std::string& what) {
  return corruption(std::string(source) + ": " + what);
}

Result<SafetensorsEntry> parse_entry(std::string_view source, const std::string& name,
                                     const json& info) {
  // The wire and the checkpoint manifest refuse an empty name: refuse it at the source.
  if (name.empty()) return bad(source, "a tensor has an empty name (\"\")");
  const std::string where = "tensor '" + name + "'";
  if (!info.is_object()) return bad(source, where + ": entry is not an object");
  for (const auto& [key, value] : info.items()) {
    (void)value;
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return bad(source, where + ": unknown field '" + key + "'");
    }
  }
  if (!info.contains("dtype") || !info["dtype"].is_string()) {
    return bad(source, where + ": missing or non-string 'dtype'");
  }
  auto dtype = parse_dtype(info["dtype"].get<std::string>());
  // Only the exact safetensors spellings are valid in a file.
  if (!dtype.ok() || dtype_name(*dtype) != info["dtype"].get<std::string>()) {
    return bad(source, where + ": unknown dtype '" + info["dtype"].get<std::string>() + "'");
  }
  if (!info.contains("shape") || !info["shape"].is_array()) {
    return bad(source, where + ": missing or non-array 'shape'");
  }
  std::vector<std::int64_t> shape;
  for (const json& d : info["shape"]) {
    if (!d.is_number_unsigned()) {
      return bad(source, where + ": shape holds " + d.dump() + ", not a non-negative integer");
    }
    const std::uint64_t v = d.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(INT64_MAX))
      return bad(source, where + ": dimension too large");
    shape.push_back(static_cast<std::int64_t>(v));
  }
  const json* offsets = info.contains("data_offsets") ? &info["data_offsets"] : nullptr;
  if (offsets == nullptr || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return bad(source, where + ": 'data_offsets' must be [begin, end] of non-negative integers");
  }
  SafetensorsEntry e;
  e.begin = (*offsets)[0].get<std::uint64_t>();
  e.end = (*offsets)[1].get<std::uint64_t>();
  if (e.end < e.begin) {
    return bad(source, where + ": data_offsets end " + std::to_string(e.end) + " < begin " +
                           std::to_string(e.begin));
  }
  auto spec = TensorSpec::make(name, *dtype, std::move(shape));
  if (!spec.ok()) return bad(source, spec.status().message());
  if (spec->bytes() != e.end - e.begin) {
    return bad(source, where + ": shape " + spec->shape_string() + " of " +
                           std::string(dtype_name(*dtype)) + " needs " +
                           std::to_string(spec->bytes()) + " bytes but data_offsets span " +
                           std::to_string(e.end - e.begin));
  }
  e.spec = std::move(*spec);
  return e;
}

}  // namespace

const SafetensorsEntry* SafetensorsHeader::find(std::string_view name) const {
  for (const SafetensorsEntry& e : tensors) {
    if (e.spec.name == name) return &e;
  }
  return nullptr;
}

Result<SafetensorsHeader> parse_safetensors_header(std::span<const std::byte> prefix,
                                                   std::uint64_t file_size,
                                                   std::string_view source) {
  if (file_size < 8 || prefix.size() < 8) {
    return bad(source, "file is " + std::to_string(file_size) +
                           " bytes, too short for the 8-byte header length (truncated?)");
  }
  const std::uint64_t n = coding::Reader(prefix).u64();
  if (n > kSafetensorsMaxHeaderBytes) {
    return bad(source, "header length " + std::to_string(n) + " exceeds the format's limit of " +
                           std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  }
  if (n > file_size - 8) {
    return bad(source, "header length " + std::to_string(n) + " runs past the end of the " +
                           std::to_string(file_size) + "-byte file (truncated?)");
  }
  if (prefix.size() < 8 + n)
    return internal_error(std::string(source) + ": header prefix not read");
  const char* text = reinterpret_cast<const char*>(prefix.data() + 8);
  if (n == 0 || text[0] != '{') return bad(source, "header does not start with '{'");

  // nlohmann silently keeps the last of duplicate keys; count top-level keys to refuse them.
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && duplicate.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  // Strict JSON; the lexer also rejects ill-formed UTF-8.
  json doc = json::parse(text, text + n, on_event, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return bad(source, "header is not valid UTF-8 JSON");
  if (!doc.is_object()) return bad(source, "header is not a JSON object");
  if (!duplicate.empty()) return bad(source, "tensor name '" + duplicate + "' appears twice");

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  h.data_bytes = file_size - h.data_offset;
  for (const auto& [key, value] : doc.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return bad(source, "__metadata__ is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) return bad(source, "__metadata__['" + mk + "'] is not a string");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    auto e = parse_entry(source, key, value);
    if (!e.ok()) return e.status();
    h.tensors.push_back(std::move(*e));
  }

  // Tensors must tile the data section exactly: sorted, no overlap, no hole, no tail.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t expected = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : h.tensors) {
    if (e.begin < expected) {
      return bad(source, "tensor '" + e.spec.name + "' at [" + std::to_string(e.begin) + ", " +
                             std::to_string(e.end) + ") overlaps tensor '" + previous->spec.name +
                             "'");
    }
    if (e.begin > expected) {
      return bad(source, "hole in the data section: bytes [" + std::to_string(expected) + ", " +
                             std::to_string(e.begin) + ") before tensor '" + e.spec.name +
                             "' belong to no tensor");
    }
    if (e.end > h.data_bytes) {
      return bad(source, "tensor '" + e.spec.name + "' ends at data offset " +
                             std::to_string(e.end) + " but the data section has only " +
                             std::to_string(h.data_bytes) + " bytes (truncated?)");
    }
    expected = e.end;
    previous = &e;
  }
  if (expected != h.data_bytes) {
    return bad(source, "data section has " + std::to_string(h.data_bytes - expected) +
                           " trailing bytes that belong to no tensor");
  }
  return h;
}

}  // namespace ferry
