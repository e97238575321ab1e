"""pip install of pytorch_dc from the source tree, into the environment that has torch:

    pip install --no-build-isolation ./python

It builds the same C++ extension as `make` (csrc/) against an installed libpytorch_dc, found with
`pkg-config pytorch-dc` (after `make install`; set PKG_CONFIG_PATH to PREFIX/lib/pkgconfig).
With CUDA support (CUDA tensors, csrc/device.cpp) as `make` builds it: when this torch has CUDA,
the CUDA toolkit is found (CUDA_HOME) and the installed libpytorch_dc has the GPU path (it
links libnccl); PYTORCH_DC_WITH_CUDA=1 or 0 says so instead.
"""
import os
import subprocess

import torch
from torch.utils import cpp_extension

from setuptools import setup


def pkg_config(flag):
    try:
        out = subprocess.check_output(["pkg-config", flag, "pytorch-dc"], text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit("pytorch_dc: libpytorch_dc not found by pkg-config (make install it "
                         f"first, set PKG_CONFIG_PATH): {e}")
    return out.split()


def gpu_path(libdirs):
    """Whether the libpytorch_dc in libdirs has the GPU path: it links NCCL."""
    for d in libdirs:
        lib = os.path.join(d, "libpytorch_dc.so")
        if os.path.exists(lib):
            try:
                out = subprocess.check_output(["readelf", "-d", lib], text=True)
            except (OSError, subprocess.CalledProcessError):
                return False
            return "libnccl" in out
    return False


incs = [f[2:] for f in pkg_config("--cflags-only-I")]
libdirs = [f[2:] for f in pkg_config("--libs-only-L")]
want = os.environ.get("PYTORCH_DC_WITH_CUDA")
cuda = (want == "1" if want in ("0", "1") else
        bool(torch.version.cuda) and bool(cpp_extension.CUDA_HOME) and gpu_path(libdirs))
macros, libs, cflags = [], ["pytorch_dc"], []
if cuda:
    incs.append(os.path.join(cpp_extension.CUDA_HOME, "include"))
    macros.append(("PYTORCH_DC_CUDA", None))
    libs += ["torch_cuda", "c10_cuda"]
    cflags.append("-Wno-interference-size")
setup(
    name="pytorch_dc",
    version="0.1.0",
    description="DataChannel (libpytorch_dc) as the torch.distributed backend \"dc\"",
    packages=["pytorch_dc"],
    ext_modules=[cpp_extension.CppExtension(
        "pytorch_dc._C", ["csrc/backend.cpp", "csrc/work.cpp", "csrc/device.cpp", "csrc/module.cpp"],
        include_dirs=incs, library_dirs=libdirs, libraries=libs, define_macros=macros,
        extra_compile_args=cflags, extra_link_args=[f"-Wl,-rpath,{d}" for d in libdirs])],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
