# PE_CHECK_CUDA: optional CUDA Toolkit (default prefix /usr/local/cuda).  --with-cuda[=DIR].
AC_DEFUN([PE_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [CUDA Toolkit prefix (default: auto, /usr/local/cuda)])],
    [], [with_cuda=auto])
  pe_have_cuda=no
  pe_cuda_summary=no
  CUDA_CPPFLAGS=""; CUDA_LIBS=""
  AS_IF([test "x$with_cuda" != xno], [
    pe_cuda_dir=/usr/local/cuda
    AS_CASE([$with_cuda], [yes|auto], [], [pe_cuda_dir="$with_cuda"])
    pe_save_CPPFLAGS="$CPPFLAGS"; pe_save_LIBS="$LIBS"
    CPPFLAGS="$CPPFLAGS -I$pe_cuda_dir/include"
    LIBS="-L$pe_cuda_dir/lib64 -lcudart $LIBS"
    AC_CHECK_HEADER([cuda_runtime_api.h],
      [AC_MSG_CHECKING([for cudaGetDeviceCount in libcudart])
       AC_LINK_IFELSE([AC_LANG_CALL([], [cudaGetDeviceCount])],
         [AC_MSG_RESULT([yes]); pe_have_cuda=yes], [AC_MSG_RESULT([no])])])
    CPPFLAGS="$pe_save_CPPFLAGS"; LIBS="$pe_save_LIBS"
    AS_IF([test "x$pe_have_cuda" = xyes],
      [CUDA_CPPFLAGS="-I$pe_cuda_dir/include"
       CUDA_LIBS="-L$pe_cuda_dir/lib64 -Wl,-rpath,$pe_cuda_dir/lib64 -lcudart"
       pe_cuda_summary="yes ($pe_cuda_dir)"],
      [AS_IF([test "x$with_cuda" = xauto],
         [AC_MSG_WARN([CUDA not found in $pe_cuda_dir: GPU code paths are disabled])],
         [AC_MSG_ERROR([--with-cuda was given but CUDA was not found in $pe_cuda_dir])])])])
  AS_IF([test "x$pe_have_cuda" = xyes], [AC_DEFINE([HAVE_CUDA], [1], [Define to 1 if CUDA is available.])])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$pe_have_cuda" = xyes])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LIBS])
])
