// ferry doctor: the FAQ's environment checklist, run by the tool, with fixes.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "ferry/device.h"

namespace ferry::cli {
namespace {

struct DoctorArgs {
  std::string sysroot;
  std::string python;
  std::string data_dir;
  std::uint64_t bucket_mb = 2048;
  int python_timeout_s = 60;
  int tool_timeout_s = 15;
  bool json = false;
  bool debug_env = false;
};

nlohmann::ordered_json to_json(const device::Report& r) {
  nlohmann::ordered_json checks = nlohmann::ordered_json::array();
  for (const device::Check& c : r.checks) {
    checks.push_back({{"id", c.id},
                      {"severity", std::string(device::severity_name(c.severity))},
                      {"title", c.title},
                      {"seen", c.seen},
                      {"fix", c.fix}});
  }
  nlohmann::ordered_json masks = nlohmann::ordered_json::array();
  for (const device::VisibleDevices& m : r.masks) {
    masks.push_back({{"variable", std::string(device::mask_variable(m.kind))},
                     {"set", m.set},
                     {"value", m.raw},
                     {"physical", m.physical},
                     {"ignored", m.ignored},
                     {"violation", m.violation}});
  }
  nlohmann::ordered_json accel = nlohmann::ordered_json::array();
  for (const device::Accelerator& a : r.platform.accelerators) {
    accel.push_back({{"id", a.id}, {"name", a.name}, {"uuid", a.uuid}, {"health", a.health}});
  }
  return {{"ferry_version", FERRY_VERSION},
          {"root", r.root},
          {"platform", std::string(device::platform_name(r.platform.platform))},
          {"driver_version", r.platform.driver_version},
          {"cann_version", r.platform.toolkit_version},
          {"accelerators", accel},
          {"masks", masks},
          {"python",
           {{"interpreter", r.python.python},
            {"versions", r.python.versions},
            {"error", r.python.error}}},
          {"checks", checks},
          {"failed", r.failed()}};
}

void print_human(const device::Report& r) {
  std::printf("ferry doctor (ferry %s): platform %s (root %s)\n", FERRY_VERSION,
              std::string(device::platform_name(r.platform.platform)).c_str(), r.root.c_str());
  int counts[4] = {0, 0, 0, 0};
  for (const device::Check& c : r.checks) {
    ++counts[static_cast<int>(c.severity)];
    std::printf("  [%-4s] %-26s %s\n", std::string(device::severity_name(c.severity)).c_str(),
                c.id.c_str(), c.seen.c_str());
    for (const std::string& f : c.fix) std::printf("           fix: %s\n", f.c_str());
  }
  std::printf("%d ok, %d info, %d warn, %d fail\n", counts[0], counts[1], counts[2], counts[3]);
}

int run_debug_env(const DoctorArgs& a, const device::Env& env) {
  auto report =
      device::run_doctor(env, {"", 1000, a.tool_timeout_s * 1000, a.bucket_mb, a.data_dir});
  if (!report.ok()) return report_error(report.status());
  const auto vars = device::debug_env(report->platform.platform);
  if (a.json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const auto& v : vars) {
      j.push_back({{"layer", v.layer}, {"name", v.name}, {"value", v.value}, {"effect", v.effect}});
    }
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::printf(
      "# Detailed logs, framework -> CANN operators -> communication (platform %s).\n"
      "# Apply with: eval \"$(ferry doctor --debug-env)\"\n",
      std::string(device::platform_name(report->platform.platform)).c_str());
  std::string layer;
  for (const auto& v : vars) {
    if (v.layer != layer) std::printf("# %s\n", (layer = v.layer).c_str());
    std::printf("export %s=%s   # %s\n", v.name.c_str(), v.value.c_str(), v.effect.c_str());
  }
  return kExitOk;
}

int run_doctor_cmd(const DoctorArgs& a) {
  std::unique_ptr<device::Env> env =
      a.sysroot.empty() ? device::default_env() : device::posix_env(a.sysroot);
  if (a.debug_env) return run_debug_env(a, *env);
  device::DoctorOptions o;
  o.python = a.python;
  o.python_timeout_ms = a.python_timeout_s * 1000;
  o.tool_timeout_ms = a.tool_timeout_s * 1000;
  o.bucket_mb = a.bucket_mb;
  o.data_dir = device::data_path(a.data_dir);
  auto report = device::run_doctor(*env, o);
  if (!report.ok()) return report_error(report.status());
  if (a.json) {
    std::cout << to_json(*report).dump(2) << "\n";
  } else {
    print_human(*report);
  }
  return report->failed() ? kExitFailure : kExitOk;
}

}  // namespace

void add_doctor_command(CLI::App& app, Dispatch& dispatch) {
  auto args = std::make_shared<DoctorArgs>();
  CLI::App* cmd = add_command(
      app, dispatch, "doctor",
      "Check the node for NPU/GPU visibility, drivers, versions and weight-sync limits, with fixes",
      "ferry doctor --python $(which python)\n  ferry doctor --debug-env\n"
      "  FERRY_SYSROOT=/tmp/fake-root ferry doctor --json",
      [args] { return run_doctor_cmd(*args); });
  cmd->add_option(
      "--sysroot", args->sysroot,
      "Read every file and device node under this folder (default: $FERRY_SYSROOT or /)");
  cmd->add_option(
      "--python", args->python,
      "Python to ask for torch, torch_npu, vllm, MindSpeed versions (run, never imported)");
  cmd->add_option("--python-timeout", args->python_timeout_s, "Seconds --python may take")
      ->capture_default_str();
  cmd->add_option("--timeout", args->tool_timeout_s, "Seconds each tool (npu-smi, ...) may take")
      ->capture_default_str();
  cmd->add_option("--bucket-mb", args->bucket_mb,
                  "Bucket size weight sync will use, in MiB (2^20 bytes, as verl's megabytes)")
      ->capture_default_str();
  cmd->add_option(
      "--data-dir", args->data_dir,
      "Folder with version_matrix.json (default: $FERRY_DATA_DIR, installed, built-in)");
  cmd->add_flag("--debug-env", args->debug_env,
                "Print the export lines that turn on detailed logs");
  cmd->add_flag("--json", args->json, "Print JSON");
}

}  // namespace ferry::cli
