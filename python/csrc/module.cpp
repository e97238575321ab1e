// pytorch_dc._C: the Python binding of DcBackend, a subclass of torch's c10d Backend, which
// pytorch_dc/__init__.py registers as the "dc" backend of torch.distributed.
#include <pybind11/chrono.h>
#include <torch/python.h>

#include "backend.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "DataChannel (libpytorch_dc) as the torch.distributed backend \"dc\"";
  py::module::import("torch.distributed");  // registers c10d's Backend and Store types
  py::class_<pytorch_dc::DcBackend, c10d::Backend, c10::intrusive_ptr<pytorch_dc::DcBackend>>(
      m, "DcBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<pytorch_dc::DcBackend>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("describe", &pytorch_dc::DcBackend::describe);
  // Whether "dc" takes CUDA tensors: this build has CUDA support, libpytorch_dc the GPU path, and
  // PYTORCH_DC_CUDA is not 0 (__init__.py registers it for "cuda" then).
  m.def("cuda_support", &pytorch_dc::cuda_support);
  // For the atexit handler (__init__.py): every backend's queued work done, callbacks included.
  m.def("_drain", &pytorch_dc::DcBackend::drain_all, py::call_guard<py::gil_scoped_release>());
  // The check every collective makes of its tensors' devices, on a device by name ("cuda:0"),
  // so that tests without a GPU see its errors: the device, or ValueError naming `what`.
  m.def("_device_of", [](const std::string& what, const std::string& device) {
    return pytorch_dc::checked_device(at::Device(device), what.c_str()).str();
  });
}
