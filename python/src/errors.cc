// ferry.FerryError and one subclass per Status code. Each also derives from the
// builtin exception a Python caller would expect (ValueError for invalid_argument,
// TimeoutError for timeout, ...), so `except ValueError` keeps working.
#include <array>

#include "bindings.h"

namespace ferry::python {
namespace {

struct ClassInfo {
  Code code;
  const char* name;
  PyObject* builtin;  // second base, or nullptr
  const char* doc;
};

constexpr int kCodes = static_cast<int>(Code::kInternal) + 1;
std::array<PyObject*, kCodes> classes{};  // owned for the life of the interpreter

}  // namespace

py::object exception_class(Code code) {
  PyObject* cls = classes[static_cast<int>(code)];
  return py::reinterpret_borrow<py::object>(cls != nullptr ? cls : classes[0]);
}

void bind_errors(py::module_& m) {
  const std::string module = py::str(m.attr("__name__"));
  PyObject* base = PyErr_NewExceptionWithDoc(
      (module + ".FerryError").c_str(),
      "A ferry call failed; `code` is the Status code name, str() the message.", PyExc_Exception,
      nullptr);
  classes[0] = base;
  m.add_object("FerryError", py::reinterpret_borrow<py::object>(base));
  const ClassInfo infos[] = {
      {Code::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError,
       "An argument is wrong (the message names it); also a ValueError."},
      {Code::kNotFound, "NotFoundError", PyExc_LookupError,
       "A file, tensor or peer does not exist; also a LookupError."},
      {Code::kAlreadyExists, "AlreadyExistsError", nullptr,
       "Refused to overwrite something that exists."},
      {Code::kCorruption, "CorruptionError", nullptr,
       "Bytes on disk or on the wire failed validation (checksum, MAC, format)."},
      {Code::kIoError, "IoError", PyExc_OSError,
       "A file or socket operation failed; also an OSError."},
      {Code::kTimeout, "TimeoutError", PyExc_TimeoutError,
       "A peer did not answer in time; also the builtin TimeoutError."},
      {Code::kAborted, "AbortedError", nullptr,
       "The session broke: a peer failed or left, or the wait was interrupted."},
      {Code::kUnauthenticated, "UnauthenticatedError", PyExc_PermissionError,
       "A peer's token or MAC did not match; also a PermissionError."},
      {Code::kResourceExhausted, "ResourceExhaustedError", nullptr,
       "Memory, disk or a configured limit ran out."},
      {Code::kFailedPrecondition, "FailedPreconditionError", PyExc_RuntimeError,
       "The call does not fit the object's state; also a RuntimeError."},
      {Code::kUnimplemented, "UnimplementedError", PyExc_NotImplementedError,
       "Not supported by this build or backend; also a NotImplementedError."},
      {Code::kInternal, "InternalError", PyExc_RuntimeError,
       "A ferry bug (please report it); also a RuntimeError."},
  };
  for (const ClassInfo& info : infos) {
    py::tuple bases = info.builtin != nullptr
                          ? py::tuple(py::make_tuple(py::handle(base), py::handle(info.builtin)))
                          : py::tuple(py::make_tuple(py::handle(base)));
    PyObject* cls = PyErr_NewExceptionWithDoc((module + "." + info.name).c_str(), info.doc,
                                              bases.ptr(), nullptr);
    if (cls == nullptr) throw py::error_already_set();
    classes[static_cast<int>(info.code)] = cls;
    m.add_object(info.name, py::reinterpret_borrow<py::object>(cls));
  }
  m.def(
      "code_name", [](int code) { return std::string(code_name(static_cast<Code>(code))); },
      py::arg("code"), "The name of a Status code number, e.g. 'invalid_argument'.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object cls = exception_class(e.status().code());
      py::object exc = cls(e.status().message());
      exc.attr("code") = std::string(code_name(e.status().code()));
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

}  // namespace ferry::python
