# PE_CHECK_TORCH: optional PyTorch (torch 2.x) for the "dc" torch.distributed backend (python/).
# --with-torch[=PYTHON]: the Python whose torch the extension is built for; default: auto, the
# first of python3 on PATH and the quick start's virtualenv ($PYTORCH_EXEC_VENV, else
# /var/cache/pytorch_exec/venv-torch) that imports torch 2.x.  Builds with torch's include and
# library paths and its _GLIBCXX_USE_CXX11_ABI.  Sets pe_torch_nccl_dir when torch carries the
# nvidia-nccl wheel (site-packages/nvidia/nccl); run before PE_CHECK_NCCL.  HAVE_TORCH_CUDA: that
# torch has CUDA (libtorch_cuda and the c10/cuda headers), so the backend can take CUDA tensors
# where libpytorch_dc also has the GPU path (python/Makefile.am).
AC_DEFUN([PE_CHECK_TORCH], [
  AC_ARG_WITH([torch],
    [AS_HELP_STRING([--with-torch@<:@=PYTHON@:>@],
      [build the torch backend for PYTHON's torch (default: auto)])],
    [], [with_torch=auto])
  pe_have_torch=no
  pe_torch_summary=no
  TORCH_PYTHON=""; TORCH_CPPFLAGS=""; TORCH_LIBS=""; TORCH_PYTHON_VERSION=""
  pe_torch_cuda=no
  pe_torch_nccl_dir=""  # the nvidia-nccl wheel beside torch: the NCCL torch loads (PE_CHECK_NCCL)
  pe_torch_venv="${PYTORCH_EXEC_VENV:-/var/cache/pytorch_exec/venv-torch}"
  AS_CASE([$with_torch],
    [no], [pe_torch_cands=""],
    [yes|auto], [pe_torch_cands="python3 $pe_torch_venv/bin/python"],
    [pe_torch_cands="$with_torch"])
  # One line from torch: version, ABI flag, torch's directory, Python's include dir and version.
  pe_torch_probe='import sys, sysconfig, torch
assert int(torch.__version__.split(".")[[0]]) >= 2, "torch " + torch.__version__ + " is older than 2.0"
print(torch.__version__, int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.__path__[[0]],
      sysconfig.get_paths()[["include"]], "%d.%d" % sys.version_info[[:2]])'
  for pe_py in $pe_torch_cands; do
    AC_MSG_CHECKING([for torch 2.x in $pe_py])
    AS_IF([pe_torch_info=`"$pe_py" -c "$pe_torch_probe" 2>/dev/null`],
      [pe_tver=`echo "$pe_torch_info" | cut -d' ' -f1`
       pe_tabi=`echo "$pe_torch_info" | cut -d' ' -f2`
       pe_tdir=`echo "$pe_torch_info" | cut -d' ' -f3`
       pe_tinc=`echo "$pe_torch_info" | cut -d' ' -f4`
       pe_tpyv=`echo "$pe_torch_info" | cut -d' ' -f5`
       AS_IF([test -f "$pe_tdir/include/torch/csrc/distributed/c10d/Backend.hpp" &&
              test -f "$pe_tinc/Python.h"],
         [AC_MSG_RESULT([$pe_tver])
          pe_have_torch=yes
          TORCH_PYTHON=`command -v "$pe_py"`
          TORCH_PYTHON_VERSION="$pe_tpyv"
          TORCH_CPPFLAGS="-I$pe_tdir/include -I$pe_tdir/include/torch/csrc/api/include -I$pe_tinc"
          TORCH_CPPFLAGS="$TORCH_CPPFLAGS -D_GLIBCXX_USE_CXX11_ABI=$pe_tabi"
          TORCH_LIBS="-L$pe_tdir/lib -Wl,-rpath,$pe_tdir/lib -ltorch_python -ltorch_cpu -ltorch -lc10"
          pe_torch_summary="yes (torch $pe_tver, $TORCH_PYTHON)"
          AS_IF([test -f "$pe_tdir/lib/libtorch_cuda.so" &&
                 test -f "$pe_tdir/include/c10/cuda/CUDAStream.h"],
            [pe_torch_cuda=yes
             pe_torch_summary="yes (torch $pe_tver with CUDA, $TORCH_PYTHON)"])
          AS_IF([test -f "$pe_tdir/../nvidia/nccl/include/nccl.h"],
            [pe_torch_nccl_dir=`cd "$pe_tdir/../nvidia/nccl" && pwd`])
          break],
         [AC_MSG_RESULT([no (no C++ headers or no Python.h)])])],
      [AC_MSG_RESULT([no])])
  done
  AS_IF([test "x$pe_have_torch" = xno && test "x$with_torch" != xno && test "x$with_torch" != xauto],
    [AC_MSG_ERROR([--with-torch=$with_torch: that Python has no torch 2.x with its C++ headers])])
  AS_IF([test "x$pe_have_torch" = xno && test "x$with_torch" = xauto],
    [AC_MSG_WARN([torch 2.x not found: the dc torch backend is not built (see --with-torch)])])
  AM_CONDITIONAL([HAVE_TORCH], [test "x$pe_have_torch" = xyes])
  AM_CONDITIONAL([HAVE_TORCH_CUDA], [test "x$pe_torch_cuda" = xyes])
  AC_SUBST([TORCH_PYTHON])
  AC_SUBST([TORCH_PYTHON_VERSION])
  AC_SUBST([TORCH_CPPFLAGS])
  AC_SUBST([TORCH_LIBS])
])
