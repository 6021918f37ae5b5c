// ferry inspect: the tensors of a safetensors file or model folder.
#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "ferry/safetensors.h"

namespace ferry::cli {
namespace {

struct InspectArgs {
  std::string path;
  bool hash = false;
  bool json = false;
};

int run_inspect(const InspectArgs& a) {
  // Without --hash only headers are read; with it the shards are mapped and every byte read.
  std::optional<ModelFolder> folder;
  if (a.hash) {
    auto opened = ModelFolder::open(a.path);
    if (!opened.ok()) return report_error(opened.status());
    folder.emplace(std::move(*opened));
  }
  auto index = folder ? Result<ModelIndex>(folder->index()) : read_model_index(a.path);
  if (!index.ok()) return report_error(index.status());

  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  std::uint64_t total = 0;
  for (const ModelTensor& t : index->tensors) {
    const TensorSpec& s = t.entry.spec;
    total += s.bytes();
    nlohmann::ordered_json j = {{"name", s.name},
                                {"dtype", std::string(dtype_name(s.dtype))},
                                {"shape", s.shape},
                                {"bytes", s.bytes()},
                                {"file", t.file}};
    std::string hash;
    if (a.hash) {
      auto view = folder->view(s.name);
      if (!view.ok()) return report_error(view.status());
      char buf[17];
      std::snprintf(buf, sizeof buf, "%016" PRIx64,
                    XXH3_64bits(view->data.data(), view->data.size()));
      hash = buf;
      j["xxh3"] = hash;
    }
    if (a.json) {
      tensors.push_back(std::move(j));
    } else {
      std::printf("%-60s %-8s %-20s %12llu %s\n", s.name.c_str(),
                  std::string(dtype_name(s.dtype)).c_str(), s.shape_string().c_str(),
                  static_cast<unsigned long long>(s.bytes()), hash.c_str());
    }
  }
  if (a.json) {
    nlohmann::ordered_json out = {{"path", a.path},
                                  {"files", index->files},
                                  {"tensor_count", index->tensors.size()},
                                  {"bytes", total},
                                  {"tensors", std::move(tensors)}};
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("%zu tensors, %llu bytes in %zu file(s)\n", index->tensors.size(),
                static_cast<unsigned long long>(total), index->files.size());
  }
  return kExitOk;
}

}  // namespace

void add_inspect_command(CLI::App& app, Dispatch& dispatch) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd =
      add_command(app, dispatch, "inspect",
                  "List the tensors of a safetensors file or model folder, after "
                  "validating every header",
                  "ferry inspect --json --hash /tmp/qwen7b", [args] { return run_inspect(*args); });
  cmd->add_option("path", args->path, "Model folder or .safetensors file")->required();
  cmd->add_flag("--hash", args->hash, "Also read every tensor and print its XXH3-64 hash");
  cmd->add_flag("--json", args->json, "Print JSON");
}

}  // namespace ferry::cli
