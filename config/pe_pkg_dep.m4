# PE_PKG_DEP(NAME, PKG-MODULE, MIN-VERSION, HEADER, FUNCTION-OR-EMPTY, LIBS)
# Shared body for required dependencies: --with-NAME[=DIR] selects a prefix; pkg-config is
# tried first, then DIR/include and DIR/lib.  Sets NAME_CPPFLAGS, NAME_LIBS and HAVE_NAME,
# records the version in pe_NAME_version, and fails configure when the dependency is missing
# or too old (every caller of this macro is a hard requirement).
AC_DEFUN([PE_PKG_DEP], [
  m4_pushdef([UP], m4_toupper([$1]))
  AC_ARG_WITH([$1],
    [AS_HELP_STRING([--with-$1=DIR], [prefix of $1 (default: found with pkg-config)])],
    [], [with_$1=yes])
  AS_IF([test "x$with_$1" = xno], [AC_MSG_ERROR([$1 is required; --without-$1 is not possible])])
  pe_$1_version=""
  AS_IF([test "x$with_$1" != xyes],
    [UP[]_CPPFLAGS="-I$with_$1/include"
     UP[]_LIBS="-L$with_$1/lib -Wl,-rpath,$with_$1/lib $6"
     PKG_CONFIG_PATH="$with_$1/lib/pkgconfig:$with_$1/lib64/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
     export PKG_CONFIG_PATH])
  PKG_CHECK_MODULES(UP, [$2 >= $3],
    [pe_$1_version=`$PKG_CONFIG --modversion $2`
     UP[]_CPPFLAGS="$UP[]_CFLAGS"],
    [AS_IF([test "x$with_$1" = xyes], [UP[]_CPPFLAGS=""; UP[]_LIBS="$6"])])
  pe_save_CPPFLAGS="$CPPFLAGS"; pe_save_LIBS="$LIBS"
  CPPFLAGS="$CPPFLAGS $UP[]_CPPFLAGS"; LIBS="$UP[]_LIBS $LIBS"
  AC_CHECK_HEADER([$4], [], [AC_MSG_ERROR([$1: header $4 not found (install it or pass --with-$1=DIR)])])
  m4_ifnblank([$5], [
    AC_MSG_CHECKING([for $5 in $1])
    AC_LINK_IFELSE([AC_LANG_CALL([], [$5])], [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no]); AC_MSG_ERROR([$1: cannot link $5 with "$UP[]_LIBS"])])])
  CPPFLAGS="$pe_save_CPPFLAGS"; LIBS="$pe_save_LIBS"
  AS_IF([test -z "$pe_$1_version"], [pe_$1_version="found (version not reported by pkg-config)"])
  AC_SUBST(UP[]_CPPFLAGS)
  AC_SUBST(UP[]_LIBS)
  AC_DEFINE(HAVE_[]UP, [1], [Define to 1 if $1 is available.])
  m4_popdef([UP])
])
