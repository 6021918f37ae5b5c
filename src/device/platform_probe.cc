// Which accelerator the node has and whether its driver stack answers.
#include <algorithm>
#include <cctype>

#include "device/probes.h"
#include "device/text_util.h"

namespace ferry::device {
namespace {

constexpr std::string_view kHuaweiVendor = "0x19e5";
constexpr std::string_view kNvidiaVendor = "0x10de";
constexpr std::string_view kAmdVendor = "0x1002";

std::string read_trimmed(const Env& env, const std::string& path) {
  auto text = env.read_file(path);
  return text.ok() ? std::string(trim(*text)) : std::string();
}

// The Ascend chip behind a PCI device id (vendor 0x19e5, class 0x12).
std::string ascend_chip_from_pci(std::string_view device) {
  if (device == "0xd802") return "910B";    // Atlas A2
  if (device == "0xd803") return "910_93";  // Atlas A3
  if (device == "0xd801") return "910";
  if (device == "0xd500") return "310P";
  if (device == "0xd100") return "310";
  return "";
}

// The chip from npu-smi's Name column: "910B3" -> 910B, "Ascend910_9392" -> 910_93.
std::string ascend_chip_from_name(std::string_view name) {
  if (name.find("910_93") != std::string_view::npos || name.find("910C") != std::string_view::npos)
    return "910_93";
  if (name.find("910B") != std::string_view::npos) return "910B";
  if (name.find("310P") != std::string_view::npos) return "310P";
  if (name.find("910") != std::string_view::npos) return "910";
  if (name.find("310") != std::string_view::npos) return "310";
  return "";
}

// Counts accelerators on the PCI bus by vendor and class, so hardware without a
// loaded driver is still seen (the "driver missing" case has no /dev nodes).
void scan_pci(const Env& env, PlatformInfo* info) {
  auto devices = env.list_dir("/sys/bus/pci/devices");
  if (!devices.ok()) return;
  for (const std::string& d : *devices) {
    const std::string base = "/sys/bus/pci/devices/" + d;
    const std::string vendor = read_trimmed(env, base + "/vendor");
    const std::string cls = read_trimmed(env, base + "/class");
    const bool accel = starts_with_ci(cls, "0x12");    // processing accelerator
    const bool display = starts_with_ci(cls, "0x03");  // VGA / 3D controller
    if (vendor == kHuaweiVendor && accel) {
      ++info->pci_ascend;
      if (info->ascend_chip.empty())
        info->ascend_chip = ascend_chip_from_pci(read_trimmed(env, base + "/device"));
    }
    if (vendor == kNvidiaVendor && display) ++info->pci_nvidia;
    if (vendor == kAmdVendor && (display || accel)) ++info->pci_amd;
  }
}

// "/dev/<prefix>N" nodes, in numeric order.
std::vector<int> numbered_nodes(const Env& env, std::string_view prefix) {
  std::vector<int> ids;
  auto names = env.list_dir("/dev");
  if (!names.ok()) return ids;
  for (const std::string& n : *names) {
    if (n.size() <= prefix.size() || n.compare(0, prefix.size(), prefix) != 0) continue;
    if (auto id = parse_uint(std::string_view(n).substr(prefix.size()))) {
      ids.push_back(static_cast<int>(*id));
    }
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::string version_from_info(const Env& env, const std::string& path) {
  auto text = env.read_file(path);
  if (!text.ok()) return "";
  for (std::string_view key : {"Version", "version", "package_version"}) {
    if (auto v = find_key_value(*text, key, '=')) return *v;
  }
  return "";
}

void run_tool(const Env& env, const std::vector<std::string>& argv, int timeout_ms,
              PlatformInfo* info, std::string* out) {
  info->tool = argv[0];
  auto r = env.run(argv, timeout_ms);
  if (!r.ok()) {
    info->tool_found = r.status().code() != Code::kNotFound;
    info->tool_error = r.status().message();
    return;
  }
  info->tool_found = true;
  if (r->timed_out) {
    info->tool_error = argv[0] + " did not answer within " + std::to_string(timeout_ms / 1000) +
                       " s (a hung driver often does this)";
    return;
  }
  if (r->exit_code != 0) {
    std::string why = std::string(trim(r->err.empty() ? r->out : r->err));
    if (why.size() > 300) why.resize(300);
    info->tool_error =
        argv[0] + " exited with " + std::to_string(r->exit_code) + (why.empty() ? "" : ": " + why);
    return;
  }
  info->tool_ok = true;
  *out = std::move(r->out);
}

// npu-smi info prints one row per NPU: "| 0     910B3   | OK   | 93.1 ...".
void parse_npu_smi(const std::string& text, PlatformInfo* info) {
  for (const std::string& line : split_lines(text)) {
    if (info->driver_version.empty()) {
      const std::size_t at = line.find("Version:");
      if (at != std::string::npos) {
        std::string v(trim(std::string_view(line).substr(at + 8)));
        v = v.substr(0, v.find_first_of(" |"));
        info->driver_version = v;
      }
    }
    if (line.empty() || line[0] != '|') continue;
    const std::vector<std::string> cells = split(std::string_view(line).substr(1), '|');
    if (cells.size() < 3) continue;
    const std::vector<std::string> words = split(trim(cells[0]), ' ');
    std::vector<std::string> tokens;
    for (const std::string& w : words) {
      if (!w.empty()) tokens.push_back(w);
    }
    const std::string health(trim(cells[1]));
    if (tokens.size() < 2 || health.empty() ||
        !std::isalpha(static_cast<unsigned char>(health[0]))) {
      continue;
    }
    auto id = parse_uint(tokens[0]);
    if (!id) continue;
    Accelerator a;
    a.id = static_cast<int>(*id);
    a.name = tokens[1];
    a.health = health;
    info->accelerators.push_back(a);
  }
}

// nvidia-smi -L: "GPU 0: NVIDIA H100 (UUID: GPU-...)" and, under it,
// "  MIG 1g.10gb Device 0: (UUID: MIG-...)".
void parse_nvidia_smi(const std::string& text, PlatformInfo* info) {
  for (const std::string& line : split_lines(text)) {
    const std::string_view l = trim(line);
    const std::size_t u = l.find("(UUID: ");
    if (u == std::string_view::npos) continue;
    std::string uuid(l.substr(u + 7));
    uuid = uuid.substr(0, uuid.find(')'));
    if (starts_with_ci(l, "GPU ")) {
      Accelerator a;
      const std::size_t colon = l.find(':');
      a.id = static_cast<int>(parse_uint(trim(l.substr(4, colon - 4))).value_or(0));
      a.name = std::string(trim(l.substr(colon + 1, u - colon - 1)));
      a.uuid = uuid;
      a.health = "OK";
      info->accelerators.push_back(a);
    } else if (starts_with_ci(l, "MIG ") && !info->accelerators.empty()) {
      info->inventory.mig_uuids.push_back(uuid);
      info->inventory.mig_parent.push_back(info->accelerators.back().id);
    }
  }
}

void probe_ascend(const Env& env, int timeout_ms, PlatformInfo* info) {
  for (int id : numbered_nodes(env, "davinci"))
    info->device_nodes.push_back("/dev/davinci" + std::to_string(id));
  for (const char* node : {"/dev/davinci_manager", "/dev/hisi_hdc", "/dev/devmm_svm"}) {
    if (env.exists(node)) info->device_nodes.push_back(node);
  }
  info->driver_version = version_from_info(env, "/usr/local/Ascend/driver/version.info");
  info->firmware_version = version_from_info(env, "/usr/local/Ascend/firmware/version.info");
  std::string out;
  run_tool(env, {"npu-smi", "info"}, timeout_ms, info, &out);
  if (info->tool_ok) {
    const std::string from_files = info->driver_version;
    info->driver_version.clear();
    parse_npu_smi(out, info);
    if (!from_files.empty()) info->driver_version = from_files;
    if (!info->accelerators.empty()) {
      const std::string chip = ascend_chip_from_name(info->accelerators.front().name);
      if (!chip.empty()) info->ascend_chip = chip;
    }
  }
  info->inventory.count = info->tool_ok ? static_cast<int>(info->accelerators.size())
                                        : static_cast<int>(numbered_nodes(env, "davinci").size());
}

void probe_nvidia(const Env& env, int timeout_ms, PlatformInfo* info) {
  for (int id : numbered_nodes(env, "nvidia"))
    info->device_nodes.push_back("/dev/nvidia" + std::to_string(id));
  if (env.exists("/dev/nvidiactl")) info->device_nodes.push_back("/dev/nvidiactl");
  if (auto text = env.read_file("/proc/driver/nvidia/version"); text.ok()) {
    // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar ..."
    const std::size_t at = text->find("Kernel Module");
    if (at != std::string::npos) {
      std::string rest(trim(std::string_view(*text).substr(at + 13)));
      info->driver_version = rest.substr(0, rest.find_first_of(" \n"));
    }
  }
  std::string out;
  run_tool(env, {"nvidia-smi", "-L"}, timeout_ms, info, &out);
  if (info->tool_ok) parse_nvidia_smi(out, info);
  info->inventory.count = info->tool_ok ? static_cast<int>(info->accelerators.size())
                                        : static_cast<int>(numbered_nodes(env, "nvidia").size());
  for (const Accelerator& a : info->accelerators) info->inventory.uuids.push_back(a.uuid);
}

void probe_rocm(const Env& env, int timeout_ms, PlatformInfo* info) {
  if (env.exists("/dev/kfd")) info->device_nodes.push_back("/dev/kfd");
  int render = 0;
  if (auto dri = env.list_dir("/dev/dri"); dri.ok()) {
    for (const std::string& n : *dri) {
      if (n.rfind("renderD", 0) == 0) {
        info->device_nodes.push_back("/dev/dri/" + n);
        ++render;
      }
    }
  }
  info->driver_version = read_trimmed(env, "/sys/module/amdgpu/version");
  std::string out;
  run_tool(env, {"rocm-smi", "--showid"}, timeout_ms, info, &out);
  info->inventory.count = info->pci_amd > 0 ? info->pci_amd : render;
}

}  // namespace

PlatformInfo probe_platform(const Env& env, int tool_timeout_ms) {
  PlatformInfo info;
  scan_pci(env, &info);
  const bool ascend = info.pci_ascend > 0 || !numbered_nodes(env, "davinci").empty() ||
                      env.exists("/dev/davinci_manager");
  const bool nvidia = info.pci_nvidia > 0 || !numbered_nodes(env, "nvidia").empty();
  const bool rocm = info.pci_amd > 0 || env.exists("/dev/kfd");
  if (ascend) {
    info.platform = Platform::kAscend;
    probe_ascend(env, tool_timeout_ms, &info);
  } else if (nvidia) {
    info.platform = Platform::kNvidia;
    probe_nvidia(env, tool_timeout_ms, &info);
  } else if (rocm) {
    info.platform = Platform::kRocm;
    probe_rocm(env, tool_timeout_ms, &info);
  }
  // The CANN toolkit is looked for on any node: a CPU-only box with CANN
  // installed is a node whose NPUs are not visible, not a plain CPU host.
  for (const char* var : {"ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"}) {
    if (auto v = env.get_env(var); v && !v->empty()) {
      info.toolkit_home = *v;
      break;
    }
  }
  if (info.toolkit_home.empty()) {
    for (const char* p : {"/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann"}) {
      if (env.exists(p)) {
        info.toolkit_home = p;
        break;
      }
    }
  }
  if (!info.toolkit_home.empty()) {
    info.toolkit_version =
        version_from_info(env, info.toolkit_home + "/ascend_toolkit_install.info");
    if (info.toolkit_version.empty()) {
      if (auto names = env.list_dir(info.toolkit_home); names.ok()) {
        for (const std::string& n : *names) {
          if (n.size() > 6 && n.ends_with("-linux")) {
            info.toolkit_version = version_from_info(
                env, info.toolkit_home + "/" + n + "/ascend_toolkit_install.info");
            if (!info.toolkit_version.empty()) break;
          }
        }
      }
    }
    if (info.toolkit_version.empty()) {
      info.toolkit_version = version_from_info(env, info.toolkit_home + "/version.info");
    }
  }
  return info;
}

std::string_view platform_name(Platform platform) {
  switch (platform) {
    case Platform::kCpu:
      return "cpu";
    case Platform::kAscend:
      return "ascend";
    case Platform::kNvidia:
      return "nvidia";
    case Platform::kRocm:
      return "rocm";
  }
  return "cpu";
}

}  // namespace ferry::device
