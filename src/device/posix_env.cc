// The Env that reads the real machine, optionally under a fake root folder.
#include <dirent.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "base/file_util.h"
#include "device/subprocess.h"
#include "ferry/device.h"

namespace ferry::device {
namespace {

class PosixEnv final : public Env {
 public:
  explicit PosixEnv(std::string sysroot) : sysroot_(std::move(sysroot)) {
    while (!sysroot_.empty() && sysroot_.back() == '/') sysroot_.pop_back();
  }

  std::optional<std::string> get_env(std::string_view name) const override {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }

  Result<std::string> read_file(const std::string& path) const override {
    return ferry::read_file(real(path));
  }

  bool exists(const std::string& path) const override {
    return ::access(real(path).c_str(), F_OK) == 0;
  }

  Result<std::vector<std::string>> list_dir(const std::string& path) const override {
    const std::string p = real(path);
    DIR* dir = ::opendir(p.c_str());
    if (dir == nullptr) return errno_status("opendir", p, errno);
    std::vector<std::string> names;
    while (dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
    std::sort(names.begin(), names.end());
    return names;
  }

  Result<FsSpace> fs_space(const std::string& path) const override {
    const std::string p = real(path);
    struct statvfs st {};
    if (::statvfs(p.c_str(), &st) != 0) return errno_status("statvfs", p, errno);
    FsSpace s;
    s.total_bytes = static_cast<std::uint64_t>(st.f_blocks) * st.f_frsize;
    s.available_bytes = static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
    return s;
  }

  Result<ToolResult> run(const std::vector<std::string>& argv, int timeout_ms) const override {
    if (argv.empty()) return invalid_argument("Env::run: empty argv");
    const std::string path_var = get_env("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
    const std::string exe = find_on_path(argv[0], path_var);
    if (exe.empty()) return not_found(argv[0] + " is not on PATH");
    std::vector<std::string> resolved = argv;
    resolved[0] = exe;
    return run_with_timeout(resolved, timeout_ms);
  }

  std::string root() const override { return sysroot_.empty() ? "/" : sysroot_; }

 private:
  std::string real(const std::string& path) const { return sysroot_ + path; }
  std::string sysroot_;
};

}  // namespace

std::unique_ptr<Env> posix_env(std::string sysroot) {
  if (sysroot == "/") sysroot.clear();
  return std::make_unique<PosixEnv>(std::move(sysroot));
}

std::unique_ptr<Env> default_env() {
  const char* root = std::getenv("FERRY_SYSROOT");
  return posix_env(root ? root : "");
}

}  // namespace ferry::device
