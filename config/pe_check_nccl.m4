# PE_CHECK_NCCL: optional NCCL (needs CUDA; default prefix: the CUDA prefix).  --with-nccl[=DIR].
AC_DEFUN([PE_CHECK_NCCL], [
  AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@], [NCCL prefix (default: auto, the CUDA prefix)])],
    [], [with_nccl=auto])
  pe_have_nccl=no
  pe_nccl_summary=no
  NCCL_CPPFLAGS=""; NCCL_LIBS=""
  AS_IF([test "x$with_nccl" != xno && test "x$pe_have_cuda" != xyes && test "x$with_nccl" != xauto],
    [AC_MSG_ERROR([--with-nccl needs CUDA (see --with-cuda)])])
  AS_IF([test "x$with_nccl" != xno && test "x$pe_have_cuda" = xyes], [
    pe_nccl_dir="$pe_cuda_dir"
    AS_CASE([$with_nccl], [yes|auto], [], [pe_nccl_dir="$with_nccl"])
    pe_save_CPPFLAGS="$CPPFLAGS"; pe_save_LIBS="$LIBS"
    CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS -I$pe_nccl_dir/include"
    LIBS="-L$pe_nccl_dir/lib64 -L$pe_nccl_dir/lib -lnccl $CUDA_LIBS $LIBS"
    AC_CHECK_HEADER([nccl.h],
      [AC_MSG_CHECKING([for ncclGetVersion in libnccl])
       AC_LINK_IFELSE([AC_LANG_CALL([], [ncclGetVersion])],
         [AC_MSG_RESULT([yes]); pe_have_nccl=yes], [AC_MSG_RESULT([no])])])
    CPPFLAGS="$pe_save_CPPFLAGS"; LIBS="$pe_save_LIBS"
    AS_IF([test "x$pe_have_nccl" = xyes],
      [NCCL_CPPFLAGS="-I$pe_nccl_dir/include"
       NCCL_LIBS="-L$pe_nccl_dir/lib64 -L$pe_nccl_dir/lib -Wl,-rpath,$pe_nccl_dir/lib64 -lnccl"
       pe_nccl_summary="yes ($pe_nccl_dir)"],
      [AS_IF([test "x$with_nccl" = xauto],
         [AC_MSG_WARN([NCCL not found: the nccl transport is disabled])],
         [AC_MSG_ERROR([--with-nccl was given but NCCL was not found in $pe_nccl_dir])])])])
  AS_IF([test "x$pe_have_nccl" = xyes], [AC_DEFINE([HAVE_NCCL], [1], [Define to 1 if NCCL is available.])])
  AM_CONDITIONAL([HAVE_NCCL], [test "x$pe_have_nccl" = xyes])
  AC_SUBST([NCCL_CPPFLAGS])
  AC_SUBST([NCCL_LIBS])
])
