// Platform and environment inspection: what `ferry doctor` and `ferry explain` run.
//
// Every probe goes through an Env, so a test (or a user reproducing a report)
// can point all file reads at a fake root folder and all tools at fake scripts.
// Nothing here needs an accelerator; on a machine without one the report says
// CPU-only and no check fails. docs/doctor.md lists the checks and the rules
// each visible-device mask is parsed by.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.h"
#include "ferry/status.h"

namespace ferry::device {

// ---------------------------------------------------------------------------
// The seam between probes and the machine.

struct ToolResult {
  int exit_code = -1;  // 128 + signal when killed
  bool timed_out = false;
  std::string out;  // stdout, capped at 4 MiB
  std::string err;  // stderr, capped at 4 MiB
};

struct FsSpace {
  std::uint64_t total_bytes = 0;
  std::uint64_t available_bytes = 0;
};

// Files are named as on the probed system ("/dev/davinci0"); an Env decides
// where they really are. Implementations must be safe to call from one thread.
class FERRY_EXPORT Env {
 public:
  virtual ~Env() = default;
  // The probed process environment; nullopt when the variable is unset
  // (an empty value is a value: CUDA treats "" as "no device").
  virtual std::optional<std::string> get_env(std::string_view name) const = 0;
  virtual Result<std::string> read_file(const std::string& path) const = 0;
  virtual bool exists(const std::string& path) const = 0;
  // Entry names (not paths), sorted; not_found when `path` is no folder.
  virtual Result<std::vector<std::string>> list_dir(const std::string& path) const = 0;
  virtual Result<FsSpace> fs_space(const std::string& path) const = 0;
  // Runs argv[0] looked up on get_env("PATH"), killed after `timeout_ms`.
  // not_found when the tool is not on PATH.
  virtual Result<ToolResult> run(const std::vector<std::string>& argv, int timeout_ms) const = 0;
  // Shown in reports: "/" or the fake root.
  virtual std::string root() const = 0;
};

// The real machine, with every file read under `sysroot` ("" or "/" = the
// real root) and tools run from the PATH of this process.
FERRY_EXPORT std::unique_ptr<Env> posix_env(std::string sysroot);
// FERRY_SYSROOT when set, else the real root.
FERRY_EXPORT std::unique_ptr<Env> default_env();

// ---------------------------------------------------------------------------
// Visible-device masks.

enum class MaskKind { kAscend, kCuda, kHip, kRocr };
// "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", ...
FERRY_EXPORT std::string_view mask_variable(MaskKind kind);
// "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", ...
FERRY_EXPORT std::string ray_noset_variable(MaskKind kind);

struct VisibleDevices {
  MaskKind kind = MaskKind::kAscend;
  bool set = false;  // false: the variable is unset and every device is visible
  std::string raw;   // the value as written
  // physical[i] is the physical id behind logical device i (what torch sees as i).
  // -1 for an entry the runtime accepts but ferry cannot resolve (a UUID with no
  // device list to look it up in).
  std::vector<int> physical;
  std::vector<std::string> accepted;  // the entries the runtime reads, in order
  std::string ignored;                // the rest of the value, which the runtime drops
  std::string ignored_reason;         // why the runtime stops reading there
  // A rule the runtime enforces beyond "stop at the first invalid entry"
  // (Ascend: ids must ascend; CUDA/HIP: a repeated id empties the list).
  std::string violation;
  bool hides_all() const { return set && physical.empty(); }
};

// What the mask is parsed against: the physical devices of the node.
// count < 0 means unknown (no range check is possible). uuids[i] belongs to
// physical device i (CUDA "GPU-...", MIG "MIG-..."; ROCm "GPU-...").
struct DeviceInventory {
  int count = -1;
  std::vector<std::string> uuids;
  std::vector<std::string> mig_uuids;  // MIG devices, each "MIG-..."; parent in mig_parent
  std::vector<int> mig_parent;
};

// Parses `value` as the runtime of `kind` does (docs/doctor.md cites each rule).
// Never fails: what the runtime drops is reported in `ignored`.
FERRY_EXPORT VisibleDevices parse_visible_devices(MaskKind kind,
                                                  std::optional<std::string_view> value,
                                                  const DeviceInventory& inventory);

// ---------------------------------------------------------------------------
// Platform facts.

enum class Platform { kCpu, kAscend, kNvidia, kRocm };
FERRY_EXPORT std::string_view platform_name(
    Platform platform);  // "cpu", "ascend", "nvidia", "rocm"

struct Accelerator {
  int id = 0;          // physical id as the vendor tool numbers it
  std::string name;    // "910B3", "NVIDIA H100 80GB HBM3"
  std::string uuid;    // NVIDIA/ROCm only
  std::string health;  // npu-smi's Health column ("OK", "Warning", ...)
  std::uint64_t memory_mb = 0;
};

struct PlatformInfo {
  Platform platform = Platform::kCpu;
  // Hardware seen on the PCI bus, whether or not a driver is loaded.
  int pci_ascend = 0, pci_nvidia = 0, pci_amd = 0;
  std::vector<std::string> device_nodes;  // "/dev/davinci0", "/dev/nvidia0", "/dev/kfd", ...
  std::string driver_version;
  std::string firmware_version;  // Ascend
  // Ascend chip from npu-smi or the PCI device id: "910B" (Atlas A2), "910_93"
  // (Atlas A3), "910", "310P", "310"; "" when unknown. Picks the driver package.
  std::string ascend_chip;
  std::string toolkit_home;     // CANN toolkit folder
  std::string toolkit_version;  // CANN version
  std::string tool;             // "npu-smi", "nvidia-smi", "rocm-smi" ("" for CPU)
  bool tool_found = false;
  bool tool_ok = false;
  std::string tool_error;                 // why the tool failed (its stderr or the timeout)
  std::vector<Accelerator> accelerators;  // from the tool
  DeviceInventory inventory;
};

// Facts read by running the Python the user names; never imported into ferry.
struct PythonInfo {
  bool probed = false;                          // --python was given and ran
  std::string python;                           // the interpreter
  std::string error;                            // why it did not run or its output did not parse
  std::map<std::string, std::string> versions;  // "torch" -> "2.9.0", ... (installed only)
  std::optional<bool> npu_available;            // torch_npu.npu.is_available()
  std::optional<bool> cuda_available;           // torch.cuda.is_available()
  std::optional<int> device_count;              // as torch sees it
  std::string cuda_runtime;                     // torch.version.cuda ("12.8"); "" without CUDA
  std::string nccl_version;                     // torch.cuda.nccl.version() ("2.27.3")
};

// ---------------------------------------------------------------------------
// Checks.

enum class Severity { kOk, kInfo, kWarn, kFail };
FERRY_EXPORT std::string_view severity_name(Severity severity);  // "ok", "info", "warn", "fail"

struct Check {
  std::string id;  // stable, dotted: "ascend.driver", "mask.ascend", "sync.memlock"
  Severity severity = Severity::kOk;
  std::string title;  // what was checked
  std::string seen;   // what was found
  // Exact commands or export lines that fix it, one per entry; empty when ok.
  std::vector<std::string> fix;
};

// One row of the compatibility matrix (data/device/version_matrix.json).
struct VersionSet {
  std::string name;                               // "verl vllm-ascend 0.23 (2026-08)"
  std::string source;                             // where the row comes from
  std::map<std::string, std::string> components;  // "cann" -> "9.1.0", "torch" -> "2.10.0", ...
};

struct VersionVerdict {
  bool checked = false;                 // false when nothing was installed to compare
  const VersionSet* exact = nullptr;    // a row every installed component matches
  const VersionSet* nearest = nullptr;  // the row with the fewest mismatches
  std::vector<std::string> mismatches;  // "torch_npu 2.8.0 (wants 2.9.0)"
};

// Loads the matrix from `data_dir` (see data_path()).
FERRY_EXPORT Result<std::vector<VersionSet>> load_version_matrix(const std::string& data_dir);
// True when `installed` satisfies `wanted` ("2.9.0.post2" satisfies "2.9.0";
// "core_r0.12.1" and "0.12.1" name the same Megatron core).
FERRY_EXPORT bool version_matches(std::string_view wanted, std::string_view installed);
FERRY_EXPORT VersionVerdict check_versions(const std::vector<VersionSet>& matrix,
                                           const std::map<std::string, std::string>& installed);

struct DoctorOptions {
  std::string python;             // interpreter to ask for torch & co.; "" = skip
  int python_timeout_ms = 60000;  // importing torch_npu can take tens of seconds
  int tool_timeout_ms = 15000;
  std::uint64_t bucket_mb = 2048;  // the bucket weight sync will use (verl's default)
  std::string data_dir;            // "" = the default lookup (data_path())
};

struct FERRY_EXPORT Report {
  std::string root;
  PlatformInfo platform;
  std::vector<VisibleDevices> masks;  // the ones that are set or matter here
  PythonInfo python;
  std::vector<Check> checks;
  // True when a check has severity kFail (the exit code is 1 then).
  bool failed() const;
  const Check* find(std::string_view id) const;
};

// Runs every probe and check. Fails only when a data file is unreadable.
FERRY_EXPORT Result<Report> run_doctor(const Env& env, const DoctorOptions& options);

// The three-layer logging set from verl's FAQ for `platform`.
struct DebugVariable {
  std::string layer;  // "framework", "cann", "communication"
  std::string name;
  std::string value;
  std::string effect;  // what it turns on
};
FERRY_EXPORT std::vector<DebugVariable> debug_env(Platform platform);

// ---------------------------------------------------------------------------
// Explaining error messages.

struct Explanation {
  std::string id;  // the pattern's id ("verl.bucket_too_small")
  std::string title;
  std::string matched;  // the line that matched
  std::string cause;
  std::vector<std::string> fix;  // commands or override lines, ready to paste
};

// Recognises known errors in `text` (a log, a traceback) with the patterns in
// `data_dir`/explain_patterns.json. An unknown text gives an empty list.
FERRY_EXPORT Result<std::vector<Explanation>> explain(std::string_view text,
                                                      const std::string& data_dir);

// Where the data files are: `override_dir` if given, else $FERRY_DATA_DIR,
// else <prefix>/share/ferry/device next to the installed binary, else the copy
// compiled into the library ("" is returned for that one: loaders use it).
FERRY_EXPORT std::string data_path(const std::string& override_dir);

}  // namespace ferry::device
