// `ferry doctor` against fake root folders and fake tools (tests/device/fixtures):
// each node type gives the check ids and severities it should.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace ferry::testing {
namespace {

const std::string kFixtures = std::string(FERRY_SOURCE_DIR) + "/tests/device/fixtures";

struct Node {
  std::string root;   // fixtures/roots/<root>, or an absolute path
  std::string bin;    // fixtures/bin/<bin>, the whole PATH ("" = nothing on PATH)
  std::string probe;  // fixtures/probes/<probe>.txt, what the fake python prints
  std::vector<std::string> env;
};

struct Outcome {
  int exit_code = -1;
  nlohmann::json json;
  std::map<std::string, std::string> severity;  // check id -> "ok" / "info" / "warn" / "fail"
  std::string err;
};

Outcome doctor(const Node& node, std::vector<std::string> extra_args = {}) {
  std::vector<std::string> env = {
      "PATH=" + (node.bin.empty() ? kFixtures + "/bin/none" : kFixtures + "/bin/" + node.bin),
      "FERRY_SYSROOT=" + (node.root[0] == '/' ? node.root : kFixtures + "/roots/" + node.root)};
  if (!node.probe.empty())
    env.push_back("FAKE_PROBE=" + kFixtures + "/probes/" + node.probe + ".txt");
  env.insert(env.end(), node.env.begin(), node.env.end());
  std::vector<std::string> args = {"doctor", "--json"};
  if (!node.probe.empty()) args.insert(args.end(), {"--python", "python"});
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  const CommandResult r = run_ferry(args, env);
  Outcome o;
  o.exit_code = r.exit_code;
  o.err = r.err;
  o.json = nlohmann::json::parse(r.out, nullptr, false);
  if (o.json.is_object() && o.json.contains("checks")) {
    for (const auto& c : o.json["checks"]) o.severity[c["id"]] = c["severity"];
  }
  return o;
}

// "missing" when the report has no such check.
std::string sev(const Outcome& o, const std::string& id) {
  auto it = o.severity.find(id);
  return it == o.severity.end() ? "missing" : it->second;
}

std::string fix_of(const Outcome& o, const std::string& id) {
  std::string all;
  for (const auto& c : o.json["checks"]) {
    if (c["id"] == id) {
      for (const auto& f : c["fix"]) all += f.get<std::string>() + "\n";
    }
  }
  return all;
}

std::string seen_of(const Outcome& o, const std::string& id) {
  for (const auto& c : o.json["checks"]) {
    if (c["id"] == id) return c["seen"];
  }
  return "";
}

const std::vector<std::string> kHealthyAscendEnv = {
    "ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7",
    "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1",
    "ASCEND_HOME_PATH=/usr/local/Ascend/ascend-toolkit/latest",
    "FERRY_NET_PATH=ucx"};  // the node has RDMA (rc_mlx5), and sync is told to use it

TEST(DoctorFixture, HealthyEightNpuNode) {
  const Outcome o = doctor({"ascend8", "ascend8", "ascend_healthy", kHealthyAscendEnv});
  ASSERT_TRUE(o.json.is_object()) << o.err;
  EXPECT_EQ(o.json["platform"], "ascend");
  EXPECT_EQ(o.json["accelerators"].size(), 8u);
  EXPECT_EQ(o.json["cann_version"], "8.5.0");
  for (const char* id :
       {"ascend.device_nodes", "ascend.driver", "ascend.npu_smi", "ascend.health", "ascend.cann",
        "mask.ascend", "ray.physical_ids.ascend", "python.probe", "python.npu_available",
        "versions.torch_npu", "versions.matrix", "sync.memlock", "sync.ucx"}) {
    EXPECT_EQ(o.severity.count(id) ? o.severity.at(id) : "missing", "ok")
        << id << ": " << seen_of(o, id);
  }
  EXPECT_EQ(o.severity.count("ray.override.ascend"), 0u);
  EXPECT_NE(seen_of(o, "versions.matrix").find("MindSpeed 2.3.0"), std::string::npos);
  EXPECT_NE(seen_of(o, "mask.ascend").find("0->0, 1->1"), std::string::npos);
  EXPECT_EQ(o.exit_code, 0);
}

TEST(DoctorFixture, NpuDriverMissing) {
  const Outcome o = doctor({"ascend_nodriver",
                            "python_only",
                            "ascend_unavailable",
                            {"ASCEND_HOME_PATH=/usr/local/Ascend/ascend-toolkit/latest"}});
  ASSERT_TRUE(o.json.is_object()) << o.err;
  EXPECT_EQ(o.json["platform"], "ascend");
  EXPECT_EQ(sev(o, "ascend.device_nodes"), "fail");
  EXPECT_EQ(sev(o, "ascend.driver"), "fail");
  EXPECT_EQ(sev(o, "ascend.npu_smi"), "fail");
  EXPECT_EQ(sev(o, "python.npu_available"), "fail");
  EXPECT_EQ(sev(o, "sync.memlock"), "warn");  // 8 MiB memlock in this fixture
  EXPECT_NE(fix_of(o, "ascend.npu_smi").find("npu-smi info"), std::string::npos);
  EXPECT_NE(
      fix_of(o, "python.npu_available").find("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1"),
      std::string::npos);
  EXPECT_EQ(o.exit_code, 1);
}

TEST(DoctorFixture, MaskHidingAllDevices) {
  std::vector<std::string> env = kHealthyAscendEnv;
  env[0] = "ASCEND_RT_VISIBLE_DEVICES=8,9";
  const Outcome o = doctor({"ascend8", "ascend8", "", env});
  ASSERT_TRUE(o.json.is_object()) << o.err;
  EXPECT_EQ(sev(o, "mask.ascend"), "fail");
  EXPECT_NE(seen_of(o, "mask.ascend").find("no device is visible"), std::string::npos);
  EXPECT_NE(fix_of(o, "mask.ascend").find("export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"),
            std::string::npos);
  EXPECT_EQ(o.exit_code, 1);
}

TEST(DoctorFixture, DescendingAscendMaskFails) {
  std::vector<std::string> env = kHealthyAscendEnv;
  env[0] = "ASCEND_RT_VISIBLE_DEVICES=3,1";
  const Outcome o = doctor({"ascend8", "ascend8", "", env});
  EXPECT_EQ(sev(o, "mask.ascend"), "fail");
  EXPECT_NE(fix_of(o, "mask.ascend").find("export ASCEND_RT_VISIBLE_DEVICES=1,3"),
            std::string::npos);
}

TEST(DoctorFixture, RayWillOverrideTheMask) {
  const Outcome o = doctor({"ascend8",
                            "ascend8",
                            "",
                            {"ASCEND_RT_VISIBLE_DEVICES=0,1,2,3",
                             "ASCEND_HOME_PATH=/usr/local/Ascend/ascend-toolkit/latest"}});
  ASSERT_TRUE(o.json.is_object()) << o.err;
  EXPECT_EQ(sev(o, "mask.ascend"), "ok");
  EXPECT_EQ(sev(o, "ray.override.ascend"), "warn");
  const std::string fix = fix_of(o, "ray.override.ascend");
  EXPECT_NE(fix.find("export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3"), std::string::npos);
  EXPECT_NE(fix.find("export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1"),
            std::string::npos);
  EXPECT_EQ(o.exit_code, 0);  // a warning, not a failure
}

TEST(DoctorFixture, RayHandsOutPhysicalIds) {
  // verl-project/verl#7507: with NOSET and mask 4,5,6,7 Ray reports physical 5 for logical 1.
  const Outcome o = doctor(
      {"ascend8",
       "ascend8",
       "",
       {"ASCEND_RT_VISIBLE_DEVICES=4,5,6,7", "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1",
        "ASCEND_HOME_PATH=/usr/local/Ascend/ascend-toolkit/latest"}});
  EXPECT_EQ(sev(o, "ray.physical_ids.ascend"), "warn");
  EXPECT_NE(seen_of(o, "ray.physical_ids.ascend").find("verl-project/verl#7507"),
            std::string::npos);
  EXPECT_NE(seen_of(o, "mask.ascend").find("0->4, 1->5, 2->6, 3->7"), std::string::npos);
}

TEST(DoctorFixture, VersionMismatch) {
  std::vector<std::string> env = kHealthyAscendEnv;
  env[2] = "ASCEND_HOME_PATH=/opt/cann-8.3.RC1";
  const Outcome o = doctor({"ascend8", "ascend8", "ascend_mismatch", env});
  ASSERT_TRUE(o.json.is_object()) << o.err;
  EXPECT_EQ(o.json["cann_version"], "8.3.RC1");
  EXPECT_EQ(sev(o, "versions.torch_npu"), "fail");
  EXPECT_NE(fix_of(o, "versions.torch_npu").find("pip install torch_npu==2.9.0"),
            std::string::npos);
  EXPECT_EQ(sev(o, "versions.matrix"), "warn");
  const std::string seen = seen_of(o, "versions.matrix");
  EXPECT_NE(seen.find("Nearest: 'verl vLLM-Ascend 0.13 + MindSpeed 2.3.0 (2026-03)'"),
            std::string::npos)
      << seen;
  const std::string fix = fix_of(o, "versions.matrix");
  EXPECT_NE(fix.find("pip install torch==2.8.0"), std::string::npos) << fix;
  EXPECT_NE(fix.find("git checkout 2.3.0_core_r0.12.1"), std::string::npos) << fix;
  EXPECT_NE(fix.find("CANN 8.5.0"), std::string::npos) << fix;
  EXPECT_EQ(o.exit_code, 1);
}

TEST(DoctorFixture, NvidiaNode) {
  const Outcome o =
      doctor({"nvidia4", "nvidia4", "nvidia", {"CUDA_VISIBLE_DEVICES=GPU-8932f937,1"}});
  ASSERT_TRUE(o.json.is_object()) << o.err;
  EXPECT_EQ(o.json["platform"], "nvidia");
  EXPECT_EQ(o.json["driver_version"], "550.54.15");
  EXPECT_EQ(sev(o, "nvidia.device_nodes"), "ok");
  EXPECT_EQ(sev(o, "nvidia.driver"), "ok");
  EXPECT_EQ(sev(o, "nvidia.smi"), "ok");
  EXPECT_EQ(sev(o, "mask.cuda"), "ok");
  EXPECT_EQ(sev(o, "python.cuda_available"), "ok");
  EXPECT_EQ(sev(o, "ray.override.cuda"), "warn");
  EXPECT_EQ(o.severity.count("ascend.driver"), 0u);
  EXPECT_EQ(o.severity.count("versions.matrix"), 0u);  // no Ascend stack to compare
  EXPECT_NE(seen_of(o, "mask.cuda").find("0->0, 1->1"), std::string::npos);
  EXPECT_EQ(o.exit_code, 0);
}

TEST(DoctorFixture, CpuOnly) {
  const Outcome o = doctor({"cpu", "", "", {}});
  ASSERT_TRUE(o.json.is_object()) << o.err;
  EXPECT_EQ(o.json["platform"], "cpu");
  EXPECT_EQ(sev(o, "platform"), "info");
  EXPECT_NE(seen_of(o, "platform").find("CPU-only"), std::string::npos);
  for (const auto& [id, sev] : o.severity) {
    EXPECT_NE(sev, "fail") << id;
    EXPECT_NE(id.rfind("ascend.", 0), 0u) << id;
    EXPECT_NE(id.rfind("mask.", 0), 0u) << id;
  }
  EXPECT_EQ(sev(o, "sync.ucx"), "info");  // no ucx_info on this PATH
  EXPECT_EQ(o.exit_code, 0);
}

TEST(DoctorFixture, SysrootFlagOverridesTheEnvironment) {
  const CommandResult r = run_ferry({"doctor", "--sysroot", kFixtures + "/roots/cpu"},
                                    {"PATH=" + kFixtures + "/bin/none"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("CPU-only"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[info] platform"), std::string::npos) << r.out;
}

TEST(DoctorFixture, DebugEnvOnAscend) {
  const CommandResult r = run_ferry(
      {"doctor", "--debug-env"},
      {"PATH=" + kFixtures + "/bin/ascend8", "FERRY_SYSROOT=" + kFixtures + "/roots/ascend8"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"export VERL_LOGGING_LEVEL=DEBUG", "export FERRY_LOG_LEVEL=debug",
                           "export ASCEND_GLOBAL_LOG_LEVEL=0",
                           "export ASCEND_SLOG_PRINT_TO_STDOUT=1", "export HCCL_DEBUG=INFO"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  EXPECT_EQ(r.out.find("NCCL_DEBUG"), std::string::npos);
}

TEST(DoctorFixture, DebugEnvOnNvidia) {
  const CommandResult r = run_ferry(
      {"doctor", "--debug-env", "--json"},
      {"PATH=" + kFixtures + "/bin/nvidia4", "FERRY_SYSROOT=" + kFixtures + "/roots/nvidia4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  std::vector<std::string> names;
  for (const auto& v : j) names.push_back(v["name"]);
  EXPECT_NE(std::find(names.begin(), names.end(), "NCCL_DEBUG"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "HCCL_DEBUG"), names.end());
}

// A copy of fixtures/roots/<name> in `dir`, to add or change files in.
std::string copy_root(const TempDir& dir, const std::string& name) {
  const std::string root = dir.file("root");
  std::filesystem::copy(kFixtures + "/roots/" + name, root,
                        std::filesystem::copy_options::recursive);
  return root;
}

TEST(DoctorFixture, RayOverrideFixExportsTheCorrectedMask) {
  // Issue 15: the mask check said 1,3 and the Ray fix re-exported the broken 3,1.
  const Outcome o = doctor({"ascend8",
                            "ascend8",
                            "",
                            {"ASCEND_RT_VISIBLE_DEVICES=3,1",
                             "ASCEND_HOME_PATH=/usr/local/Ascend/ascend-toolkit/latest"}});
  ASSERT_TRUE(o.json.is_object()) << o.err;
  EXPECT_EQ(sev(o, "mask.ascend"), "fail");
  EXPECT_NE(fix_of(o, "mask.ascend").find("export ASCEND_RT_VISIBLE_DEVICES=1,3"),
            std::string::npos);
  const std::string fix = fix_of(o, "ray.override.ascend");
  EXPECT_NE(fix.find("export ASCEND_RT_VISIBLE_DEVICES=1,3\n"), std::string::npos) << fix;
  EXPECT_EQ(fix.find("3,1"), std::string::npos) << fix;
}

TEST(DoctorFixture, NoDriverFixNamesTheA2PackageOnA910BNode) {
  // ascend_nodriver's PCI devices are 0xd802 (910B, Atlas A2).
  const Outcome o = doctor({"ascend_nodriver", "", "", {}});
  ASSERT_TRUE(o.json.is_object()) << o.err;
  const std::string fix = fix_of(o, "ascend.device_nodes");
  EXPECT_NE(fix.find("Ascend-hdk-910b-npu-driver"), std::string::npos) << fix;
  EXPECT_EQ(fix.find("Atlas-A3-hdk"), std::string::npos) << fix;  // the A3 package
}

TEST(DoctorFixture, NoDriverFixNamesTheA3PackageOnAnA3Node) {
  TempDir dir;
  const std::string root = copy_root(dir, "ascend_nodriver");
  for (const auto& d : std::filesystem::directory_iterator(root + "/sys/bus/pci/devices")) {
    write_bytes(d.path().string() + "/device", "0xd803\n");
  }
  const Outcome o = doctor({root, "", "", {}});
  const std::string fix = fix_of(o, "ascend.device_nodes");
  EXPECT_NE(fix.find("Atlas-A3-hdk-npu-driver"), std::string::npos) << fix;
  EXPECT_EQ(fix.find("910b"), std::string::npos) << fix;
}

TEST(DoctorFixture, NoDriverFixOnAnUnknownChipNamesNoPackage) {
  TempDir dir;
  const std::string root = copy_root(dir, "ascend_nodriver");
  for (const auto& d : std::filesystem::directory_iterator(root + "/sys/bus/pci/devices")) {
    std::filesystem::remove(d.path() / "device");
  }
  const std::string fix = fix_of(doctor({root, "", "", {}}), "ascend.device_nodes");
  EXPECT_NE(fix.find("lspci -d 19e5:"), std::string::npos) << fix;
  EXPECT_EQ(fix.find("hdk-npu-driver"), std::string::npos) << fix;
}

TEST(DoctorFixture, ReportsFerrysOwnVersion) {
  const CommandResult v = run_ferry({"--version"});  // "ferry 0.1.0\n"
  ASSERT_EQ(v.out.rfind("ferry ", 0), 0u) << v.out;
  const std::string version = v.out.substr(6, v.out.find('\n') - 6);
  ASSERT_FALSE(version.empty()) << v.out;
  const Outcome o = doctor({"cpu", "", "", {}});
  EXPECT_EQ(o.json["ferry_version"], version);
  const CommandResult text = run_ferry({"doctor", "--sysroot", kFixtures + "/roots/cpu"},
                                       {"PATH=" + kFixtures + "/bin/none"});
  EXPECT_NE(text.out.find("(ferry " + version + ")"), std::string::npos) << text.out;
}

TEST(DoctorFixture, CudaRuntimeSupportedByTheDriver) {
  // Driver 550.54.15 shipped with CUDA 12.4.
  const Outcome o = doctor({"nvidia4", "nvidia4", "nvidia", {}});
  EXPECT_EQ(sev(o, "nvidia.cuda_driver"), "ok") << seen_of(o, "nvidia.cuda_driver");
  EXPECT_TRUE(fix_of(o, "nvidia.cuda_driver").empty());
}

TEST(DoctorFixture, CudaRuntimeNewerThanTheDriverFails) {
  const Outcome o = doctor({"nvidia4", "nvidia4", "nvidia_cu130", {}});
  EXPECT_EQ(sev(o, "nvidia.cuda_driver"), "fail");
  EXPECT_NE(seen_of(o, "nvidia.cuda_driver").find("CUDA 13.0 needs driver >= 580.65.06"),
            std::string::npos)
      << seen_of(o, "nvidia.cuda_driver");
  EXPECT_NE(fix_of(o, "nvidia.cuda_driver").find("install NVIDIA driver >= 580.65.06"),
            std::string::npos);
  EXPECT_EQ(o.exit_code, 1);
}

TEST(DoctorFixture, CudaMinorVersionCompatibilityWarns) {
  const Outcome o = doctor({"nvidia4", "nvidia4", "nvidia_cu128", {}});
  EXPECT_EQ(sev(o, "nvidia.cuda_driver"), "warn");
  EXPECT_NE(fix_of(o, "nvidia.cuda_driver").find("install NVIDIA driver >= 570.26"),
            std::string::npos);
}

TEST(DoctorFixture, NcclVersionFromTorch) {
  const Outcome o = doctor({"nvidia4", "nvidia4", "nvidia", {}});
  EXPECT_EQ(sev(o, "nvidia.nccl"), "ok");
  EXPECT_NE(seen_of(o, "nvidia.nccl").find("NCCL 2.21.5"), std::string::npos);
}

TEST(DoctorFixture, TorchWithoutNcclWarns) {
  const Outcome o = doctor({"nvidia4", "nvidia4", "nvidia_no_nccl", {}});
  EXPECT_EQ(sev(o, "nvidia.nccl"), "warn");
  EXPECT_NE(fix_of(o, "nvidia.nccl").find("torch.cuda.nccl.version()"), std::string::npos);
}

TEST(DoctorFixture, InfinibandWithoutPeermemWarns) {
  TempDir dir;
  const std::string root = copy_root(dir, "nvidia4");
  std::filesystem::create_directories(root + "/sys/class/infiniband/mlx5_0");
  write_bytes(root + "/proc/modules", "nvidia_uvm 1916928 0 - Live 0x0\nnvidia 1 1 - Live 0x0\n");
  const Outcome o = doctor({root, "nvidia4", "nvidia", {}});
  EXPECT_EQ(sev(o, "nvidia.gpudirect"), "warn");
  EXPECT_NE(seen_of(o, "nvidia.gpudirect").find("mlx5_0"), std::string::npos);
  EXPECT_NE(fix_of(o, "nvidia.gpudirect").find("sudo modprobe nvidia_peermem"), std::string::npos);
}

TEST(DoctorFixture, InfinibandWithPeermemIsGpuDirect) {
  TempDir dir;
  const std::string root = copy_root(dir, "nvidia4");
  std::filesystem::create_directories(root + "/sys/class/infiniband/mlx5_0");
  write_bytes(root + "/proc/modules", "nvidia_peermem 16384 0 - Live 0x0\nnvidia 1 1 - Live 0x0\n");
  const Outcome o = doctor({root, "nvidia4", "nvidia", {}});
  EXPECT_EQ(sev(o, "nvidia.gpudirect"), "ok");
  EXPECT_TRUE(fix_of(o, "nvidia.gpudirect").empty());
}

TEST(DoctorFixture, NoInfinibandIsInfo) {
  const Outcome o = doctor({"nvidia4", "nvidia4", "nvidia", {}});
  EXPECT_EQ(sev(o, "nvidia.gpudirect"), "info");
  EXPECT_NE(seen_of(o, "nvidia.gpudirect").find("TCP"), std::string::npos);
}

TEST(DoctorFixture, MigEnabledWarnsWithTheGpu) {
  const Outcome o = doctor({"nvidia4", "nvidia4", "nvidia", {}});  // MIG on GPU 3
  EXPECT_EQ(sev(o, "nvidia.mig"), "warn");
  EXPECT_NE(fix_of(o, "nvidia.mig").find("sudo nvidia-smi -i 3 -mig 0"), std::string::npos);
}

TEST(DoctorFixture, MigOffIsOk) {
  const Outcome o = doctor({"nvidia4", "nvidia4", "nvidia", {"FAKE_MIG=0"}});
  EXPECT_EQ(sev(o, "nvidia.mig"), "ok");
  EXPECT_TRUE(fix_of(o, "nvidia.mig").empty());
}

TEST(DoctorRealMachine, ThisMachineIsCpuOnlyAndPasses) {
  // The CI machine has no accelerator: doctor must say so and exit 0.
  const CommandResult r = run_ferry({"doctor"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("CPU-only"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace ferry::testing
