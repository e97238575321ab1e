/* A PMIx client that registers for the failure of other processes (PMIX_ERR_PROC_ABORTED,
 * PMIX_EVENT_PROC_TERMINATED) and prints what it gets:
 *   "pmix_events rank R got EVENT source NS:S affected NS:A exit_code C"
 * Usage: pmix_events FAIL_RANK abort|exit|segv
 * After a fence, rank FAIL_RANK calls PMIx_Abort(5), exits with status 3, or dies of SIGSEGV;
 * the others wait (up to 30 s) to be told, print it, and wait to be stopped. */
#include <pmix.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "event_info.h"

static pmix_proc_t me;
static volatile int told = 0;

static void on_event(size_t id, pmix_status_t status, const pmix_proc_t* source, pmix_info_t info[],
                     size_t ninfo, pmix_info_t results[], size_t nresults,
                     pmix_event_notification_cbfunc_fn_t cbfunc, void* cbdata) {
  (void)id, (void)results, (void)nresults;
  char affected[PMIX_MAX_NSLEN + 32];
  int exit_code;
  read_event_info(info, ninfo, affected, sizeof affected, &exit_code);
  printf("pmix_events rank %u got %s source %s:%u affected %s exit_code %d\n", me.rank,
         PMIx_Error_string(status), source ? source->nspace : "none", source ? source->rank : 0,
         affected, exit_code);
  fflush(stdout);
  told = 1;
  if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  pmix_status_t st = PMIx_Init(&me, NULL, 0);
  if (st != PMIX_SUCCESS) {
    fprintf(stderr, "pmix_events: PMIx_Init failed: %s\n", PMIx_Error_string(st));
    return 2;
  }
  unsigned fail_rank = (unsigned)atoi(argv[1]);
  pmix_status_t codes[] = {PMIX_ERR_PROC_ABORTED, PMIX_EVENT_PROC_TERMINATED};
  st = PMIx_Register_event_handler(codes, 2, NULL, 0, on_event, NULL, NULL);
  if (st < 0) {
    fprintf(stderr, "pmix_events: PMIx_Register_event_handler failed: %s\n", PMIx_Error_string(st));
    return 2;
  }
  st = PMIx_Fence(NULL, 0, NULL, 0);
  if (st != PMIX_SUCCESS) {
    fprintf(stderr, "pmix_events: PMIx_Fence failed: %s\n", PMIx_Error_string(st));
    return 2;
  }
  if (me.rank == fail_rank) {
    if (strcmp(argv[2], "abort") == 0) PMIx_Abort(5, "pmix_events: failing on purpose", NULL, 0);
    if (strcmp(argv[2], "segv") == 0) raise(SIGSEGV);
    return 3;
  }
  for (int i = 0; i < 3000 && !told; ++i) usleep(10000);
  if (!told) printf("pmix_events rank %u got nothing\n", me.rank);
  fflush(stdout);
  for (;;) pause(); /* until stopped */
}
