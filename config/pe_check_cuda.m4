# PE_CHECK_CUDA: optional CUDA Toolkit.  --with-cuda[=DIR].  Without DIR the prefix is the first
# of $CUDA_HOME, $CUDA_PATH, the directory above the bin/ of `nvcc` on PATH, and /usr/local/cuda
# that has include/cuda_runtime_api.h.  Needs the runtime's headers and libcudart (nvcc itself is
# not used to build: the GPU code is host C++ over the runtime API).  Sets CUDA_CPPFLAGS,
# CUDA_LIBS, HAVE_CUDA, pe_cuda_dir and pe_cuda_summary.
AC_DEFUN([PE_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@],
      [CUDA Toolkit prefix (default: auto: $CUDA_HOME, $CUDA_PATH, nvcc on PATH, /usr/local/cuda)])],
    [], [with_cuda=auto])
  pe_have_cuda=no
  pe_cuda_summary=no
  pe_cuda_dir=""
  CUDA_CPPFLAGS=""; CUDA_LIBS=""
  AS_CASE([$with_cuda],
    [no], [pe_cuda_cands=""],
    [yes|auto],
      [AC_PATH_PROG([NVCC], [nvcc], [], [$PATH$PATH_SEPARATOR/usr/local/cuda/bin])
       pe_cuda_cands="$CUDA_HOME $CUDA_PATH"
       AS_IF([test -n "$NVCC"], [pe_cuda_cands="$pe_cuda_cands `dirname \`dirname $NVCC\``"])
       pe_cuda_cands="$pe_cuda_cands /usr/local/cuda"],
    [pe_cuda_cands="$with_cuda"])
  for pe_d in $pe_cuda_cands; do
    AS_IF([test -f "$pe_d/include/cuda_runtime_api.h"], [pe_cuda_dir="$pe_d"; break])
  done
  AS_IF([test -n "$pe_cuda_dir"], [
    pe_cuda_libdir="$pe_cuda_dir/lib64"
    AS_IF([test -d "$pe_cuda_libdir"], [], [pe_cuda_libdir="$pe_cuda_dir/lib"])
    pe_save_CPPFLAGS="$CPPFLAGS"; pe_save_LIBS="$LIBS"
    CPPFLAGS="$CPPFLAGS -I$pe_cuda_dir/include"
    LIBS="-L$pe_cuda_libdir -lcudart $LIBS"
    AC_MSG_CHECKING([for cudaGetDeviceCount in libcudart ($pe_cuda_dir)])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime_api.h>]],
                                    [[int n = 0; return cudaGetDeviceCount(&n) == cudaSuccess ? 0 : 1;]])],
      [AC_MSG_RESULT([yes]); pe_have_cuda=yes], [AC_MSG_RESULT([no])])
    AS_IF([test "x$pe_have_cuda" = xyes],
      [AC_COMPUTE_INT([pe_cudart_version], [CUDART_VERSION], [[#include <cuda_runtime_api.h>]],
         [pe_cudart_version=0])])
    CPPFLAGS="$pe_save_CPPFLAGS"; LIBS="$pe_save_LIBS"])
  AS_IF([test "x$pe_have_cuda" = xyes],
    [CUDA_CPPFLAGS="-I$pe_cuda_dir/include"
     CUDA_LIBS="-L$pe_cuda_libdir -Wl,-rpath,$pe_cuda_libdir -lcudart"
     pe_cuda_summary="yes (CUDA runtime $(( pe_cudart_version / 1000 )).$(( pe_cudart_version % 1000 / 10 )), $pe_cuda_dir)"],
    [AS_IF([test "x$with_cuda" = xauto || test "x$with_cuda" = xno],
       [AS_IF([test "x$with_cuda" = xauto],
          [AC_MSG_WARN([CUDA not found (looked in:$pe_cuda_cands): the GPU path is not built])])],
       [AC_MSG_ERROR([--with-cuda=$with_cuda: no usable CUDA runtime (include/cuda_runtime_api.h and libcudart) there])])])
  AS_IF([test "x$pe_have_cuda" = xyes], [AC_DEFINE([HAVE_CUDA], [1], [Define to 1 if CUDA is available.])])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$pe_have_cuda" = xyes])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LIBS])
])
