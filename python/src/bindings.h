// Shared pieces of the _ferry extension: Status -> exception translation and the
// binders each file contributes. The extension converts types and errors only;
// every behaviour lives in libferry.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>
#include <utility>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::python {

namespace py = pybind11;

// Carries a non-OK Status out of a binding; the translator registered by
// bind_errors() turns it into the ferry exception class for its code.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return status_.message().c_str(); }

 private:
  Status status_;
};

inline void check(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T check(Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

// The Python exception class for `code` (ferry.FerryError for kOk).
py::object exception_class(Code code);

// (name, dtype, shape, memoryview): how a received tensor view reaches Python.
// The memoryview is read-only and valid only while the C++ callback runs.
py::tuple view_to_python(const TensorView& view);

// Reads a shape given as any sequence of ints.
std::vector<std::int64_t> shape_from_python(const py::handle& shape);
// Reads [(name, dtype, shape)], checking each spec.
std::vector<TensorSpec> specs_from_python(const py::sequence& specs);

void bind_errors(py::module_& m);
void bind_tensor(py::module_& m);
void bind_sync(py::module_& m);
void bind_checkpoint_files(py::module_& m);
void bind_rank_local(py::module_& m);

}  // namespace ferry::python
