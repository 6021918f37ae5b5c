// Hugging Face model folders: model.safetensors, or shards listed in
// model.safetensors.index.json ({"metadata": {...}, "weight_map": {name: file}}).
#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "base/atomic_file.h"
#include "base/file_util.h"
#include "ferry/safetensors.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";

// A shard name from an index must stay inside the folder.
bool safe_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
         name.find('\0') == std::string::npos;
}

Result<ModelIndex> read_single_file(const std::string& folder, const std::string& file) {
  auto header = read_safetensors_header(folder + "/" + file);
  if (!header.ok()) return header.status();
  ModelIndex index{folder, {file}, {}, {}};
  for (SafetensorsEntry& e : header->tensors) index.tensors.push_back({std::move(e), file});
  return index;
}

Result<ModelIndex> read_sharded(const std::string& folder) {
  const std::string index_path = folder + "/" + kIndexName;
  auto text = read_file(index_path);
  if (!text.ok()) return text.status();
  // ordered_json keeps the weight_map in file order, which is the order tensors are reported in.
  nlohmann::ordered_json doc =
      nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return corruption(index_path + ": not a JSON object");
  if (!doc.contains("weight_map") || !doc["weight_map"].is_object()) {
    return corruption(index_path + ": missing 'weight_map' object");
  }
  ModelIndex index{folder, {}, {}, {}};
  if (doc.contains("metadata") && doc["metadata"].is_object()) {
    for (const auto& [k, v] : doc["metadata"].items()) {
      index.config_metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
  }
  std::vector<std::string> order;             // tensor names in weight_map order
  std::map<std::string, std::string> wanted;  // tensor -> shard
  for (const auto& [name, file] : doc["weight_map"].items()) {
    if (!file.is_string() || !safe_file_name(file.get<std::string>())) {
      return corruption(index_path + ": tensor '" + name + "' maps to " + file.dump() +
                        ", not a file name inside the folder");
    }
    const std::string f = file.get<std::string>();
    if (wanted.emplace(name, f).second) order.push_back(name);
    if (std::find(index.files.begin(), index.files.end(), f) == index.files.end()) {
      index.files.push_back(f);
    }
  }
  std::map<std::string, std::string> found;  // tensor -> shard that holds it
  std::map<std::string, SafetensorsEntry> entries;
  for (const std::string& file : index.files) {
    const std::string path = folder + "/" + file;
    if (!fs::exists(path)) {
      return not_found(index_path + " lists shard '" + file + "', which is missing from " + folder);
    }
    auto header = read_safetensors_header(path);
    if (!header.ok()) return header.status();
    for (SafetensorsEntry& e : header->tensors) {
      auto [it, inserted] = found.emplace(e.spec.name, file);
      if (!inserted) {
        return corruption(folder + ": tensor '" + e.spec.name + "' is in both '" + it->second +
                          "' and '" + file + "'");
      }
      auto w = wanted.find(e.spec.name);
      if (w == wanted.end()) {
        return corruption(path + ": tensor '" + e.spec.name + "' is not in " + kIndexName);
      }
      if (w->second != file) {
        return corruption(path + ": tensor '" + e.spec.name + "' is in this shard but " +
                          kIndexName + " says '" + w->second + "'");
      }
      entries.emplace(e.spec.name, std::move(e));
    }
  }
  for (const std::string& name : order) {
    auto e = entries.find(name);
    if (e == entries.end()) {
      return corruption(index_path + " says tensor '" + name + "' is in '" + wanted[name] +
                        "', but that shard does not hold it");
    }
    index.tensors.push_back({std::move(e->second), wanted[name]});
  }
  return index;
}

}  // namespace

Result<ModelIndex> read_model_index(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    const fs::path p(path);
    return read_single_file(p.has_parent_path() ? p.parent_path().string() : ".",
                            p.filename().string());
  }
  if (!fs::is_directory(path, ec)) return not_found(path + ": no such file or folder");
  if (fs::exists(path + "/" + kIndexName)) return read_sharded(path);
  if (fs::exists(path + "/model.safetensors")) return read_single_file(path, "model.safetensors");
  return not_found(path + ": neither " + kIndexName + " nor model.safetensors is in this folder");
}

struct ModelFolder::Impl {
  ModelIndex index;
  std::map<std::string, SafetensorsFile> files;
};

ModelFolder::ModelFolder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ModelFolder::ModelFolder(ModelFolder&&) noexcept = default;
ModelFolder& ModelFolder::operator=(ModelFolder&&) noexcept = default;
ModelFolder::~ModelFolder() = default;

Result<ModelFolder> ModelFolder::open(const std::string& path) {
  auto index = read_model_index(path);
  if (!index.ok()) return index.status();
  auto impl = std::make_unique<Impl>();
  for (const std::string& file : index->files) {
    auto f = SafetensorsFile::open(index->folder + "/" + file);
    if (!f.ok()) return f.status();
    impl->files.emplace(file, std::move(*f));
  }
  impl->index = std::move(*index);
  return ModelFolder(std::move(impl));
}

const ModelIndex& ModelFolder::index() const { return impl_->index; }

Result<TensorView> ModelFolder::view(std::string_view name) const {
  for (const ModelTensor& t : impl_->index.tensors) {
    if (t.entry.spec.name == name) return impl_->files.at(t.file).view(t.entry);
  }
  return not_found(impl_->index.folder + ": no tensor named '" + std::string(name) + "'");
}

std::vector<TensorView> ModelFolder::views() const {
  std::vector<TensorView> out;
  out.reserve(impl_->index.tensors.size());
  for (const ModelTensor& t : impl_->index.tensors) {
    out.push_back(impl_->files.at(t.file).view(t.entry));
  }
  return out;
}

Status write_model_index(const std::string& folder, const std::vector<ModelTensor>& tensors,
                         std::uint64_t total_size) {
  nlohmann::ordered_json doc;
  doc["metadata"] = {{"total_size", total_size}};
  doc["weight_map"] = nlohmann::ordered_json::object();
  for (const ModelTensor& t : tensors) doc["weight_map"][t.entry.spec.name] = t.file;
  return write_file_atomic(folder + "/" + kIndexName, doc.dump(2) + "\n");
}

}  // namespace ferry
