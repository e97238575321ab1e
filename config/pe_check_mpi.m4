# PE_CHECK_MPI: optional MPI (Open MPI's mpicc/mpirun), used by tests, benchmarks and the
# DataChannel's mpi transport.  --with-mpi[=DIR], default auto; an explicit request that
# fails is an error, auto that fails disables MPI with a warning.
AC_DEFUN([PE_CHECK_MPI], [
  AC_ARG_WITH([mpi],
    [AS_HELP_STRING([--with-mpi@<:@=DIR@:>@], [use MPI from DIR (default: auto, mpicc in PATH)])],
    [], [with_mpi=auto])
  pe_have_mpi=no
  pe_mpi_summary=no
  MPICC=""; MPIRUN=""; MPI_CPPFLAGS=""; MPI_LIBS=""
  AS_IF([test "x$with_mpi" != xno], [
    pe_mpi_path="$PATH"
    AS_CASE([$with_mpi], [yes|auto], [], [pe_mpi_path="$with_mpi/bin"])
    AC_PATH_PROG([MPICC], [mpicc], [], [$pe_mpi_path])
    AC_PATH_PROG([MPIRUN], [mpirun], [], [$pe_mpi_path])
    AS_IF([test -n "$MPICC"], [
      MPI_CPPFLAGS=`$MPICC --showme:compile 2>/dev/null`
      MPI_LIBS=`$MPICC --showme:link 2>/dev/null`
      pe_save_CPPFLAGS="$CPPFLAGS"; CPPFLAGS="$CPPFLAGS $MPI_CPPFLAGS"
      AC_CHECK_HEADER([mpi.h], [pe_have_mpi=yes], [pe_have_mpi=no])
      CPPFLAGS="$pe_save_CPPFLAGS"])
    AS_IF([test "x$pe_have_mpi" = xyes],
      [pe_mpi_summary="yes ($MPICC)"],
      [AS_IF([test "x$with_mpi" = xauto],
         [AC_MSG_WARN([MPI not found: MPI tests and the mpi transport are disabled])],
         [AC_MSG_ERROR([--with-mpi was given but mpicc/mpi.h were not found])])])])
  AS_IF([test "x$pe_have_mpi" = xyes], [AC_DEFINE([HAVE_MPI], [1], [Define to 1 if MPI is available.])])
  AM_CONDITIONAL([HAVE_MPI], [test "x$pe_have_mpi" = xyes])
  AC_SUBST([MPICC])
  AC_SUBST([MPIRUN])
  AC_SUBST([MPI_CPPFLAGS])
  AC_SUBST([MPI_LIBS])
])
