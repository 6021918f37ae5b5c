#include "support/fault_env.h"

#include <utility>

namespace ferry::testing {

void FaultEnv::fail_writes_from(int nth, int error, std::string path_part) {
  std::lock_guard<std::mutex> lock(mu_);
  write_rule_ = {error, std::move(path_part)};
  matching_writes_ = 0;
  write_fails_from_ = nth;
}

void FaultEnv::fail_sync(int error, std::string path_part) {
  std::lock_guard<std::mutex> lock(mu_);
  sync_rule_ = {error, std::move(path_part)};
}

void FaultEnv::fail_rename(int error, std::string path_part) {
  std::lock_guard<std::mutex> lock(mu_);
  rename_rule_ = {error, std::move(path_part)};
}

void FaultEnv::heal() {
  std::lock_guard<std::mutex> lock(mu_);
  write_rule_ = sync_rule_ = rename_rule_ = {};
}

int FaultEnv::fault(const Rule& rule, std::string_view path) {
  if (rule.error == 0 || path.find(rule.path_part) == std::string_view::npos) return 0;
  ++faults_;
  return rule.error;
}

int FaultEnv::write_error(std::string_view what) {
  ++writes_;
  std::lock_guard<std::mutex> lock(mu_);
  if (write_rule_.error == 0 || what.find(write_rule_.path_part) == std::string_view::npos) {
    return 0;
  }
  if (++matching_writes_ < write_fails_from_) return 0;
  return fault(write_rule_, what);
}

Status FaultEnv::write(int fd, std::span<const std::byte> data, std::string_view what) {
  if (const int err = write_error(what); err != 0) {
    (void)target().write(fd, data.first(data.size() / 2), what);
    return errno_status("write", what, err);
  }
  return target().write(fd, data, what);
}

Status FaultEnv::pwrite(int fd, std::span<const std::byte> data, std::uint64_t offset,
                        std::string_view what) {
  if (const int err = write_error(what); err != 0) {
    (void)target().pwrite(fd, data.first(data.size() / 2), offset, what);
    return errno_status("pwrite", what, err);
  }
  return target().pwrite(fd, data, offset, what);
}

Status FaultEnv::sync(int fd, std::string_view what) {
  int err = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    err = fault(sync_rule_, what);
  }
  if (err != 0) return errno_status("fsync", what, err);
  return target().sync(fd, what);
}

Status FaultEnv::rename(const std::string& from, const std::string& to) {
  int err = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    err = fault(rename_rule_, to);
  }
  if (err != 0) return errno_status("rename", to, err);
  return target().rename(from, to);
}

}  // namespace ferry::testing
