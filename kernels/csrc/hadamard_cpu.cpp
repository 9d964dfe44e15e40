// CPU entry points of the fast Walsh-Hadamard transform (chapter 5,
// chapters/05_lookupffn.ipynb), used by kernels/hadamard.py: fwht (rows of a (rows, d)
// tensor) and fwht_plain (the same for a plain tensor, checked here instead of in Python).
// The row kernels are in fwht.h (their design is explained there); lookup_cpu.cpp builds
// the extension module and registers these through register_hadamard.
//
// Built by kernels/_ext.py with torch.utils.cpp_extension.load, together with
// lookup_cpu.cpp; kernels/hadamard.py validates every argument with messages that name it
// before any of this runs, and the entry points check again (NNK_ARG, common.h).

#include "fwht.h"

namespace {

torch::Tensor fwht_cpu(const torch::Tensor& x, bool normalized) {
  // x: (rows, d) contiguous float32/float64 on the CPU, d a power of two.
  check_float_cpu(x, "x", 2);
  const int64_t rows = x.size(0), d = x.size(1);
  NNK_ARG(power_of_two(d), "x must have a power-of-two number of columns, got ", d);
  auto out = empty_output_like(x);
  if (rows == 0) return out;
  if (x.scalar_type() == torch::kFloat) {
    const float scale = normalized ? float(1.0 / std::sqrt(double(d))) : 1.0f;
    fwht_rows<float>(x.data_ptr<float>(), out.data_ptr<float>(), rows, d, scale);
  } else {
    const double scale = normalized ? 1.0 / std::sqrt(double(d)) : 1.0;
    fwht_rows<double>(x.data_ptr<double>(), out.data_ptr<double>(), rows, d, scale);
  }
  return out;
}

// fwht_cpu for the common call, with its checks here instead of in Python: a plain
// torch.Tensor (no autograd) that is a contiguous (rows, d) float32/float64 CPU array with
// d a power of two. Anything else returns None, and kernels.hadamard.fwht then runs its
// full checks (which raise the errors naming the argument) and the general path. Saves a
// microsecond of Python per call, which at batch 1 is as much as the transform itself.
pybind11::object fwht_plain(const pybind11::handle& obj, bool normalized) {
  if (!THPVariable_CheckExact(obj.ptr())) return pybind11::none();
  const at::Tensor& x = THPVariable_Unpack(obj.ptr());
  const auto dtype = x.scalar_type();
  if (!x.defined() || x.layout() != c10::kStrided || !x.device().is_cpu() || x.dim() != 2 ||
      x.requires_grad() || (dtype != torch::kFloat && dtype != torch::kDouble) ||
      !power_of_two(x.size(1)) || !x.is_contiguous())
    return pybind11::none();
  return pybind11::reinterpret_steal<pybind11::object>(THPVariable_Wrap(fwht_cpu(x, normalized)));
}
}  // namespace

void register_hadamard(pybind11::module_& m) {
  m.def("fwht", &fwht_cpu, "Walsh-Hadamard transform of the rows of a (rows, d) tensor",
        pybind11::arg("x"), pybind11::arg("normalized"));
  m.def("fwht_plain", &fwht_plain, "fwht for a plain contiguous 2-D float CPU tensor, else None",
        pybind11::arg("x"), pybind11::arg("normalized"));
}
