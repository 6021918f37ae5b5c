// The _ferry extension module; python/ferry/ is the package users import.
#include <pybind11/pybind11.h>

#include "bindings.h"

PYBIND11_MODULE(_ferry, m) {
  m.doc() = "ferry's C++ core (use the `ferry` package, not this module)";
  m.attr("__version__") = FERRY_VERSION;
  ferry::python::bind_errors(m);
  ferry::python::bind_tensor(m);
  ferry::python::bind_sync(m);
  ferry::python::bind_checkpoint_files(m);
  ferry::python::bind_rank_local(m);
}
