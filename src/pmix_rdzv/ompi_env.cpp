#include "pmix_rdzv/ompi_env.hpp"

namespace pe::pmix {

std::vector<std::pair<std::string, std::string>> open_mpi_environment(const OmpiEnvInput& in) {
  std::vector<std::pair<std::string, std::string>> env{
      // Take the PMIx path as a directly launched job (see the header); the value is not used.
      {"JSM_JSRUN_PORT", "1"},
      // As mpirun: use the PMIx client component, never the isolated/PMI-1/2 ones.
      {"OMPI_MCA_pmix", "^s1,s2,cray,isolated"},
      // Session directories inside the launcher's temporary directory (removed at exit even if
      // ranks are killed).
      {"OMPI_MCA_orte_tmpdir_base", in.session_dir},
      {"OMPI_UNIVERSE_SIZE", std::to_string(in.universe_size)},
  };
  // Shared-memory segments (vader) in a directory of their own, removed at the end even after an
  // abort, a crash or the launcher's death; Open MPI puts them in /dev/shm itself otherwise.
  if (!in.shm_dir.empty()) env.emplace_back("OMPI_MCA_btl_vader_backing_directory", in.shm_dir);
  return env;
}

}  // namespace pe::pmix
