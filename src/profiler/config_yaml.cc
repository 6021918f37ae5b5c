// verl YAML -> Config. Every value goes through the same setters as overrides, so a
// YAML file and a command line accept and reject exactly the same things.
#include <yaml-cpp/yaml.h>

#include <string>

#include "base/file_util.h"
#include "ferry/profiler.h"
#include "profiler/config_fields.h"

namespace ferry::profiler {
namespace {

// Scalars as text, sequences as "[a,b]"; Hydra interpolations read as unset.
Result<std::string> value_text(const YAML::Node& node, const std::string& key) {
  if (node.IsNull()) return std::string("null");
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    if (s.find("${") != std::string::npos) return std::string("null");
    return s;
  }
  if (node.IsSequence()) {
    std::string out = "[";
    for (std::size_t i = 0; i < node.size(); ++i) {
      if (!node[i].IsScalar()) return invalid_argument(key + ": expected a list of names");
      if (i > 0) out += ",";
      out += node[i].Scalar();
    }
    return out + "]";
  }
  return invalid_argument(key + ": expected a value or a list, found a mapping");
}

bool is_unset(const std::string& text) { return text == "null"; }

// The mapping at root.k1.k2..., or an invalid node; never indexes a missing node.
YAML::Node descend(const YAML::Node& root, std::initializer_list<const char*> keys) {
  YAML::Node node;
  node.reset(root);
  for (const char* k : keys) {
    if (!node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& cref = node;
    YAML::Node next = cref[k];
    if (!next) return YAML::Node(YAML::NodeType::Undefined);
    node.reset(next);  // operator= would assign through to the tree
  }
  return node;
}

Status read_npu(const YAML::Node& npu, const std::string& where, Config* c) {
  if (!npu.IsMap()) return invalid_argument(where + ": expected a mapping");
  for (const auto& kv : npu) {
    const std::string field = kv.first.as<std::string>();
    const std::string key = where + "." + field;
    auto text = value_text(kv.second, key);
    if (!text.ok()) return text.status();
    if (is_unset(*text) && field != "profile_token_start" && field != "profile_token_end") continue;
    Status s = set_npu_field(c, field, *text, key);
    if (!s.ok()) return s;
  }
  return ok_status();
}

Status read_section(const YAML::Node& section, const std::string& where, Config* c) {
  for (const auto& kv : section) {
    const std::string field = kv.first.as<std::string>();
    if (field == "tool_config") {
      const YAML::Node npu = descend(kv.second, {"npu"});
      if (npu.IsDefined()) {
        Status s = read_npu(npu, where + ".tool_config.npu", c);
        if (!s.ok()) return s;
      }
      continue;
    }
    bool ours = false;
    for (std::string_view f : kSectionFields) ours = ours || f == field;
    if (!ours) continue;  // verl's other profiler fields (finish hooks, ...) are not ferry's
    const std::string key = where + "." + field;
    auto text = value_text(kv.second, key);
    if (!text.ok()) return text.status();
    if (is_unset(*text)) continue;
    Status s = set_section_field(c, field, *text, key);
    if (!s.ok()) return s;
  }
  return ok_status();
}

}  // namespace

Result<Config> config_from_yaml(std::string_view yaml_text, std::string_view source_name) {
  const std::string src(source_name);
  YAML::Node root;
  try {  // yaml-cpp reports errors by exception; none leaves this function.
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return invalid_argument(src + ": not valid YAML: " + e.what());
  }
  Config c;
  if (!root.IsMap()) return c;
  try {
    const YAML::Node candidates[] = {descend(root, {"actor_rollout_ref", "actor", "profiler"}),
                                     descend(root, {"actor", "profiler"}),
                                     descend(root, {"profiler"})};
    const char* names[] = {"actor_rollout_ref.actor.profiler", "actor.profiler", "profiler"};
    for (int i = 0; i < 3; ++i) {
      if (candidates[i] && candidates[i].IsMap()) {
        Status s = read_section(candidates[i], src + ": " + names[i], &c);
        if (!s.ok()) return s;
        return c;
      }
    }
    if (const YAML::Node npu = descend(root, {"npu"}); npu.IsDefined()) {
      Status s = read_npu(npu, src + ": npu", &c);
      if (!s.ok()) return s;
    }
  } catch (const YAML::Exception& e) {
    return invalid_argument(src + ": " + e.what());
  }
  return c;
}

Result<Config> config_from_yaml_file(const std::string& path) {
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  return config_from_yaml(*text, path);
}

}  // namespace ferry::profiler
