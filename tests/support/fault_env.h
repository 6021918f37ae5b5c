// An Env over the real file system that fails writes, fsyncs or renames on demand: a full
// disk or a failing device, without root and without filling anything (leveldb's ErrorEnv).
// Install it with ScopedEnvOverride (base/env.h) around the code under test.
#pragma once

#include <atomic>
#include <cerrno>
#include <mutex>
#include <string>

#include "base/env.h"

namespace ferry::testing {

class FaultEnv : public EnvWrapper {
 public:
  FaultEnv() : EnvWrapper(Env::posix()) {}

  // Write number `nth` (1: the next one) to a file whose name contains `path_part`, counted
  // over every thread, fails with `error`, and so does every later one to such a file (a
  // full disk stays full). The failing write first writes half its bytes, as a disk that
  // fills midway does. write and pwrite count alike.
  void fail_writes_from(int nth, int error = ENOSPC, std::string path_part = "");
  // Every fsync of a file whose name contains `path_part` fails with `error` (not folders).
  void fail_sync(int error = EIO, std::string path_part = "");
  // Every rename onto a path containing `path_part` fails with `error`.
  void fail_rename(int error = EIO, std::string path_part = "");
  // No more faults; the counts stay.
  void heal();

  // Writes (write and pwrite) seen, and faults injected, so far.
  int writes() const { return writes_.load(); }
  int faults() const { return faults_.load(); }

  Status write(int fd, std::span<const std::byte> data, std::string_view what) override;
  Status pwrite(int fd, std::span<const std::byte> data, std::uint64_t offset,
                std::string_view what) override;
  Status sync(int fd, std::string_view what) override;
  Status rename(const std::string& from, const std::string& to) override;

 private:
  struct Rule {
    int error = 0;  // 0: off
    std::string path_part;
  };
  // `rule`'s errno when it applies to `path`, else 0; counts the fault.
  int fault(const Rule& rule, std::string_view path);
  // The errno the next write to `what` fails with, or 0; counts the write.
  int write_error(std::string_view what);

  std::mutex mu_;
  Rule write_rule_, sync_rule_, rename_rule_;
  int write_fails_from_ = 0;  // the number of the first matching write to fail
  int matching_writes_ = 0;
  std::atomic<int> writes_{0};
  std::atomic<int> faults_{0};
};

}  // namespace ferry::testing
