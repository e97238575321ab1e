/* Failure events across a spawn (PMIx_Spawn, what MPI_Comm_spawn does underneath): the parents'
 * rank 0 spawns N copies of this program; every process registers for PMIX_ERR_PROC_ABORTED and
 * PMIX_EVENT_PROC_TERMINATED and prints what it gets:
 *   "NSPACE:RANK got EVENT affected NS:A exit_code C"
 * Usage: pmix_spawn_events N WHO   (WHO: "parent:R" or "child:R", the process that fails; with
 * "/abort" after it, it calls PMIx_Abort(3, ...) first, as MPI_Abort does)
 * SPAWN_EVENTS_HOST (in the parents' environment) puts the children there (PMIX_ADD_HOST).
 * The one that fails waits 2 s (the others have registered by then) and exits with status 3; the
 * others wait (up to 30 s) to be told, print it, and wait to be stopped. */
#include <pmix.h>
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
  (void)id, (void)source, (void)results, (void)nresults;
  char affected[PMIX_MAX_NSLEN + 32];
  int exit_code;
  read_event_info(info, ninfo, affected, sizeof affected, &exit_code);
  printf("%s:%u got %s affected %s exit_code %d\n", me.nspace, me.rank, PMIx_Error_string(status),
         affected, exit_code);
  fflush(stdout);
  told = 1;
  if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

static int spawn_children(const char* self, int n, const char* who) {
  pmix_app_t app;
  PMIX_APP_CONSTRUCT(&app);
  app.cmd = strdup(self);
  char nbuf[16];
  snprintf(nbuf, sizeof nbuf, "%d", n);
  char* argv[] = {(char*)self, nbuf, (char*)who, "spawned", NULL};
  app.argv = argv;
  app.maxprocs = n;
  const char* host = getenv("SPAWN_EVENTS_HOST");
  pmix_info_t info;
  PMIX_INFO_CONSTRUCT(&info);
  if (host) PMIX_INFO_LOAD(&info, PMIX_ADD_HOST, host, PMIX_STRING);
  pmix_nspace_t child;
  pmix_status_t st = PMIx_Spawn(host ? &info : NULL, host ? 1 : 0, &app, 1, child);
  PMIX_INFO_DESTRUCT(&info);
  app.argv = NULL;
  free(app.cmd);
  if (st != PMIX_SUCCESS) {
    printf("spawn failed: %s\n", PMIx_Error_string(st));
    fflush(stdout);
    return 4;
  }
  printf("spawned %s\n", child);
  fflush(stdout);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  pmix_status_t st = PMIx_Init(&me, NULL, 0);
  if (st != PMIX_SUCCESS) {
    fprintf(stderr, "pmix_spawn_events: PMIx_Init failed: %s\n", PMIx_Error_string(st));
    return 2;
  }
  int spawned = argc > 3;
  pmix_status_t codes[] = {PMIX_ERR_PROC_ABORTED, PMIX_EVENT_PROC_TERMINATED};
  st = PMIx_Register_event_handler(codes, 2, NULL, 0, on_event, NULL, NULL);
  if (st < 0) {
    fprintf(stderr, "pmix_spawn_events: PMIx_Register_event_handler failed\n");
    return 2;
  }
  if (PMIx_Fence(NULL, 0, NULL, 0) != PMIX_SUCCESS) {
    fprintf(stderr, "pmix_spawn_events: PMIx_Fence failed\n");
    return 2;
  }
  if (!spawned && me.rank == 0) {
    int rc = spawn_children(argv[0], atoi(argv[1]), argv[2]);
    if (rc) return rc;
  }
  char mine[32];
  snprintf(mine, sizeof mine, "%s:%u", spawned ? "child" : "parent", me.rank);
  size_t len = strlen(mine);
  if (strncmp(mine, argv[2], len) == 0 && (argv[2][len] == 0 || argv[2][len] == '/')) {
    sleep(2);
    if (strcmp(argv[2] + len, "/abort") == 0) PMIx_Abort(3, "it aborts", NULL, 0);
    return 3;
  }
  for (int i = 0; i < 3000 && !told; ++i) usleep(10000);
  if (!told) printf("%s:%u got nothing\n", me.nspace, me.rank);
  fflush(stdout);
  for (;;) pause(); /* until stopped */
}
