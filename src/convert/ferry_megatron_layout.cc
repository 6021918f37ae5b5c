// convert's Megatron layout on disk (ferry's own, not a Megatron-LM dist checkpoint): one
// safetensors file per TP rank plus ferry_megatron.json.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/file_util.h"
#include "convert/folder_io.h"
#include "ferry/convert.h"

namespace ferry::convert {

inline constexpr int kLayoutVersion = 1;

std::string rank_file_name(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "mp_rank_%02d/model.safetensors", rank);
  return buf;
}

std::string megatron_layout_json(const MegatronLayout& layout, DType dtype) {
  nlohmann::ordered_json doc;
  doc["format"] = "ferry-megatron";
  doc["version"] = kLayoutVersion;
  doc["tp"] = layout.tp;
  doc["pp"] = 1;
  doc["norm_layout"] = std::string(norm_layout_name(layout.norms));
  doc["padded_vocab_size"] = layout.padded_vocab_size;
  doc["dtype"] = std::string(dtype_name(dtype));
  std::vector<std::string> files;
  for (int r = 0; r < layout.tp; ++r) files.push_back(rank_file_name(r));
  doc["files"] = files;
  return doc.dump(2) + "\n";
}

Result<MegatronFolderInfo> read_megatron_layout(const std::string& folder) {
  const std::string path = folder + "/" + std::string(kLayoutFileName);
  auto text = read_file(path);
  if (!text.ok()) {
    return not_found(path + " is missing: " + folder +
                     " is not a Megatron folder written by ferry (convert one with "
                     "'ferry convert --from hf --to megatron')");
  }
  auto doc = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return invalid_argument(path + ": not a JSON object");
  if (doc.value("format", "") != "ferry-megatron") {
    return invalid_argument(path + ": 'format' must be \"ferry-megatron\"");
  }
  if (!doc.contains("version") || !doc["version"].is_number_integer() ||
      doc["version"].get<int>() != kLayoutVersion) {
    return invalid_argument(path + ": 'version' must be " + std::to_string(kLayoutVersion));
  }
  MegatronFolderInfo info;
  if (!doc.contains("tp") || !doc["tp"].is_number_integer() || doc["tp"].get<int>() < 1 ||
      doc["tp"].get<int>() > 4096) {
    return invalid_argument(path + ": 'tp' must be a positive integer");
  }
  info.layout.tp = doc["tp"].get<int>();
  if (doc.contains("pp") && doc["pp"] != 1) {
    return unimplemented(path + ": pipeline-parallel folders (pp > 1) are not supported");
  }
  auto norms = parse_norm_layout(doc.value("norm_layout", "fused"));
  if (!norms.ok()) return norms.status().with_context(path);
  info.layout.norms = *norms;
  if (doc.contains("padded_vocab_size")) {
    if (!doc["padded_vocab_size"].is_number_integer() ||
        doc["padded_vocab_size"].get<std::int64_t>() < 0) {
      return invalid_argument(path + ": 'padded_vocab_size' must be a non-negative integer");
    }
    info.layout.padded_vocab_size = doc["padded_vocab_size"].get<std::int64_t>();
  }
  auto dtype = parse_dtype(doc.value("dtype", ""));
  if (!dtype.ok()) return dtype.status().with_context(path + ": 'dtype'");
  info.dtype = *dtype;
  for (int r = 0; r < info.layout.tp; ++r) info.rank_files.push_back(rank_file_name(r));
  return info;
}

}  // namespace ferry::convert
