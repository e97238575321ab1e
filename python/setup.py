"""pip install of pytorch_dc from the source tree, into the environment that has torch:

    pip install --no-build-isolation ./python

It builds the same C++ extension as `make` (csrc/) against an installed libpytorch_dc, found with
`pkg-config pytorch-dc` (after `make install`; set PKG_CONFIG_PATH to PREFIX/lib/pkgconfig).
"""
import subprocess

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension


def pkg_config(flag):
    try:
        out = subprocess.check_output(["pkg-config", flag, "pytorch-dc"], text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit("pytorch_dc: libpytorch_dc not found by pkg-config (make install it "
                         f"first, set PKG_CONFIG_PATH): {e}")
    return out.split()


incs = [f[2:] for f in pkg_config("--cflags-only-I")]
libdirs = [f[2:] for f in pkg_config("--libs-only-L")]
setup(
    name="pytorch_dc",
    version="0.1.0",
    description="DataChannel (libpytorch_dc) as the torch.distributed backend \"dc\"",
    packages=["pytorch_dc"],
    ext_modules=[CppExtension(
        "pytorch_dc._C", ["csrc/backend.cpp", "csrc/work.cpp", "csrc/module.cpp"],
        include_dirs=incs, library_dirs=libdirs, libraries=["pytorch_dc"],
        extra_link_args=[f"-Wl,-rpath,{d}" for d in libdirs])],
    cmdclass={"build_ext": BuildExtension},
)
