# PE_CHECK_FUZZING: libFuzzer targets (tests/fuzz), built with clang++ -fsanitize=fuzzer.
# --enable-fuzzing requires it; the default (auto) builds them when clang++ can, else skips.
AC_DEFUN([PE_CHECK_FUZZING], [
  AC_ARG_ENABLE([fuzzing],
    [AS_HELP_STRING([--enable-fuzzing], [build the libFuzzer targets (default: auto, when clang++ supports -fsanitize=fuzzer)])],
    [], [enable_fuzzing=auto])
  AC_ARG_VAR([FUZZ_CXX], [C++ compiler for the fuzz targets (default: clang++)])
  pe_fuzzing=no
  AS_IF([test "x$enable_fuzzing" != xno], [
    AC_CHECK_PROGS([FUZZ_CXX], [clang++ clang++-14], [])
    AS_IF([test -n "$FUZZ_CXX"], [
      AC_MSG_CHECKING([whether $FUZZ_CXX links -fsanitize=fuzzer,address])
      cat > conftest_fuzz.cpp <<_PE_EOF
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }
_PE_EOF
      AS_IF([$FUZZ_CXX -fsanitize=fuzzer,address conftest_fuzz.cpp -o conftest_fuzz >&AS_MESSAGE_LOG_FD 2>&1],
        [pe_fuzzing=yes], [pe_fuzzing=no])
      rm -f conftest_fuzz.cpp conftest_fuzz
      AC_MSG_RESULT([$pe_fuzzing])])
    AS_IF([test "x$pe_fuzzing" = xno && test "x$enable_fuzzing" = xyes],
      [AC_MSG_ERROR([--enable-fuzzing: no clang++ that links -fsanitize=fuzzer (install clang and libclang-rt-14-dev)])])])
  AM_CONDITIONAL([ENABLE_FUZZING], [test "x$pe_fuzzing" = xyes])
])
