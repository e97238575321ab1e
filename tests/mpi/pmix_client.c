/* A plain PMIx client: PMIx_Init, job size and local peers from the server, put/commit/fence
 * with data collection, then every peer's value.  Prints "pmix_client rank R of N ok" or an
 * error and exits non-zero.
 * With the argument "dmodex" the fence does not collect data, so the values of ranks on other
 * nodes travel by direct modex (the host's direct_modex upcall), and the ranks may be spread
 * over several nodes.
 * With the arguments "big BYTES" each rank also puts BYTES bytes, and checks every peer's after
 * the fence (a fence larger than one control-plane frame). */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call, what)                                                            \
  do {                                                                               \
    pmix_status_t st_ = (call);                                                      \
    if (st_ != PMIX_SUCCESS) {                                                       \
      fprintf(stderr, "pmix_client: %s failed: %s\n", what, PMIx_Error_string(st_)); \
      exit(2);                                                                       \
    }                                                                                \
  } while (0)

int main(int argc, char** argv) {
  int dmodex = argc > 1 && strcmp(argv[1], "dmodex") == 0;
  size_t big = argc > 2 && strcmp(argv[1], "big") == 0 ? strtoul(argv[2], NULL, 10) : 0;
  pmix_proc_t me, wild, peer;
  pmix_value_t *val = NULL, v;
  CHECK(PMIx_Init(&me, NULL, 0), "PMIx_Init");
  PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
  CHECK(PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &val), "PMIx_Get(PMIX_JOB_SIZE)");
  unsigned size = val->data.uint32;
  PMIX_VALUE_RELEASE(val);
  CHECK(PMIx_Get(&wild, PMIX_LOCAL_PEERS, NULL, 0, &val), "PMIx_Get(PMIX_LOCAL_PEERS)");
  char peers[4096];
  snprintf(peers, sizeof peers, "%s", val->data.string);
  PMIX_VALUE_RELEASE(val);
  CHECK(PMIx_Get(&me, PMIX_LOCAL_RANK, NULL, 0, &val), "PMIx_Get(PMIX_LOCAL_RANK)");
  unsigned local_rank = val->data.uint16;
  PMIX_VALUE_RELEASE(val);
  const char* env_rank = getenv("RANK");
  if (!env_rank || (unsigned)atoi(env_rank) != me.rank ||
      (!dmodex && !big && local_rank != me.rank)) {
    fprintf(stderr, "pmix_client: PMIx rank %u / local rank %u disagree with RANK=%s\n", me.rank,
            local_rank, env_rank ? env_rank : "(unset)");
    return 3;
  }
  char mine[64];
  snprintf(mine, sizeof mine, "value-of-%u", me.rank);
  PMIX_VALUE_LOAD(&v, mine, PMIX_STRING);
  CHECK(PMIx_Put(PMIX_GLOBAL, "pe.test.key", &v), "PMIx_Put");
  PMIX_VALUE_DESTRUCT(&v);
  if (big) {
    pmix_byte_object_t bo;
    bo.size = big;
    bo.bytes = malloc(big);
    memset(bo.bytes, 'a' + me.rank % 26, big);
    PMIX_VALUE_LOAD(&v, &bo, PMIX_BYTE_OBJECT);
    CHECK(PMIx_Put(PMIX_GLOBAL, "pe.test.big", &v), "PMIx_Put(big)");
    PMIX_VALUE_DESTRUCT(&v);
    free(bo.bytes);
  }
  CHECK(PMIx_Commit(), "PMIx_Commit");
  pmix_info_t collect;
  bool yes = true;
  PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
  CHECK(PMIx_Fence(&wild, 1, &collect, dmodex ? 0 : 1), "PMIx_Fence");
  for (unsigned r = 0; r < size; ++r) {
    PMIX_LOAD_PROCID(&peer, me.nspace, r);
    CHECK(PMIx_Get(&peer, "pe.test.key", NULL, 0, &val), "PMIx_Get(peer key)");
    char want[64];
    snprintf(want, sizeof want, "value-of-%u", r);
    if (val->type != PMIX_STRING || strcmp(val->data.string, want) != 0) {
      fprintf(stderr, "pmix_client: rank %u got a wrong value from rank %u\n", me.rank, r);
      return 4;
    }
    PMIX_VALUE_RELEASE(val);
    if (big) {
      CHECK(PMIx_Get(&peer, "pe.test.big", NULL, 0, &val), "PMIx_Get(peer big)");
      if (val->type != PMIX_BYTE_OBJECT || val->data.bo.size != big ||
          val->data.bo.bytes[big - 1] != (char)('a' + r % 26)) {
        fprintf(stderr, "pmix_client: rank %u got a wrong big value from rank %u\n", me.rank, r);
        return 4;
      }
      PMIX_VALUE_RELEASE(val);
    }
  }
  printf("pmix_client rank %u of %u ok (local peers %s)\n", me.rank, size, peers);
  /* With "node-info": what the server says of this node (mpirun sets it when ranks outnumber
   * processors), and the yield and oversubscription settings Open MPI reads from the
   * environment. */
  int node_info = 0;
  for (int i = 1; i < argc; ++i) node_info |= strcmp(argv[i], "node-info") == 0;
  const char* over = "unset";
  if (PMIx_Get(&wild, PMIX_NODE_OVERSUBSCRIBED, NULL, 0, &val) == PMIX_SUCCESS) {
    over = val->type == PMIX_BOOL && val->data.flag ? "yes" : "no";
    PMIX_VALUE_RELEASE(val);
  }
  const char* yield = getenv("OMPI_MCA_mpi_yield_when_idle");
  const char* mpi_over = getenv("OMPI_MCA_mpi_oversubscribe");
  const char* rmaps_over = getenv("OMPI_MCA_rmaps_base_oversubscribe");
  if (node_info)
    printf(
        "pmix_client rank %u oversubscribed=%s yield_when_idle=%s mpi_oversubscribe=%s "
        "rmaps_base_oversubscribe=%s\n",
        me.rank, over, yield ? yield : "unset", mpi_over ? mpi_over : "unset",
        rmaps_over ? rmaps_over : "unset");
  CHECK(PMIx_Finalize(NULL, 0), "PMIx_Finalize");
  return 0;
}
