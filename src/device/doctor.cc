// run_doctor(): probes the node and turns what it saw into checks with fixes.
#include <algorithm>

#include "device/probes.h"
#include "device/text_util.h"

namespace ferry::device {

std::string_view severity_name(Severity severity) {
  switch (severity) {
    case Severity::kOk:
      return "ok";
    case Severity::kInfo:
      return "info";
    case Severity::kWarn:
      return "warn";
    case Severity::kFail:
      return "fail";
  }
  return "ok";
}

bool Report::failed() const {
  return std::any_of(checks.begin(), checks.end(),
                     [](const Check& c) { return c.severity == Severity::kFail; });
}

const Check* Report::find(std::string_view id) const {
  for (const Check& c : checks) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

namespace {

std::string mask_id(MaskKind kind) {
  switch (kind) {
    case MaskKind::kAscend:
      return "ascend";
    case MaskKind::kCuda:
      return "cuda";
    case MaskKind::kHip:
      return "hip";
    case MaskKind::kRocr:
      return "rocr";
  }
  return "";
}

std::vector<int> first_n(int n) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(i);
  return ids;
}

std::string export_line(std::string_view var, const std::string& value) {
  return "export " + std::string(var) + "=" + shell_quote(value);
}

// The Ascend HDK package for the detected chip: an A3 package does not drive an A2 card.
std::vector<std::string> driver_install_fix(const std::string& chip) {
  std::vector<std::string> fix = {
      "# the NPU driver (Ascend HDK) is not loaded: install the npu-driver and npu-firmware "
      "packages for this card"};
  if (chip == "910_93") {
    fix.push_back(
        "# Atlas A3 (910_93), as verl's install guide says: sudo yum install -y "
        "Atlas-A3-hdk-npu-driver-26.0.rc1");
  } else if (chip == "910B") {
    fix.push_back(
        "# Atlas A2 (910B): the Ascend-hdk-910b-npu-driver and "
        "Ascend-hdk-910b-npu-firmware packages (not an Atlas-A3 one)");
  } else if (!chip.empty()) {
    fix.push_back("# Ascend " + chip + ": the Ascend-hdk-" + chip +
                  "-npu-driver and -npu-firmware packages for it");
  } else {
    fix.push_back(
        "lspci -d 19e5: -n   # the device id names the chip: d802 = 910B (A2), d803 = "
        "910_93 (A3)");
  }
  return fix;
}

void ascend_checks(const PlatformInfo& p, std::vector<Check>* out) {
  const bool nodes =
      std::any_of(p.device_nodes.begin(), p.device_nodes.end(), [](const std::string& n) {
        return n.rfind("/dev/davinci", 0) == 0 && n != "/dev/davinci_manager";
      });
  Check dev{"ascend.device_nodes", Severity::kOk, "NPU device nodes", "", {}};
  dev.seen = nodes ? join(p.device_nodes, " ")
                   : "no /dev/davinci* nodes although " + std::to_string(p.pci_ascend) +
                         " Ascend device(s) are on the PCI bus";
  if (!nodes) {
    dev.severity = Severity::kFail;
    dev.fix = driver_install_fix(p.ascend_chip);
    dev.fix.push_back("ls /dev/davinci*   # expect one node per NPU after the driver loads");
  }
  out->push_back(dev);

  Check drv{"ascend.driver", Severity::kOk, "NPU driver", "", {}};
  if (p.driver_version.empty()) {
    drv.severity = Severity::kFail;
    drv.seen = "no /usr/local/Ascend/driver/version.info and no version from npu-smi";
    drv.fix = {"# install the Ascend HDK npu-driver and npu-firmware packages, then:",
               "cat /usr/local/Ascend/driver/version.info", "npu-smi info"};
  } else {
    drv.seen = "driver " + p.driver_version +
               (p.firmware_version.empty() ? "" : ", firmware " + p.firmware_version);
  }
  out->push_back(drv);

  Check smi{"ascend.npu_smi", Severity::kOk, "npu-smi info", "", {}};
  if (!p.tool_ok) {
    smi.severity = Severity::kFail;
    smi.seen = p.tool_error.empty() ? "npu-smi did not run" : p.tool_error;
    smi.fix = p.tool_found
                  ? std::vector<std::string>{"npu-smi info   # must list every NPU; if it hangs or errors, "
                                             "reinstall or reload the driver (HDK)"}
                  : std::vector<std::string>{
                        "export PATH=/usr/local/Ascend/driver/tools:$PATH   # npu-smi ships with the driver",
                        "npu-smi info"};
  } else {
    smi.seen = std::to_string(p.accelerators.size()) + " NPU(s)";
    if (!p.accelerators.empty()) smi.seen += ": " + p.accelerators.front().name;
  }
  out->push_back(smi);

  if (p.tool_ok) {
    Check health{"ascend.health", Severity::kOk, "NPU health (npu-smi)", "", {}};
    std::vector<std::string> bad;
    for (const Accelerator& a : p.accelerators) {
      if (a.health != "OK") bad.push_back("NPU " + std::to_string(a.id) + " " + a.health);
    }
    health.seen = bad.empty() ? "all OK" : join(bad, ", ");
    if (!bad.empty()) {
      health.severity = Severity::kWarn;
      health.fix = {"npu-smi info -t health -i <id>   # details for the NPU named above"};
    }
    out->push_back(health);
  }
}

void cann_check(const PlatformInfo& p, const Env& env, std::vector<Check>* out) {
  Check c{"ascend.cann", Severity::kOk, "CANN toolkit", "", {}};
  if (p.toolkit_home.empty()) {
    c.severity = Severity::kWarn;
    c.seen =
        "no CANN toolkit: ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH unset and no "
        "/usr/local/Ascend/ascend-toolkit/latest";
    c.fix = {"source /usr/local/Ascend/ascend-toolkit/set_env.sh",
             "source /usr/local/Ascend/nnal/atb/set_env.sh"};
  } else if (p.toolkit_version.empty()) {
    c.severity = Severity::kWarn;
    c.seen = p.toolkit_home + " has no ascend_toolkit_install.info with a version";
    c.fix = {"ls " + p.toolkit_home + "   # a partial install: reinstall Ascend-cann-toolkit"};
  } else {
    c.seen = "CANN " + p.toolkit_version + " at " + p.toolkit_home;
    if (!env.get_env("ASCEND_HOME_PATH") && !env.get_env("ASCEND_TOOLKIT_HOME")) {
      c.severity = Severity::kWarn;
      c.seen += ", but set_env.sh was not sourced (ASCEND_HOME_PATH unset)";
      c.fix = {"source /usr/local/Ascend/ascend-toolkit/set_env.sh"};
    }
  }
  out->push_back(c);
}

void gpu_checks(const PlatformInfo& p, std::vector<Check>* out) {
  const bool nvidia = p.platform == Platform::kNvidia;
  const std::string vendor = nvidia ? "nvidia" : "rocm";
  Check dev{vendor + ".device_nodes", Severity::kOk, "GPU device nodes", "", {}};
  dev.seen = p.device_nodes.empty() ? "none" : join(p.device_nodes, " ");
  if (p.device_nodes.empty()) {
    dev.severity = Severity::kFail;
    dev.seen = "no device nodes although the GPU is on the PCI bus";
    dev.fix = {nvidia ? "sudo modprobe nvidia && nvidia-smi   # or install the NVIDIA driver"
                      : "sudo modprobe amdgpu && ls /dev/kfd   # or install amdgpu-dkms"};
  }
  out->push_back(dev);
  Check drv{vendor + ".driver", Severity::kOk, "GPU driver", "", {}};
  drv.seen = p.driver_version.empty() ? "driver version unknown" : "driver " + p.driver_version;
  if (nvidia && p.driver_version.empty()) {
    drv.severity = Severity::kFail;
    drv.seen = "/proc/driver/nvidia/version is missing: the NVIDIA kernel module is not loaded";
    drv.fix = {"sudo modprobe nvidia", "cat /proc/driver/nvidia/version"};
  }
  out->push_back(drv);
  Check smi{vendor + ".smi", Severity::kOk, p.tool, "", {}};
  if (!p.tool_ok) {
    smi.severity = Severity::kFail;
    smi.seen = p.tool_error;
    smi.fix = {p.tool + (nvidia ? " -L   # must list every GPU" : " --showid")};
  } else {
    smi.seen = std::to_string(p.accelerators.size()) + " GPU(s)";
    if (!p.accelerators.empty()) smi.seen += ": " + p.accelerators.front().name;
  }
  out->push_back(smi);
}

std::string describe_map(const VisibleDevices& m) {
  std::string s;
  for (std::size_t i = 0; i < m.physical.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(i) + "->" +
         (m.physical[i] < 0 ? m.accepted[i] : std::to_string(m.physical[i]));
  }
  return s;
}

// The mask for one runtime, and what Ray will do to it.
void mask_checks(const Env& env, const VisibleDevices& m, int count, std::vector<Check>* out) {
  const std::string var(mask_variable(m.kind));
  const std::vector<int> all = first_n(std::max(count, 0));
  const std::string all_line = export_line(var, id_list(all));
  Check c{"mask." + mask_id(m.kind), Severity::kOk, var, "", {}};
  std::string corrected = m.raw;  // the mask every fix line below exports
  if (!m.set) {
    c.seen = "unset: all " + std::to_string(std::max(count, 0)) + " device(s) visible";
  } else {
    c.seen = var + "=" + shell_quote(m.raw) + " -> logical->physical " +
             (m.physical.empty() ? "(none)" : describe_map(m));
    if (!m.ignored.empty()) {
      c.seen += "; the runtime ignores '" + m.ignored + "' (" + m.ignored_reason + ")";
      c.severity = Severity::kWarn;
    }
    if (!m.violation.empty()) {
      c.seen += "; " + m.violation;
      c.severity =
          m.kind == MaskKind::kAscend || m.physical.empty() ? Severity::kFail : Severity::kWarn;
      if (m.kind == MaskKind::kAscend) {
        c.seen +=
            ": CANN supports ascending ids only and torch_npu.npu.is_available() returns False";
        std::vector<int> sorted = m.physical;
        std::sort(sorted.begin(), sorted.end());
        sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
        corrected = id_list(sorted);
        c.fix = {export_line(var, corrected)};
      }
    }
    if (m.hides_all()) {
      c.severity = Severity::kFail;
      c.seen += count > 0 ? "; no device is visible although the node has " + std::to_string(count)
                          : "; no device is visible";
    }
    if (c.severity != Severity::kOk && c.fix.empty() && count > 0) {
      corrected = id_list(all);
      c.fix = {all_line};
    }
    if (c.severity != Severity::kOk && c.fix.empty()) c.fix = {"unset " + var};
  }
  out->push_back(c);

  if (m.kind == MaskKind::kRocr) return;  // Ray sets ROCR together with HIP
  const std::string noset = ray_noset_variable(m.kind);
  const auto noset_value = env.get_env(noset);
  const bool noset_on = noset_value && !noset_value->empty() && *noset_value != "0";
  if (m.set && !noset_on && !m.physical.empty()) {
    // FAQ step 2: without the NOSET variable Ray rewrites the mask per worker.
    out->push_back({"ray.override." + mask_id(m.kind),
                    Severity::kWarn,
                    "Ray and " + var,
                    var + " is set but " + noset +
                        " is not: Ray replaces the mask in every worker with the ids it assigns",
                    {export_line(var, corrected), "export " + noset + "=1"}});
  }
  if (noset_on) {
    bool identity = true;
    for (std::size_t i = 0; i < m.physical.size(); ++i) {
      if (m.physical[i] != static_cast<int>(i)) identity = false;
    }
    Check r{"ray.physical_ids." + mask_id(m.kind),
            Severity::kOk,
            "Ray device ids with " + noset,
            "",
            {}};
    if (m.set && !identity) {
      r.severity = Severity::kWarn;
      r.seen = noset + "=1 and " + var + "=" + m.raw + ": Ray hands workers physical ids (" +
               id_list(m.physical) + ") while torch expects logical ones (0.." +
               std::to_string(m.physical.size() - 1) +
               "); set_device(physical) fails or picks the wrong device (verl-project/verl#7507)";
      r.fix = {"# map each physical id to its position in " + var +
                   " (verl#7507), or let Ray set the mask:",
               "unset " + noset, "# or make logical and physical ids agree:",
               export_line(var, id_list(first_n(static_cast<int>(m.physical.size()))))};
    } else {
      r.seen = noset + "=1; logical and physical ids agree";
    }
    out->push_back(r);
  }
}

void python_checks(const PlatformInfo& p, const PythonInfo& py, std::vector<Check>* out) {
  if (py.python.empty()) return;
  Check c{"python.probe", Severity::kOk, "Python environment (" + py.python + ")", "", {}};
  if (!py.probed) {
    c.severity = Severity::kWarn;
    c.seen = py.error;
    c.fix = {py.python + " -c 'import torch; print(torch.__version__)'"};
    out->push_back(c);
    return;
  }
  std::vector<std::string> parts;
  for (const auto& [k, v] : py.versions) parts.push_back(k + " " + v);
  c.seen = parts.empty() ? "no torch, torch_npu, vllm, MindSpeed or Megatron installed"
                         : join(parts, ", ");
  if (!py.error.empty()) {
    c.severity = Severity::kWarn;
    c.seen += "; " + py.error;
  }
  out->push_back(c);
  if (py.npu_available) {
    Check n{"python.npu_available", Severity::kOk, "torch_npu.npu.is_available()", "", {}};
    n.seen = *py.npu_available ? "True (" + std::to_string(py.device_count.value_or(0)) + " NPU(s))"
                               : "False";
    if (!*py.npu_available) {
      n.severity = Severity::kFail;
      n.seen += ": torch_npu is installed but sees no NPU (the FAQ's first error)";
      n.fix = {
          "echo $ASCEND_RT_VISIBLE_DEVICES",
          "export ASCEND_RT_VISIBLE_DEVICES=" + id_list(first_n(std::max(p.inventory.count, 1))),
          "export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1", "npu-smi info"};
    }
    out->push_back(n);
  }
  if (py.cuda_available && p.platform != Platform::kCpu) {
    Check n{"python.cuda_available", Severity::kOk, "torch.cuda.is_available()", "", {}};
    n.seen = *py.cuda_available ? "True" : "False";
    if (!*py.cuda_available) {
      n.severity = Severity::kFail;
      n.fix = {"echo $CUDA_VISIBLE_DEVICES",
               py.python + " -c 'import torch; print(torch.version.cuda)'"};
    }
    out->push_back(n);
  }
}

// torch_npu X.Y.Z.postN is built for torch X.Y.Z only.
void version_checks(const std::vector<VersionSet>& matrix, const PlatformInfo& p,
                    const PythonInfo& py, std::vector<Check>* out) {
  std::map<std::string, std::string> installed = py.versions;
  if (!p.toolkit_version.empty()) installed["cann"] = p.toolkit_version;
  auto torch = installed.find("torch");
  auto npu = installed.find("torch_npu");
  if (torch != installed.end() && npu != installed.end()) {
    std::string base = torch->second.substr(0, torch->second.find('+'));
    Check c{"versions.torch_npu", Severity::kOk, "torch_npu built for this torch", "", {}};
    c.seen = "torch " + torch->second + ", torch_npu " + npu->second;
    if (!version_matches(base, npu->second)) {
      c.severity = Severity::kFail;
      c.seen += ": torch_npu " + npu->second + " is not a build for torch " + base;
      c.fix = {"pip install torch_npu==" + base + "   # or the torch that matches torch_npu " +
               npu->second};
    }
    out->push_back(c);
  }
  const bool ascend_stack = installed.count("torch_npu") || installed.count("cann") ||
                            installed.count("vllm_ascend") || installed.count("mindspeed");
  if (!ascend_stack) return;
  const VersionVerdict v = check_versions(matrix, installed);
  if (!v.checked) return;
  Check c{"versions.matrix", Severity::kOk, "versions against verl's Ascend install guide", "", {}};
  std::vector<std::string> parts;
  for (const auto& [k, ver] : installed) {
    if (v.nearest && v.nearest->components.count(k)) parts.push_back(k + " " + ver);
  }
  c.seen = "installed: " + join(parts, ", ");
  if (v.exact) {
    c.seen += " = supported set '" + v.exact->name + "'";
  } else if (v.nearest) {
    c.severity = Severity::kWarn;
    c.seen += "; no supported set matches. Nearest: '" + v.nearest->name + "' (" +
              v.nearest->source + "), differing in " + join(v.mismatches, ", ");
    std::vector<std::string> pip;
    for (const auto& [k, wanted] : v.nearest->components) {
      auto it = installed.find(k);
      if (it == installed.end() || version_matches(wanted, it->second)) continue;
      if (k == "cann") {
        c.fix.push_back("# install CANN " + wanted + " (Ascend-cann-toolkit-" + wanted +
                        "), then source /usr/local/Ascend/ascend-toolkit/set_env.sh");
      } else if (k == "torch" || k == "torch_npu" || k == "transformers") {
        pip.push_back(k + "==" + wanted);
      } else if (k == "vllm" || k == "vllm_ascend") {
        const std::string repo = k == "vllm" ? "vllm" : "vllm-ascend";
        c.fix.push_back("git clone --depth 1 --branch v" + wanted +
                        " https://github.com/vllm-project/" + repo +
                        ".git   # then build as the install guide says");
      } else if (k == "mindspeed") {
        c.fix.push_back("cd MindSpeed && git checkout " + wanted + " && pip install -e .");
      } else if (k == "megatron_core") {
        c.fix.push_back("pip install -e Megatron-LM   # after: git -C Megatron-LM checkout core_v" +
                        wanted);
      }
    }
    if (!pip.empty()) c.fix.insert(c.fix.begin(), "pip install " + join(pip, " "));
  }
  out->push_back(c);
}

}  // namespace

Result<Report> run_doctor(const Env& env, const DoctorOptions& options) {
  auto matrix = load_version_matrix(options.data_dir);
  if (!matrix.ok()) return matrix.status();
  Report report;
  report.root = env.root();
  report.platform = probe_platform(env, options.tool_timeout_ms);
  report.python = probe_python(env, options.python, options.python_timeout_ms);
  const PlatformInfo& p = report.platform;
  std::vector<Check>& checks = report.checks;

  Check platform{"platform", Severity::kInfo, "accelerator platform", "", {}};
  switch (p.platform) {
    case Platform::kCpu:
      platform.seen = "CPU-only: no Ascend NPU, NVIDIA GPU or AMD GPU found under " + report.root;
      break;
    case Platform::kAscend:
      platform.seen =
          "Ascend NPU (" + std::to_string(std::max(p.inventory.count, p.pci_ascend)) + ")";
      break;
    case Platform::kNvidia:
      platform.seen =
          "NVIDIA GPU (" + std::to_string(std::max(p.inventory.count, p.pci_nvidia)) + ")";
      break;
    case Platform::kRocm:
      platform.seen =
          "AMD GPU, ROCm (" + std::to_string(std::max(p.inventory.count, p.pci_amd)) + ")";
      break;
  }
  checks.push_back(platform);

  if (p.platform == Platform::kAscend) ascend_checks(p, &checks);
  if (p.platform == Platform::kNvidia || p.platform == Platform::kRocm) gpu_checks(p, &checks);
  if (p.platform == Platform::kNvidia) {
    for (Check& c : nvidia_checks(env, p, report.python)) checks.push_back(std::move(c));
  }
  if (p.platform == Platform::kAscend || !p.toolkit_home.empty()) cann_check(p, env, &checks);

  // Masks that are set are always read; the platform's own mask even when unset.
  std::vector<MaskKind> kinds = {MaskKind::kAscend, MaskKind::kCuda, MaskKind::kRocr,
                                 MaskKind::kHip};
  int rocr_visible = -1;
  for (MaskKind kind : kinds) {
    const auto value = env.get_env(mask_variable(kind));
    const bool own = (kind == MaskKind::kAscend && p.platform == Platform::kAscend) ||
                     (kind == MaskKind::kCuda && p.platform == Platform::kNvidia) ||
                     (kind == MaskKind::kRocr && p.platform == Platform::kRocm);
    if (!value && !own) continue;
    const bool platform_matches =
        (kind == MaskKind::kAscend && p.platform == Platform::kAscend) ||
        (kind == MaskKind::kCuda && p.platform == Platform::kNvidia) ||
        ((kind == MaskKind::kHip || kind == MaskKind::kRocr) && p.platform == Platform::kRocm);
    DeviceInventory inv = platform_matches ? p.inventory : DeviceInventory{};
    // HIP indices count the devices ROCR_VISIBLE_DEVICES left visible.
    if (kind == MaskKind::kHip && rocr_visible >= 0)
      inv = DeviceInventory{rocr_visible, {}, {}, {}};
    VisibleDevices m = parse_visible_devices(kind, value, inv);
    if (kind == MaskKind::kRocr && p.platform == Platform::kRocm) {
      rocr_visible = static_cast<int>(m.physical.size());
    }
    mask_checks(env, m, inv.count, &checks);
    report.masks.push_back(std::move(m));
  }

  python_checks(p, report.python, &checks);
  version_checks(*matrix, p, report.python, &checks);
  for (Check& c : sync_checks(env, options.bucket_mb, options.tool_timeout_ms))
    checks.push_back(std::move(c));
  return report;
}

}  // namespace ferry::device
