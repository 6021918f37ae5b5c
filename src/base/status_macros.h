// Early returns on error, written once (as absl's RETURN_IF_ERROR / ASSIGN_OR_RETURN).
// Internal only: macros in include/ferry/ would leak into every user's code.
#pragma once

#include <utility>

#include "ferry/status.h"

// Evaluates `expr` (a Status, or a Result whose value is unused) once; returns its Status
// from the calling function when it is an error.
#define FERRY_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                  \
    if (auto ferry_status_ = ::ferry::internal::status_of(expr); !ferry_status_.ok()) { \
      return ferry_status_;                                                             \
    }                                                                                   \
  } while (false)

// `FERRY_ASSIGN_OR_RETURN(auto x, make_x());` declares (or assigns) `x` from a Result's
// value, or returns the Result's Status from the calling function.
#define FERRY_ASSIGN_OR_RETURN(lhs, expr) \
  FERRY_ASSIGN_OR_RETURN_IMPL_(FERRY_STATUS_CONCAT_(ferry_result_, __LINE__), lhs, expr)

#define FERRY_ASSIGN_OR_RETURN_IMPL_(result, lhs, expr) \
  auto result = (expr);                                 \
  if (!result.ok()) return result.status();             \
  lhs = std::move(result).value()

#define FERRY_STATUS_CONCAT_(a, b) FERRY_STATUS_CONCAT_INNER_(a, b)
#define FERRY_STATUS_CONCAT_INNER_(a, b) a##b

namespace ferry::internal {

inline Status status_of(Status s) { return s; }
template <typename T>
Status status_of(const Result<T>& r) {
  return r.status();
}

}  // namespace ferry::internal
