/* Direct modex: every rank puts a value and commits; a fence *without* data collection makes
 * sure everything is committed; then every rank gets every other rank's value, so values of
 * ranks on other nodes travel by direct modex (the host's direct_modex upcall).  Prints
 * "pmix_dmodex rank R of N ok" or an error and exits non-zero. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call, what)                                                              \
  do {                                                                                 \
    pmix_status_t st_ = (call);                                                        \
    if (st_ != PMIX_SUCCESS) {                                                         \
      fprintf(stderr, "pmix_dmodex: %s failed: %s\n", what, PMIx_Error_string(st_));   \
      exit(2);                                                                         \
    }                                                                                  \
  } while (0)

int main(void) {
  pmix_proc_t me, wild, peer;
  pmix_value_t *val = NULL, v;
  CHECK(PMIx_Init(&me, NULL, 0), "PMIx_Init");
  PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
  CHECK(PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &val), "PMIx_Get(PMIX_JOB_SIZE)");
  unsigned size = val->data.uint32;
  PMIX_VALUE_RELEASE(val);
  char mine[64];
  snprintf(mine, sizeof mine, "dmodex-value-of-%u", me.rank);
  PMIX_VALUE_LOAD(&v, mine, PMIX_STRING);
  CHECK(PMIx_Put(PMIX_GLOBAL, "pe.test.dmodex", &v), "PMIx_Put");
  PMIX_VALUE_DESTRUCT(&v);
  CHECK(PMIx_Commit(), "PMIx_Commit");
  CHECK(PMIx_Fence(&wild, 1, NULL, 0), "PMIx_Fence");
  for (unsigned r = 0; r < size; ++r) {
    PMIX_LOAD_PROCID(&peer, me.nspace, r);
    CHECK(PMIx_Get(&peer, "pe.test.dmodex", NULL, 0, &val), "PMIx_Get(peer key)");
    char want[64];
    snprintf(want, sizeof want, "dmodex-value-of-%u", r);
    if (val->type != PMIX_STRING || strcmp(val->data.string, want) != 0) {
      fprintf(stderr, "pmix_dmodex: rank %u got a wrong value from rank %u\n", me.rank, r);
      return 4;
    }
    PMIX_VALUE_RELEASE(val);
  }
  printf("pmix_dmodex rank %u of %u ok\n", me.rank, size);
  CHECK(PMIx_Finalize(NULL, 0), "PMIx_Finalize");
  return 0;
}
