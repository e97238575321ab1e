# PE_CHECK_SPDLOG: logging (required).  Debian's spdlog is compiled and uses external fmt.
AC_DEFUN([PE_CHECK_SPDLOG], [
  PE_PKG_DEP([spdlog], [spdlog], [1.5], [spdlog/spdlog.h], [], [-lspdlog -lfmt])
])
