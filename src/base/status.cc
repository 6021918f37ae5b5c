#include "ferry/status.h"

#include <cerrno>
#include <cstring>
#include <string>

namespace ferry {

std::string_view code_name(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid_argument";
    case Code::kNotFound:
      return "not_found";
    case Code::kAlreadyExists:
      return "already_exists";
    case Code::kCorruption:
      return "corruption";
    case Code::kIoError:
      return "io_error";
    case Code::kTimeout:
      return "timeout";
    case Code::kAborted:
      return "aborted";
    case Code::kUnauthenticated:
      return "unauthenticated";
    case Code::kResourceExhausted:
      return "resource_exhausted";
    case Code::kFailedPrecondition:
      return "failed_precondition";
    case Code::kUnimplemented:
      return "unimplemented";
    case Code::kInternal:
      return "internal";
  }
  return "unknown";
}

Status::Status(Code code, std::string message) {
  if (code != Code::kOk) state_ = std::make_unique<State>(State{code, std::move(message)});
}

Status::Status(const Status& other)
    : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
  return *this;
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string out(code_name(state_->code));
  out += ": ";
  out += state_->message;
  return out;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return Status();
  std::string m(context);
  m += ": ";
  m += state_->message;
  return Status(state_->code, std::move(m));
}

Status errno_status(std::string_view syscall, std::string_view target, int err) {
  std::string m(syscall);
  m += "(";
  m += target;
  m += "): ";
  m += std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return resource_exhausted(std::move(m));
    case ENOENT:
      return not_found(std::move(m));
    case EEXIST:
      return already_exists(std::move(m));
    default:
      return io_error(std::move(m));
  }
}

}  // namespace ferry
