// NVIDIA node checks beyond the driver: CUDA runtime vs driver, NCCL,
// InfiniBand with GPUDirect RDMA, and MIG mode.
#include <algorithm>

#include "device/probes.h"
#include "device/text_util.h"

namespace ferry::device {
namespace {

// "550.54.15" -> {550, 54, 15}; stops at the first part that is not a number.
std::vector<std::uint64_t> version_parts(std::string_view v) {
  std::vector<std::uint64_t> parts;
  for (const std::string& p : split(v, '.')) {
    auto n = parse_uint(trim(p));
    if (!n) break;
    parts.push_back(*n);
  }
  return parts;
}

bool older(std::string_view have, std::string_view want) {
  return version_parts(have) < version_parts(want);
}

struct CudaDriverRow {
  const char* cuda;         // "12.8": runtime major.minor
  const char* full_driver;  // the driver the toolkit shipped with (Linux)
  const char* min_driver;   // the oldest driver for the major (minor-version compatibility)
};

// NVIDIA's CUDA release notes, "CUDA Toolkit and Corresponding Driver Versions".
constexpr CudaDriverRow kCudaDrivers[] = {
    {"11.0", "450.36.06", "450.36.06"}, {"11.1", "455.23", "450.80.02"},
    {"11.2", "460.27.03", "450.80.02"}, {"11.3", "465.19.01", "450.80.02"},
    {"11.4", "470.42.01", "450.80.02"}, {"11.5", "495.29.05", "450.80.02"},
    {"11.6", "510.39.01", "450.80.02"}, {"11.7", "515.43.04", "450.80.02"},
    {"11.8", "520.61.05", "450.80.02"}, {"12.0", "525.60.13", "525.60.13"},
    {"12.1", "530.30.02", "525.60.13"}, {"12.2", "535.54.03", "525.60.13"},
    {"12.3", "545.23.06", "525.60.13"}, {"12.4", "550.54.14", "525.60.13"},
    {"12.5", "555.42.02", "525.60.13"}, {"12.6", "560.28.03", "525.60.13"},
    {"12.8", "570.26", "525.60.13"},    {"12.9", "575.51.03", "525.60.13"},
    {"13.0", "580.65.06", "580.65.06"},
};

const CudaDriverRow* cuda_row(std::string_view runtime) {
  const auto want = version_parts(runtime);
  if (want.size() < 2) return nullptr;
  for (const CudaDriverRow& r : kCudaDrivers) {
    const auto have = version_parts(r.cuda);
    if (have[0] == want[0] && have[1] == want[1]) return &r;
  }
  return nullptr;
}

Check cuda_driver_check(const PlatformInfo& p, const PythonInfo& py) {
  Check c{"nvidia.cuda_driver", Severity::kOk, "CUDA runtime vs driver", "", {}};
  if (py.cuda_runtime.empty() || p.driver_version.empty()) {
    c.severity = Severity::kInfo;
    c.seen = py.cuda_runtime.empty()
                 ? "CUDA runtime unknown: pass --python to ask torch (torch.version.cuda)"
                 : "CUDA runtime " + py.cuda_runtime + ", driver version unknown";
    return c;
  }
  c.seen = "torch's CUDA " + py.cuda_runtime + ", driver " + p.driver_version;
  const CudaDriverRow* row = cuda_row(py.cuda_runtime);
  if (row == nullptr) {
    c.severity = Severity::kInfo;
    c.seen += " (CUDA " + py.cuda_runtime +
              " is not in ferry's table; nvidia-smi prints the "
              "newest CUDA this driver supports)";
    return c;
  }
  if (older(p.driver_version, row->min_driver)) {
    c.severity = Severity::kFail;
    c.seen += ": CUDA " + py.cuda_runtime + " needs driver >= " + row->min_driver +
              "; torch.cuda.is_available() is False or fails with 'driver too old'";
    c.fix = {"# install NVIDIA driver >= " + std::string(row->full_driver) +
                 ", or a torch built for a CUDA this driver supports:",
             "nvidia-smi   # 'CUDA Version' in its header is the newest this driver runs"};
  } else if (older(p.driver_version, row->full_driver)) {
    c.severity = Severity::kWarn;
    c.seen += ": runs through CUDA minor-version compatibility (full support from driver " +
              std::string(row->full_driver) +
              "); kernels JIT-compiled from newer PTX fail with 'unsupported toolchain'";
    c.fix = {"# install NVIDIA driver >= " + std::string(row->full_driver) + " (then: nvidia-smi)"};
  }
  return c;
}

// Candidate library folders for libnccl when torch cannot be asked.
constexpr const char* kLibDirs[] = {"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                                    "/usr/lib64", "/usr/local/cuda/lib64", "/usr/lib"};

Check nccl_check(const Env& env, const PythonInfo& py) {
  Check c{"nvidia.nccl", Severity::kOk, "NCCL", "", {}};
  if (!py.nccl_version.empty()) {
    c.seen = "NCCL " + py.nccl_version + " (torch.cuda.nccl.version())";
    return c;
  }
  if (py.cuda_available.value_or(false)) {
    c.severity = Severity::kWarn;
    c.seen = "torch has CUDA but reports no NCCL: torch.distributed's nccl backend is missing";
    c.fix = {py.python + " -c 'import torch; print(torch.cuda.nccl.version())'",
             "# install a torch wheel built with NCCL (the pytorch.org CUDA wheels are)"};
    return c;
  }
  for (const char* dir : kLibDirs) {
    auto names = env.list_dir(dir);
    if (!names.ok()) continue;
    for (const std::string& n : *names) {
      if (n.rfind("libnccl.so", 0) == 0) {
        c.seen = std::string(dir) + "/" + n + " (pass --python to see the NCCL torch uses)";
        return c;
      }
    }
  }
  c.severity = Severity::kInfo;
  c.seen = "no libnccl.so in the system library folders; pass --python to ask torch";
  return c;
}

Check infiniband_check(const Env& env) {
  Check c{"nvidia.gpudirect", Severity::kOk, "InfiniBand / GPUDirect RDMA", "", {}};
  auto hcas = env.list_dir("/sys/class/infiniband");
  if (!hcas.ok() || hcas->empty()) {
    c.severity = Severity::kInfo;
    c.seen = "no InfiniBand/RoCE device in /sys/class/infiniband: multi-node sync runs over TCP";
    return c;
  }
  const std::string devices = join(*hcas, " ");
  auto modules = env.read_file("/proc/modules");
  bool peermem = false;
  if (modules.ok()) {
    for (const std::string& line : split_lines(*modules)) {
      const std::string name = line.substr(0, line.find(' '));
      if (name == "nvidia_peermem" || name == "nv_peer_mem") peermem = true;
    }
  }
  if (peermem) {
    c.seen = devices + "; nvidia_peermem loaded: GPUDirect RDMA available";
  } else {
    c.severity = Severity::kWarn;
    c.seen = devices +
             ", but nvidia_peermem is not loaded: RDMA cannot reach GPU memory, so "
             "UCX and NCCL stage it through host memory";
    c.fix = {"sudo modprobe nvidia_peermem", "grep nvidia_peermem /proc/modules"};
  }
  return c;
}

Check mig_check(const PlatformInfo& p) {
  Check c{"nvidia.mig", Severity::kOk, "MIG mode", "", {}};
  if (!p.tool_ok) {
    c.severity = Severity::kInfo;
    c.seen = "unknown: nvidia-smi did not run";
    return c;
  }
  const auto& parents = p.inventory.mig_parent;
  if (parents.empty()) {
    c.seen = "off on every GPU";
    return c;
  }
  std::vector<int> gpus = parents;
  std::sort(gpus.begin(), gpus.end());
  gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
  c.severity = Severity::kWarn;
  c.seen = "MIG on for GPU " + id_list(gpus) + " (" + std::to_string(parents.size()) +
           " MIG device(s)): a process sees one MIG instance, named by MIG-... UUID in "
           "CUDA_VISIBLE_DEVICES, and NCCL does not run across instances";
  c.fix = {"nvidia-smi -L   # the MIG-... UUIDs to put in CUDA_VISIBLE_DEVICES",
           "sudo nvidia-smi -i " + id_list(gpus) +
               " -mig 0   # MIG off (takes effect after a "
               "GPU reset)"};
  return c;
}

}  // namespace

std::vector<Check> nvidia_checks(const Env& env, const PlatformInfo& p, const PythonInfo& py) {
  return {cuda_driver_check(p, py), nccl_check(env, py), infiniband_check(env), mig_check(p)};
}

}  // namespace ferry::device
