# PE_CHECK_LIBEVENT: the event loop of every pytorch_exec process (required).
AC_DEFUN([PE_CHECK_LIBEVENT], [
  PE_PKG_DEP([libevent], [libevent_core], [2.1], [event2/event.h], [event_base_new], [-levent_core])
])
