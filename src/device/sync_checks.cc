// What weight sync needs from the node: locked memory for RDMA registration,
// /dev/shm for verl's shm mode, free memory and hugepages for the buckets, and
// the UCX transports cross-node sync will run over.
#include <cinttypes>
#include <set>

#include "device/probes.h"
#include "device/text_util.h"

namespace ferry::device {
namespace {

constexpr std::uint64_t kMiB = 1024 * 1024;

std::string mib(std::uint64_t bytes) { return std::to_string(bytes / kMiB) + " MiB"; }

// Rounds up to whole GiB for a size users type into --shm-size.
std::string gib_for(std::uint64_t bytes) {
  return std::to_string((bytes + (1ull << 30) - 1) >> 30) + "g";
}

std::optional<std::uint64_t> meminfo_kb(const std::string& text, std::string_view key) {
  auto v = find_key_value(text, key, ':');
  if (!v) return std::nullopt;
  const std::string num = v->substr(0, v->find(' '));
  auto n = parse_uint(num);
  if (!n) return std::nullopt;
  return static_cast<std::uint64_t>(*n);
}

Check memlock_check(const Env& env, std::uint64_t bucket_bytes) {
  Check c{"sync.memlock", Severity::kOk, "locked-memory limit (RDMA registers buckets)", "", {}};
  auto limits = env.read_file("/proc/self/limits");
  if (!limits.ok()) {
    c.severity = Severity::kInfo;
    c.seen = "could not read /proc/self/limits: " + limits.status().message();
    return c;
  }
  for (const std::string& line : split_lines(*limits)) {
    if (line.rfind("Max locked memory", 0) != 0) continue;
    std::vector<std::string> words;
    for (const std::string& w : split(trim(std::string_view(line).substr(17)), ' ')) {
      if (!w.empty()) words.push_back(w);
    }
    if (words.empty()) break;
    if (words[0] == "unlimited") {
      c.seen = "memlock unlimited";
      return c;
    }
    const auto soft = parse_uint(words[0]);
    if (!soft) break;
    const auto soft_bytes = static_cast<std::uint64_t>(*soft);
    c.seen = "memlock soft limit " + mib(soft_bytes) + "; a bucket is " + mib(bucket_bytes);
    if (soft_bytes < bucket_bytes) {
      c.severity = Severity::kWarn;
      c.seen += ": UCX cannot register a whole bucket for RDMA and falls back to slower copies";
      c.fix = {"ulimit -l unlimited",
               "echo '* soft memlock unlimited' | sudo tee -a /etc/security/limits.conf",
               "echo '* hard memlock unlimited' | sudo tee -a /etc/security/limits.conf",
               "# in Docker: docker run --ulimit memlock=-1:-1 ..."};
    }
    return c;
  }
  c.severity = Severity::kInfo;
  c.seen = "no 'Max locked memory' line in /proc/self/limits";
  return c;
}

Check shm_check(const Env& env, std::uint64_t bucket_bytes) {
  Check c{
      "sync.shm", Severity::kOk, "/dev/shm size (verl's shm mode puts each bucket there)", "", {}};
  // verl keeps a bucket in /dev/shm per sender; two leave room for a second job.
  const std::uint64_t want = 2 * bucket_bytes;
  const std::string fix_size = gib_for(want);
  if (!env.exists("/dev/shm")) {
    c.severity = Severity::kWarn;
    c.seen = "/dev/shm is missing";
    c.fix = {
        "sudo mkdir -p /dev/shm && sudo mount -t tmpfs -o size=" + fix_size + " tmpfs /dev/shm",
        "# in Docker: docker run --shm-size=" + fix_size + " ..."};
    return c;
  }
  auto space = env.fs_space("/dev/shm");
  if (!space.ok()) {
    c.severity = Severity::kInfo;
    c.seen = space.status().message();
    return c;
  }
  c.seen = "/dev/shm " + mib(space->available_bytes) + " free of " + mib(space->total_bytes) +
           "; two buckets need " + mib(want);
  if (space->available_bytes < want) {
    c.severity = Severity::kWarn;
    c.fix = {"sudo mount -o remount,size=" + fix_size + " /dev/shm",
             "# in Docker: docker run --shm-size=" + fix_size + " ..."};
  }
  return c;
}

Check memory_check(const std::optional<std::string>& meminfo, std::uint64_t bucket_bytes) {
  Check c{"sync.memory", Severity::kOk, "free host memory for the buckets", "", {}};
  const std::uint64_t want = 2 * bucket_bytes;  // one on each side of a local sync
  const auto avail = meminfo ? meminfo_kb(*meminfo, "MemAvailable") : std::nullopt;
  if (!avail) {
    c.severity = Severity::kInfo;
    c.seen = "MemAvailable not found in /proc/meminfo";
    return c;
  }
  const std::uint64_t bytes = *avail * 1024;
  c.seen = mib(bytes) + " available; sender and receiver buckets need " + mib(want);
  if (bytes < want) {
    c.severity = Severity::kWarn;
    c.fix = {"# use a smaller bucket: ferry streams tensors larger than the bucket in pieces",
             "ferry doctor --bucket-mb " + std::to_string(bucket_bytes / kMiB / 2)};
  }
  return c;
}

Check hugepages_check(const std::optional<std::string>& meminfo, std::uint64_t bucket_bytes) {
  Check c{"sync.hugepages", Severity::kInfo, "hugepages (used only where configured)", "", {}};
  // Plain numbers, not optionals: 0 reads the same as "absent" here.
  const std::uint64_t total = meminfo ? meminfo_kb(*meminfo, "HugePages_Total").value_or(0) : 0;
  const std::uint64_t free = meminfo ? meminfo_kb(*meminfo, "HugePages_Free").value_or(0) : 0;
  const std::uint64_t size_kb =
      meminfo ? meminfo_kb(*meminfo, "Hugepagesize").value_or(2048) : 2048;
  if (total == 0) {
    c.seen = "no hugepages configured; ferry does not need them";
    return c;
  }
  const std::uint64_t page = size_kb * 1024;
  const std::uint64_t free_bytes = free * page;
  c.seen = std::to_string(total) + " hugepages of " + mib(page) + ", " + mib(free_bytes) + " free";
  if (free_bytes < bucket_bytes) {
    c.severity = Severity::kWarn;
    c.seen += "; less than one bucket (" + mib(bucket_bytes) + "): UCX_*_HUGETLB allocations fail";
    const std::uint64_t pages = total + (bucket_bytes - free_bytes + page - 1) / page;
    c.fix = {"echo " + std::to_string(pages) + " | sudo tee /proc/sys/vm/nr_hugepages"};
  } else {
    c.severity = Severity::kOk;
  }
  return c;
}

// Cross-node sync runs on ferry's own TCP path unless FERRY_NET_PATH=ucx (for RDMA): only then
// do UCX's transports matter.
Check ucx_check(const Env& env, int timeout_ms) {
  Check c{"sync.ucx", Severity::kOk, "UCX transports for cross-node sync", "", {}};
  const std::string path = env.get_env("FERRY_NET_PATH").value_or("");
  const bool ucx = path == "ucx";
  if (!path.empty() && path != "tcp" && !ucx) {
    c.severity = Severity::kWarn;
    c.seen = "FERRY_NET_PATH=" + path + ": not 'tcp' or 'ucx'; net sessions will refuse to start";
    c.fix = {"unset FERRY_NET_PATH   # ferry's own TCP path, or: export FERRY_NET_PATH=ucx"};
    return c;
  }
  auto r = env.run({"ucx_info", "-d"}, timeout_ms);
  if (!r.ok() || r->timed_out || r->exit_code != 0) {
    c.severity = ucx ? Severity::kWarn : Severity::kInfo;
    c.seen = !r.ok() ? r.status().message()
                     : (r->timed_out ? "ucx_info -d timed out" : "ucx_info -d failed");
    c.seen += ucx ? "; FERRY_NET_PATH=ucx, and UCX's transports are not checked"
                  : "; not needed: cross-node sync runs on ferry's TCP path (FERRY_NET_PATH unset)";
    c.fix = {"sudo apt-get install ucx-utils   # provides ucx_info"};
    return c;
  }
  std::set<std::string> transports;
  for (const std::string& line : split_lines(r->out)) {
    const std::size_t at = line.find("Transport:");
    if (at != std::string::npos) transports.insert(std::string(trim(line.substr(at + 10))));
  }
  std::vector<std::string> list(transports.begin(), transports.end());
  c.seen = "transports: " + (list.empty() ? std::string("none") : join(list, ", "));
  bool rdma = false;
  for (const std::string& t : transports) {
    if (t.rfind("rc", 0) == 0 || t.rfind("dc", 0) == 0 || t.rfind("ud", 0) == 0) rdma = true;
  }
  if (ucx && !rdma) {
    c.severity = Severity::kWarn;
    c.seen +=
        ": FERRY_NET_PATH=ucx without RDMA, cross-node sync cannot connect (UCX's TCP "
        "transport is left out)";
    c.fix = {"unset FERRY_NET_PATH   # ferry's own TCP path",
             "# or install the RDMA provider (rdma-core)"};
  } else if (!ucx) {
    c.severity = Severity::kInfo;
    c.seen += rdma ? "; cross-node sync runs on ferry's TCP path: FERRY_NET_PATH=ucx moves it "
                     "over RDMA"
                   : "; cross-node sync runs on ferry's TCP path (no RDMA here)";
    if (rdma) c.fix = {"export FERRY_NET_PATH=ucx   # on every node of the job"};
  }
  return c;
}

}  // namespace

std::vector<Check> sync_checks(const Env& env, std::uint64_t bucket_mb, int tool_timeout_ms) {
  const std::uint64_t bucket_bytes = bucket_mb * kMiB;
  std::optional<std::string> meminfo;
  if (auto m = env.read_file("/proc/meminfo"); m.ok()) meminfo = std::move(*m);
  return {memlock_check(env, bucket_bytes), shm_check(env, bucket_bytes),
          memory_check(meminfo, bucket_bytes), hugepages_check(meminfo, bucket_bytes),
          ucx_check(env, tool_timeout_ms)};
}

}  // namespace ferry::device
