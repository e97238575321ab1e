// The environment that makes Open MPI 4.1 use our PMIx server.
//
// Open MPI 4.1 decides how it was launched before it touches PMIx: its schizo framework asks
// each component, and the "orte" component declares the process an unmanaged singleton (and
// forces ess=singleton, overriding OMPI_MCA_ess) unless orte_process_info.my_daemon_uri is set,
// i.e. unless the MCA parameter orte_local_daemon_uri is (orte/mca/schizo/orte/schizo_orte.c).
// mpirun sets it to its own contact URI.  With it set, schizo selects ess=pmi, which reads
// PMIX_LOCAL_RANK, PMIX_NODE_RANK, PMIX_MAX_PROCS and PMIX_JOB_SIZE from the PMIx server
// (orte/mca/ess/pmi/ess_pmi_module.c) and never contacts the daemon on these paths.
// Open MPI 5 ignores these orte_* parameters.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pe::pmix {

struct OmpiEnvInput {
  std::string nspace;       // the generation's PMIx namespace
  std::string session_dir;  // removed by the launcher at the end: Open MPI's session files go here
  int universe_size = 0;
};

// NAME, VALUE pairs; the caller keeps any the user set already.
std::vector<std::pair<std::string, std::string>> open_mpi_environment(const OmpiEnvInput& in);

}  // namespace pe::pmix
