// The environment that makes Open MPI 4.1 use our PMIx server.
//
// Open MPI 4.1 decides how it was launched before it touches PMIx: orte_init asks its schizo
// components in priority order (jsm 80, flux 60, slurm 50, orte 1), and the "orte" component
// declares the process an unmanaged singleton -- forcing OMPI_MCA_ess=singleton over any user
// setting -- unless orte_local_daemon_uri is set (orte/mca/schizo/orte/schizo_orte.c).  Any of
// four signals moves a process onto ess=pmi, which reads PMIX_LOCAL_RANK, PMIX_NODE_RANK,
// PMIX_MAX_PROCS and PMIX_JOB_SIZE from our server (orte/mca/ess/pmi/ess_pmi_module.c):
//   - orte_local_daemon_uri (what mpirun sets): Open MPI then believes an ORTE daemon exists and
//     routes its error messages to it through PMIx_Log as packed ORTE buffers, so a user would see
//     "MPI_Init failed" and never the reason;
//   - SLURM_JOBID + SLURM_NODELIST + SLURM_STEP_ID, or FLUX_JOB_ID: pull in Slurm or Flux
//     specific behaviour;
//   - JSM_JSRUN_PORT (schizo/jsm): "direct launch by a PMIx resource manager"; nothing else in
//     Open MPI 4.1 reads it, errors are printed by the rank itself (standalone mode), and binding
//     is left to the launcher (hwloc_base_binding_policy=none, orte_externally_bound=1).
// We use the last.  Open MPI 5 (PRRTE) needs none of this.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pe::pmix {

struct OmpiEnvInput {
  std::string nspace;       // the generation's PMIx namespace
  std::string session_dir;  // removed by the launcher at the end: Open MPI's session files go here
  int universe_size = 0;
  std::string shm_dir;  // the same in /dev/shm for its shared-memory segments ("": none)
};

// NAME, VALUE pairs; the caller keeps any the user set already.
std::vector<std::pair<std::string, std::string>> open_mpi_environment(const OmpiEnvInput& in);

}  // namespace pe::pmix
