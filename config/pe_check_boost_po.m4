# PE_CHECK_BOOST_PO: Boost.Program_options (required).  --with-boost=DIR for a private Boost.
AC_DEFUN([PE_CHECK_BOOST_PO], [
  AC_ARG_WITH([boost],
    [AS_HELP_STRING([--with-boost=DIR], [prefix of Boost (default: system)])],
    [], [with_boost=yes])
  BOOST_PO_CPPFLAGS=""
  BOOST_PO_LIBS="-lboost_program_options"
  AS_IF([test "x$with_boost" != xyes && test "x$with_boost" != xno],
    [BOOST_PO_CPPFLAGS="-I$with_boost/include"
     BOOST_PO_LIBS="-L$with_boost/lib -Wl,-rpath,$with_boost/lib -lboost_program_options"])
  pe_save_CPPFLAGS="$CPPFLAGS"; pe_save_LIBS="$LIBS"
  CPPFLAGS="$CPPFLAGS $BOOST_PO_CPPFLAGS"; LIBS="$BOOST_PO_LIBS $LIBS"
  AC_CHECK_HEADER([boost/program_options.hpp], [],
    [AC_MSG_ERROR([Boost.Program_options headers not found (libboost-program-options-dev, or --with-boost=DIR)])])
  AC_MSG_CHECKING([for linkable Boost.Program_options])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <boost/program_options.hpp>]],
      [[boost::program_options::options_description d("x"); return d.options().size();]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no]); AC_MSG_ERROR([cannot link Boost.Program_options with "$BOOST_PO_LIBS"])])
  CPPFLAGS="$pe_save_CPPFLAGS"; LIBS="$pe_save_LIBS"
  AC_SUBST([BOOST_PO_CPPFLAGS])
  AC_SUBST([BOOST_PO_LIBS])
])
