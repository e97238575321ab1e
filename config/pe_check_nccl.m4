# PE_CHECK_NCCL: optional NCCL (needs CUDA).  --with-nccl[=DIR].
# DIR (or, without it, each candidate in turn) is a prefix with include/nccl.h and libnccl in
# lib64/, lib/ or lib/<multiarch>/; the library may be only libnccl.so.2 (the nvidia-nccl wheel's
# layout, site-packages/nvidia/nccl/{include,lib}), which is then linked by file name.
# Candidates without DIR: the NCCL of the torch that PE_CHECK_TORCH found (so that the GPU path
# and torch load one NCCL), the CUDA prefix, /usr.  Run after PE_CHECK_CUDA and PE_CHECK_TORCH.
# Sets NCCL_CPPFLAGS, NCCL_LIBS, HAVE_NCCL and pe_nccl_summary.
AC_DEFUN([PE_CHECK_NCCL], [
  AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@],
      [NCCL prefix (default: auto: the NCCL of the torch found, the CUDA prefix, /usr)])],
    [], [with_nccl=auto])
  pe_have_nccl=no
  pe_nccl_summary=no
  NCCL_CPPFLAGS=""; NCCL_LIBS=""; NCCL_LIBDIR=""
  AS_IF([test "x$with_nccl" != xno && test "x$with_nccl" != xauto && test "x$pe_have_cuda" != xyes],
    [AC_MSG_ERROR([--with-nccl needs CUDA (see --with-cuda)])])
  AS_CASE([$with_nccl],
    [no], [pe_nccl_cands=""],
    [yes|auto], [pe_nccl_cands="$pe_torch_nccl_dir $pe_cuda_dir /usr"],
    [pe_nccl_cands="$with_nccl"])
  AS_IF([test "x$pe_have_cuda" != xyes], [pe_nccl_cands=""])
  pe_multiarch=`$CXX -print-multiarch 2>/dev/null`
  for pe_d in $pe_nccl_cands; do
    test -f "$pe_d/include/nccl.h" || continue
    pe_nccl_lib=""
    for pe_l in "$pe_d/lib64" "$pe_d/lib" "$pe_d/lib/$pe_multiarch"; do
      AS_IF([test -e "$pe_l/libnccl.so"], [pe_nccl_lib="$pe_l"; pe_nccl_l="-lnccl"; break])
      AS_IF([test -e "$pe_l/libnccl.so.2"], [pe_nccl_lib="$pe_l"; pe_nccl_l="-l:libnccl.so.2"; break])
    done
    test -n "$pe_nccl_lib" || continue
    pe_save_CPPFLAGS="$CPPFLAGS"; pe_save_LIBS="$LIBS"
    CPPFLAGS="$CPPFLAGS -I$pe_d/include $CUDA_CPPFLAGS"  # before CUDA's: it may hold an nccl.h too
    LIBS="-L$pe_nccl_lib $pe_nccl_l $CUDA_LIBS $LIBS"
    AC_MSG_CHECKING([for ncclCommInitRank in $pe_nccl_lib])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]],
        [[ncclComm_t c; ncclUniqueId id; int v = 0;
          ncclGetVersion(&v); ncclGetUniqueId(&id); return ncclCommInitRank(&c, 1, id, 0) ? 1 : 0;]])],
      [AC_MSG_RESULT([yes]); pe_have_nccl=yes], [AC_MSG_RESULT([no])])
    AS_IF([test "x$pe_have_nccl" = xyes],
      [AC_COMPUTE_INT([pe_nccl_code], [NCCL_VERSION_CODE], [[#include <nccl.h>]], [pe_nccl_code=0])])
    CPPFLAGS="$pe_save_CPPFLAGS"; LIBS="$pe_save_LIBS"
    AS_IF([test "x$pe_have_nccl" = xyes], [pe_nccl_dir="$pe_d"; break])
  done
  AS_IF([test "x$pe_have_nccl" = xyes],
    [NCCL_CPPFLAGS="-I$pe_nccl_dir/include"
     NCCL_LIBDIR="$pe_nccl_lib"
     NCCL_LIBS="-L$pe_nccl_lib -Wl,-rpath,$pe_nccl_lib $pe_nccl_l"
     pe_nccl_ver="$(( pe_nccl_code / 10000 )).$(( pe_nccl_code / 100 % 100 )).$(( pe_nccl_code % 100 ))"
     pe_nccl_which=""
     AS_IF([test -n "$pe_torch_nccl_dir"],
       [AS_IF([test "x$pe_nccl_dir" = "x$pe_torch_nccl_dir"],
          [pe_nccl_which="the one torch loads, "],
          [AC_MSG_WARN([NCCL in $pe_nccl_dir is not the one torch loads ($pe_torch_nccl_dir): a process that uses both loads two NCCLs])
           pe_nccl_which="NOT the one torch loads, "])])
     pe_nccl_summary="yes (NCCL $pe_nccl_ver, $pe_nccl_which$pe_nccl_lib)"],
    [AS_IF([test "x$with_nccl" = xauto || test "x$with_nccl" = xno],
       [AS_IF([test "x$with_nccl" = xauto && test "x$pe_have_cuda" = xyes],
          [AC_MSG_WARN([NCCL not found (looked in: $pe_nccl_cands): the GPU path is not built])])],
       [AC_MSG_ERROR([--with-nccl=$with_nccl: no usable NCCL (include/nccl.h and libnccl.so or libnccl.so.2 in lib64/ or lib/) there])])])
  AS_IF([test "x$pe_have_nccl" = xyes], [AC_DEFINE([HAVE_NCCL], [1], [Define to 1 if NCCL is available.])])
  AM_CONDITIONAL([HAVE_NCCL], [test "x$pe_have_nccl" = xyes])
  # The GPU path of libpytorch_dc needs both.
  AS_IF([test "x$pe_have_cuda" = xyes && test "x$pe_have_nccl" = xyes],
    [pe_gpu_path_summary="yes (src/dc/gpu, -Werror)"],
    [pe_gpu_path_summary="no (needs CUDA and NCCL)"])
  AM_CONDITIONAL([HAVE_GPU_PATH], [test "x$pe_have_cuda" = xyes && test "x$pe_have_nccl" = xyes])
  AC_SUBST([NCCL_CPPFLAGS])
  AC_SUBST([NCCL_LIBS])
  AC_SUBST([NCCL_LIBDIR])
])
