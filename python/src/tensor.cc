// DType, the shape and view conversions, and the model presets (tensor lists of
// real architectures, used by the benchmark and tests).
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "ferry/model.h"

namespace ferry::python {

std::vector<std::int64_t> shape_from_python(const py::handle& shape) {
  std::vector<std::int64_t> out;
  for (const py::handle& dim : shape) out.push_back(dim.cast<std::int64_t>());
  return out;
}

std::vector<TensorSpec> specs_from_python(const py::sequence& specs) {
  std::vector<TensorSpec> manifest;
  manifest.reserve(specs.size());
  for (const py::handle& item : specs) {
    const auto t = item.cast<py::tuple>();
    if (t.size() != 3) throw StatusError(invalid_argument("a spec is (name, dtype, shape)"));
    manifest.push_back(check(
        TensorSpec::make(t[0].cast<std::string>(), t[1].cast<DType>(), shape_from_python(t[2]))));
  }
  return manifest;
}

py::tuple view_to_python(const TensorView& view) {
  py::tuple shape(view.spec.shape.size());
  for (std::size_t i = 0; i < view.spec.shape.size(); ++i) shape[i] = view.spec.shape[i];
  return py::make_tuple(
      view.spec.name, view.spec.dtype, std::move(shape),
      py::memoryview::from_memory(view.data.data(), static_cast<py::ssize_t>(view.data.size())));
}

namespace {

py::list specs_to_python(const std::vector<TensorSpec>& specs) {
  py::list out;
  for (const TensorSpec& s : specs) out.append(py::make_tuple(s.name, s.dtype, s.shape));
  return out;
}

}  // namespace

void bind_tensor(py::module_& m) {
  py::enum_<DType> dtype(m, "DType", "Every safetensors dtype; values travel on the wire.");
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto d = static_cast<DType>(i);
    dtype.value(std::string(dtype_name(d)).c_str(), d);
  }
  dtype
      .def_property_readonly(
          "bits", [](DType d) { return dtype_bits(d); }, "Bits of one element.")
      .def_property_readonly(
          "safetensors_name", [](DType d) { return std::string(dtype_name(d)); },
          "The name in safetensors headers, e.g. 'BF16'.")
      .def_property_readonly(
          "torch_name", [](DType d) { return std::string(dtype_torch_name(d)); },
          "The torch dtype's name, e.g. 'torch.bfloat16'.");

  m.def(
      "parse_dtype", [](const std::string& text) { return check(parse_dtype(text)); },
      py::arg("text"), "A DType from 'BF16', 'torch.bfloat16', 'bf16', ...");
  m.def(
      "tensor_bytes",
      [](DType d, const py::sequence& shape) {
        return check(TensorSpec::make("tensor", d, shape_from_python(shape))).bytes();
      },
      py::arg("dtype"), py::arg("shape"), "Bytes of a tensor of that dtype and shape.");

  m.def("preset_names", &model::preset_names,
        "Names of the model presets hf_tensor_specs() knows (e.g. 'qwen2.5-7b').");
  m.def(
      "hf_tensor_specs",
      [](const std::string& preset, DType d) {
        return specs_to_python(model::hf_tensor_specs(check(model::preset(preset)), d));
      },
      py::arg("preset"), py::arg("dtype") = DType::kBF16,
      "[(name, dtype, shape)] of a preset model's Hugging Face checkpoint, in HF order.");
}

}  // namespace ferry::python
