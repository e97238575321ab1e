# PE_CHECK_GTEST: GoogleTest for `make check` (required).
AC_DEFUN([PE_CHECK_GTEST], [
  PE_PKG_DEP([gtest], [gtest_main], [1.10], [gtest/gtest.h], [], [-lgtest_main -lgtest])
])
