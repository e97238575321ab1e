# PE_CHECK_OPENSSL: libcrypto, for the control plane's HMAC challenge-response (required).
AC_DEFUN([PE_CHECK_OPENSSL], [
  PE_PKG_DEP([openssl], [libcrypto], [1.1.1], [openssl/hmac.h], [HMAC], [-lcrypto])
])
