# PE_CHECK_PMIX(MIN-VERSION): the PMIx server library (required).
AC_DEFUN([PE_CHECK_PMIX], [
  PE_PKG_DEP([pmix], [pmix], [$1], [pmix_server.h], [PMIx_server_init], [-lpmix])
])
