// Rank-local delivery: TensorSlice and vLLM's tensor-parallel slices (ferry/vllm_slices.h).
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "ferry/model.h"
#include "ferry/vllm_slices.h"

namespace ferry::python {
namespace {

py::tuple spec_to_python(const TensorSpec& s) {
  return py::make_tuple(s.name, s.dtype, py::tuple(py::cast(s.shape)));
}

// `config`: a preset name, or config.json's text.
std::vector<TensorSlice> vllm_tp_slices(const std::string& config, const py::sequence& specs,
                                        int tp_rank, int tp_size) {
  const model::ModelConfig c = config.starts_with("{")
                                   ? check(model::parse_hf_config(config, "config"))
                                   : check(model::preset(config));
  const std::vector<TensorSpec> manifest = specs_from_python(specs);
  return check(convert::vllm_tp_slices(c, manifest, tp_rank, tp_size));
}

}  // namespace

void bind_rank_local(py::module_& m) {
  py::class_<TensorSlice>(m, "TensorSlice",
                          "One rank's slice of a tensor: the bytes of `whole` that `runs` select, "
                          "laid out as `local` (a Receiver destination; use "
                          "ferry.vllm_tp_slices).")
      .def_property_readonly(
          "name", [](const TensorSlice& s) { return s.whole.name; }, "The tensor's name.")
      .def_property_readonly(
          "whole", [](const TensorSlice& s) { return spec_to_python(s.whole); },
          "(name, dtype, shape) of the tensor the sender sends.")
      .def_property_readonly(
          "local", [](const TensorSlice& s) { return spec_to_python(s.local); },
          "(name, dtype, shape) of this rank's slice.")
      .def_property_readonly(
          "runs",
          [](const TensorSlice& s) {
            py::list runs;
            for (const SliceRun& r : s.runs) {
              runs.append(py::make_tuple(r.slice_offset, r.whole_offset, r.block_bytes, r.count,
                                         r.whole_stride));
            }
            return runs;
          },
          "[(slice_offset, whole_offset, block_bytes, count, whole_stride)]: block i of a run is "
          "the whole tensor's bytes [whole_offset + i * whole_stride, + block_bytes).")
      .def_property_readonly("selected_bytes", &TensorSlice::selected_bytes,
                             "Bytes a receiver copies of this tensor each round.")
      .def("__repr__", [](const TensorSlice& s) {
        return "TensorSlice(" + s.local.to_string() + " of " + s.whole.shape_string() + ", " +
               std::to_string(s.selected_bytes()) + " bytes selected)";
      });
  m.def("vllm_tp_slices", &vllm_tp_slices, py::arg("config"), py::arg("specs"), py::arg("tp_rank"),
        py::arg("tp_size"),
        "vLLM's slices of (name, dtype, shape) specs for tensor-parallel rank `tp_rank` of "
        "`tp_size`; `config` is a preset name or config.json's text (use "
        "ferry.vllm_tp_slices).");
}

}  // namespace ferry::python
