// Versions and device availability as the user's Python sees them. The script
// runs in that interpreter; ferry only reads the one line it prints.
#include <nlohmann/json.hpp>

#include "device/probes.h"
#include "device/text_util.h"

namespace ferry::device {
namespace {

// Each import is guarded: a broken torch_npu must still let the versions through.
constexpr const char* kProbeScript = R"PY(
import json
r = {"versions": {}}
try:
    from importlib import metadata
except Exception:
    metadata = None
for key, names in (("torch", ("torch",)), ("torch_npu", ("torch_npu", "torch-npu")),
                   ("vllm", ("vllm",)), ("vllm_ascend", ("vllm_ascend", "vllm-ascend")),
                   ("mindspeed", ("mindspeed",)), ("megatron_core", ("megatron_core", "megatron-core")),
                   ("sglang", ("sglang",)), ("transformers", ("transformers",))):
    for n in names:
        try:
            r["versions"][key] = metadata.version(n)
            break
        except Exception:
            pass
if "torch_npu" in r["versions"]:
    try:
        import torch, torch_npu
        r["npu_available"] = bool(torch_npu.npu.is_available())
        r["device_count"] = int(torch_npu.npu.device_count())
    except Exception as e:
        r["error"] = "import torch_npu: %s" % e
elif "torch" in r["versions"]:
    try:
        import torch
        r["cuda_available"] = bool(torch.cuda.is_available())
        r["device_count"] = int(torch.cuda.device_count())
        r["cuda_runtime"] = torch.version.cuda or ""
        if torch.version.cuda:
            try:
                v = torch.cuda.nccl.version()
                r["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            except Exception:
                pass  # a torch without NCCL: reported as such
    except Exception as e:
        r["error"] = "import torch: %s" % e
print("FERRY_PROBE " + json.dumps(r))
)PY";

}  // namespace

PythonInfo probe_python(const Env& env, const std::string& python, int timeout_ms) {
  PythonInfo info;
  info.python = python;
  if (python.empty()) return info;
  auto r = env.run({python, "-c", kProbeScript}, timeout_ms);
  if (!r.ok()) {
    info.error = r.status().message();
    return info;
  }
  if (r->timed_out) {
    info.error = python + " did not finish within " + std::to_string(timeout_ms / 1000) + " s";
    return info;
  }
  for (const std::string& line : split_lines(r->out)) {
    if (line.rfind("FERRY_PROBE ", 0) != 0) continue;
    const nlohmann::json j = nlohmann::json::parse(line.substr(12), nullptr, false);
    if (j.is_discarded() || !j.is_object()) break;
    info.probed = true;
    if (j.contains("versions") && j["versions"].is_object()) {
      for (const auto& [k, v] : j["versions"].items()) {
        if (v.is_string()) info.versions[k] = v.get<std::string>();
      }
    }
    if (j.contains("npu_available") && j["npu_available"].is_boolean()) {
      info.npu_available = j["npu_available"].get<bool>();
    }
    if (j.contains("cuda_available") && j["cuda_available"].is_boolean()) {
      info.cuda_available = j["cuda_available"].get<bool>();
    }
    if (j.contains("device_count") && j["device_count"].is_number_integer()) {
      info.device_count = j["device_count"].get<int>();
    }
    if (j.contains("cuda_runtime") && j["cuda_runtime"].is_string()) {
      info.cuda_runtime = j["cuda_runtime"].get<std::string>();
    }
    if (j.contains("nccl") && j["nccl"].is_string())
      info.nccl_version = j["nccl"].get<std::string>();
    if (j.contains("error") && j["error"].is_string()) info.error = j["error"].get<std::string>();
    return info;
  }
  std::string why(trim(r->err));
  if (why.size() > 300) why = why.substr(why.size() - 300);
  info.error = python + " exited with " + std::to_string(r->exit_code) +
               " without printing the probe line" + (why.empty() ? "" : ": " + why);
  return info;
}

}  // namespace ferry::device
