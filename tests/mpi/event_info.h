/* What the failure-event test programs (pmix_events.c, pmix_spawn_events.c) read from an event:
 * the affected process as "NSPACE:RANK" ("none" without one) and PMIX_EXIT_CODE (-1 without). */
#pragma once
#include <pmix.h>
#include <stdio.h>

static void read_event_info(const pmix_info_t info[], size_t ninfo, char* affected, size_t size,
                            int* exit_code) {
  snprintf(affected, size, "none");
  *exit_code = -1;
  for (size_t i = 0; i < ninfo; ++i) {
    if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROC) && info[i].value.type == PMIX_PROC)
      snprintf(affected, size, "%s:%u", info[i].value.data.proc->nspace,
               info[i].value.data.proc->rank);
    if (PMIX_CHECK_KEY(&info[i], PMIX_EXIT_CODE) && info[i].value.type == PMIX_INT)
      *exit_code = info[i].value.data.integer;
  }
}
