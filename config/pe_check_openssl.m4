# PE_CHECK_OPENSSL: libcrypto, for the HMAC challenge-responses (required): its headers at build
# time; the library is loaded at run time, when a key is first used (common/hmac.cpp), and is
# checked here to be installed.  PE_OPENSSL_LIBDIR: where it was found (pkg-config's libdir, which
# PE_PKG_DEP points at a --with-openssl=DIR prefix, else DIR/lib64 or DIR/lib), tried before the
# loader's own search.
AC_DEFUN([PE_CHECK_OPENSSL], [
  PE_PKG_DEP([openssl], [libcrypto], [1.1.1], [openssl/hmac.h], [HMAC], [-lcrypto])
  pe_openssl_libdir=""
  AS_IF([test -n "$PKG_CONFIG"],
    [pe_openssl_libdir=`$PKG_CONFIG --variable=libdir libcrypto 2>/dev/null`])
  AS_IF([test -z "$pe_openssl_libdir" && test "x$with_openssl" != xyes],
    [AS_IF([ls "$with_openssl"/lib64/libcrypto.so* >/dev/null 2>&1],
       [pe_openssl_libdir="$with_openssl/lib64"], [pe_openssl_libdir="$with_openssl/lib"])])
  AC_DEFINE_UNQUOTED([PE_OPENSSL_LIBDIR], ["$pe_openssl_libdir"],
    [Where configure found OpenSSL's libcrypto ("" if it does not know).])
])
