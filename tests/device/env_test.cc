// Probes through an in-memory Env: limits, tools that hang, version rules.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <map>

#include "ferry/device.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::device {
namespace {

// Files and variables from maps; tools from a table. The seam STYLE.md asks for.
class FakeEnv final : public Env {
 public:
  std::map<std::string, std::string> files, vars;
  std::map<std::string, ToolResult> tools;
  FsSpace shm{64ull << 30, 64ull << 30};

  std::optional<std::string> get_env(std::string_view name) const override {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  }
  Result<std::string> read_file(const std::string& path) const override {
    auto it = files.find(path);
    if (it == files.end()) return not_found(path);
    return it->second;
  }
  bool exists(const std::string& path) const override {
    if (path == "/dev/shm") return true;
    for (const auto& [p, _] : files) {
      if (p == path || p.rfind(path + "/", 0) == 0) return true;
    }
    return false;
  }
  Result<std::vector<std::string>> list_dir(const std::string& path) const override {
    std::vector<std::string> names;
    for (const auto& [p, _] : files) {
      if (p.rfind(path + "/", 0) != 0) continue;
      std::string rest = p.substr(path.size() + 1);
      rest = rest.substr(0, rest.find('/'));
      if (names.empty() || names.back() != rest) names.push_back(rest);
    }
    if (names.empty()) return not_found(path);
    return names;
  }
  Result<FsSpace> fs_space(const std::string&) const override { return shm; }
  Result<ToolResult> run(const std::vector<std::string>& argv, int) const override {
    auto it = tools.find(argv[0]);
    if (it == tools.end()) return not_found(argv[0] + " is not on PATH");
    return it->second;
  }
  std::string root() const override { return "(fake)"; }
};

const Check& find(const Report& r, const std::string& id) {
  static const Check kMissing{"missing", Severity::kOk, "", "", {}};
  const Check* c = r.find(id);
  return c ? *c : kMissing;
}

TEST(SyncChecks, LowMemlockSmallShmAndShortHugepagesWarn) {
  FakeEnv env;
  env.files["/proc/self/limits"] =
      "Max locked memory         65536                65536                bytes\n";
  env.files["/proc/meminfo"] =
      "MemAvailable:    1048576 kB\nHugePages_Total:     512\nHugePages_Free:      "
      "100\nHugepagesize:       2048 kB\n";
  env.shm = {1ull << 30, 512ull << 20};
  auto report = run_doctor(env, DoctorOptions{});
  ASSERT_OK(report);
  EXPECT_EQ(find(*report, "sync.memlock").severity, Severity::kWarn);
  EXPECT_EQ(find(*report, "sync.memlock").fix.front(), "ulimit -l unlimited");
  EXPECT_EQ(find(*report, "sync.shm").severity, Severity::kWarn);
  EXPECT_EQ(find(*report, "sync.shm").fix.front(), "sudo mount -o remount,size=4g /dev/shm");
  EXPECT_EQ(find(*report, "sync.memory").severity, Severity::kWarn);  // 1 GiB < 2 x 2048 MiB
  EXPECT_EQ(find(*report, "sync.hugepages").severity, Severity::kWarn);
  // 100 free 2 MiB pages = 200 MiB; one 2048 MiB bucket needs 924 more pages.
  EXPECT_EQ(find(*report, "sync.hugepages").fix.front(),
            "echo 1436 | sudo tee /proc/sys/vm/nr_hugepages");
  EXPECT_EQ(find(*report, "sync.ucx").severity, Severity::kInfo);  // no ucx_info
  EXPECT_FALSE(report->failed());
}

TEST(SyncChecks, BucketSizeDrivesTheLimits) {
  FakeEnv env;
  env.files["/proc/self/limits"] =
      "Max locked memory         67108864             67108864             bytes\n";
  DoctorOptions small;
  small.bucket_mb = 32;
  auto ok = run_doctor(env, small);
  ASSERT_OK(ok);
  EXPECT_EQ(find(*ok, "sync.memlock").severity, Severity::kOk);
  DoctorOptions big;
  big.bucket_mb = 4096;
  auto warn = run_doctor(env, big);
  EXPECT_EQ(find(*warn, "sync.memlock").severity, Severity::kWarn);
}

TEST(SyncChecks, UcxPathWithoutRdmaWarnsAndTheDefaultPathNeedsNone) {
  FakeEnv env;
  env.tools["ucx_info"] =
      ToolResult{0, false, "#      Transport: self\n#      Transport: tcp\n", ""};
  auto report = run_doctor(env, DoctorOptions{});
  EXPECT_EQ(find(*report, "sync.ucx").severity, Severity::kInfo);  // ferry's TCP path
  env.vars["FERRY_NET_PATH"] = "ucx";
  report = run_doctor(env, DoctorOptions{});
  EXPECT_EQ(find(*report, "sync.ucx").severity, Severity::kWarn);
  EXPECT_NE(find(*report, "sync.ucx").seen.find("without RDMA"), std::string::npos);
  env.vars["FERRY_NET_PATH"] = "rdma";
  report = run_doctor(env, DoctorOptions{});
  EXPECT_NE(find(*report, "sync.ucx").seen.find("not 'tcp' or 'ucx'"), std::string::npos);
}

TEST(Platform, HungNpuSmiIsReportedNotWaitedFor) {
  FakeEnv env;
  env.files["/dev/davinci0"] = "";
  env.files["/usr/local/Ascend/driver/version.info"] = "Version=25.5.0\n";
  env.tools["npu-smi"] = ToolResult{137, true, "", ""};
  auto report = run_doctor(env, DoctorOptions{});
  ASSERT_OK(report);
  EXPECT_EQ(report->platform.platform, Platform::kAscend);
  EXPECT_EQ(find(*report, "ascend.npu_smi").severity, Severity::kFail);
  EXPECT_NE(find(*report, "ascend.npu_smi").seen.find("did not answer"), std::string::npos);
}

TEST(PosixEnv, ToolTimeoutKillsTheTool) {
  ferry::testing::TempDir dir;
  ferry::testing::write_bytes(dir.file("slow"), "#!/bin/sh\nsleep 30\n");
  ASSERT_EQ(::chmod(dir.file("slow").c_str(), 0755), 0);
  auto env = posix_env("");
  const auto start = std::chrono::steady_clock::now();
  auto r = env->run({dir.file("slow")}, 300);
  ASSERT_OK(r);
  EXPECT_TRUE(r->timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(PosixEnv, MissingToolIsNotFound) {
  auto r = posix_env("")->run({"ferry-no-such-tool"}, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
}

TEST(PosixEnv, SysrootPrefixesEveryRead) {
  ferry::testing::TempDir dir;
  ASSERT_EQ(::mkdir(dir.file("proc").c_str(), 0755), 0);
  ferry::testing::write_bytes(dir.file("proc/meminfo"), "MemAvailable: 1 kB\n");
  auto env = posix_env(dir.path() + "/");
  EXPECT_EQ(env->root(), dir.path());
  auto text = env->read_file("/proc/meminfo");
  ASSERT_OK(text);
  EXPECT_EQ(*text, "MemAvailable: 1 kB\n");
  EXPECT_FALSE(env->exists("/dev/davinci0"));
}

TEST(Versions, Matching) {
  EXPECT_TRUE(version_matches("2.9.0", "2.9.0.post2"));
  EXPECT_TRUE(version_matches("2.9.0", "2.9.0+cpu"));
  EXPECT_FALSE(version_matches("2.1", "2.10.0"));
  EXPECT_TRUE(version_matches("core_v0.12.1", "0.12.1"));
  EXPECT_TRUE(version_matches("2.3.0_core_r0.12.1", "2.3.0"));
  EXPECT_TRUE(version_matches("2.3.0_core_r0.12.1", "0.12.1"));
  EXPECT_FALSE(version_matches("2.3.0_core_r0.12.1", "2.1.0"));
  EXPECT_TRUE(version_matches(">=8.5.0", "9.1.0"));
  EXPECT_FALSE(version_matches(">=8.5.0", "8.3.RC1"));
  EXPECT_TRUE(version_matches(">=8.3.RC1", "8.3.0"));
}

TEST(Versions, BuiltInMatrixLoadsAndPicksTheNearestSet) {
  auto matrix = load_version_matrix("");
  ASSERT_OK(matrix);
  ASSERT_GE(matrix->size(), 4u);
  const VersionVerdict exact = check_versions(
      *matrix, {{"cann", "9.1.0"}, {"torch", "2.10.0"}, {"torch_npu", "2.10.0.post4"}});
  ASSERT_NE(exact.exact, nullptr);
  EXPECT_NE(exact.exact->name.find("0.23"), std::string::npos);
  const VersionVerdict near = check_versions(
      *matrix,
      {{"torch", "2.9.0"}, {"torch_npu", "2.9.0"}, {"vllm", "0.18.0"}, {"vllm_ascend", "0.17.0"}});
  EXPECT_EQ(near.exact, nullptr);
  ASSERT_NE(near.nearest, nullptr);
  EXPECT_NE(near.nearest->name.find("0.18"), std::string::npos);
  ASSERT_EQ(near.mismatches.size(), 1u);
  EXPECT_EQ(near.mismatches[0], "vllm_ascend 0.17.0 (wants 0.18.0)");
}

TEST(DebugEnv, ThreeLayersOnAscend) {
  const auto vars = debug_env(Platform::kAscend);
  std::map<std::string, std::string> by_name;
  for (const auto& v : vars) by_name[v.name] = v.value;
  EXPECT_EQ(by_name["VERL_LOGGING_LEVEL"], "DEBUG");
  EXPECT_EQ(by_name["ASCEND_GLOBAL_LOG_LEVEL"], "0");
  EXPECT_EQ(by_name["ASCEND_SLOG_PRINT_TO_STDOUT"], "1");
  EXPECT_EQ(by_name["HCCL_DEBUG"], "INFO");
  EXPECT_EQ(by_name.count("NCCL_DEBUG"), 0u);
}

}  // namespace
}  // namespace ferry::device
