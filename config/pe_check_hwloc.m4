# PE_CHECK_HWLOC(MIN-VERSION): topology discovery (required).
AC_DEFUN([PE_CHECK_HWLOC], [
  PE_PKG_DEP([hwloc], [hwloc], [$1], [hwloc.h], [hwloc_topology_init], [-lhwloc])
])
