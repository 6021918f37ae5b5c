// The probes run_doctor() composes; each reads the machine only through Env.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ferry/device.h"

namespace ferry::device {

PlatformInfo probe_platform(const Env& env, int tool_timeout_ms);
PythonInfo probe_python(const Env& env, const std::string& python, int timeout_ms);

// memlock, /dev/shm, free memory, hugepages and UCX transports for a bucket of `bucket_mb`.
std::vector<Check> sync_checks(const Env& env, std::uint64_t bucket_mb, int tool_timeout_ms);

// CUDA runtime vs driver, NCCL, InfiniBand/GPUDirect RDMA and MIG on an NVIDIA node.
std::vector<Check> nvidia_checks(const Env& env, const PlatformInfo& p, const PythonInfo& py);

// A data file by name from `dir` ("" = the copy compiled in).
Result<std::string> load_data_file(const std::string& dir, std::string_view name);

}  // namespace ferry::device
