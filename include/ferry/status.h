// Status and Result<T>: how every ferry call reports failure.
//
// A Status is a code plus a message that names what is at fault (the file,
// tensor, peer or field). OK is the default and costs one null pointer.
// No exception crosses the public C++ API; the Python layer turns a non-OK
// Status into an exception carrying the same message.
#pragma once

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "ferry/export.h"

namespace ferry {

// docs/errors.md says what raises each code and whether a caller may retry.
// Wire-stable: the numbers travel in ERROR frames and rank-group messages, so
// a code is only ever appended, never renumbered or reused.
enum class Code : unsigned char {
  kOk = 0,
  kInvalidArgument,     // the caller passed something malformed
  kNotFound,            // a file, tensor or peer that should exist does not
  kAlreadyExists,       // refusing to overwrite
  kCorruption,          // bytes on disk or on the wire fail validation
  kIoError,             // a system call failed (errno in the message)
  kTimeout,             // a peer did not answer in time
  kAborted,             // a round or save was abandoned (peer died, cancelled)
  kUnauthenticated,     // a peer did not prove it knows the session secret
  kResourceExhausted,   // out of memory, disk space, slots
  kFailedPrecondition,  // the call is not valid in the current state
  kUnimplemented,       // not supported by this build or backend
  kInternal,            // a ferry bug: please report
};

// Stable lower-case name of a code ("invalid_argument"), as printed in errors.
FERRY_EXPORT std::string_view code_name(Code code);

class [[nodiscard]] FERRY_EXPORT Status {
 public:
  Status() noexcept = default;  // OK
  Status(Code code, std::string message);

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  bool ok() const { return state_ == nullptr; }
  Code code() const { return state_ ? state_->code : Code::kOk; }
  // Empty when OK.
  const std::string& message() const;
  // "ok" or "<code name>: <message>".
  std::string to_string() const;

  // Returns a copy whose message is "<context>: <message>"; OK stays OK.
  Status with_context(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct State {
    Code code;
    std::string message;
  };
  std::unique_ptr<State> state_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {Code::kNotFound, std::move(m)}; }
inline Status already_exists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
inline Status corruption(std::string m) { return {Code::kCorruption, std::move(m)}; }
inline Status io_error(std::string m) { return {Code::kIoError, std::move(m)}; }
inline Status timeout_error(std::string m) { return {Code::kTimeout, std::move(m)}; }
inline Status aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
inline Status unauthenticated(std::string m) { return {Code::kUnauthenticated, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {Code::kResourceExhausted, std::move(m)}; }
inline Status failed_precondition(std::string m) {
  return {Code::kFailedPrecondition, std::move(m)};
}
inline Status unimplemented(std::string m) { return {Code::kUnimplemented, std::move(m)}; }
inline Status internal_error(std::string m) { return {Code::kInternal, std::move(m)}; }

// A failed system call: "<syscall>(<target>): <strerror(err)>". ENOSPC maps to
// kResourceExhausted, ENOENT to kNotFound, EEXIST to kAlreadyExists, the rest to kIoError.
FERRY_EXPORT Status errno_status(std::string_view syscall, std::string_view target, int err);

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok() && "a Result built from a Status must carry an error");
    if (status_.ok()) status_ = internal_error("Result constructed from an OK status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace ferry
