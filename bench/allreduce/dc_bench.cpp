// bench/allreduce/dc_bench: DataChannel's side of bench/allreduce/run.
//
// One process per rank, started by pytorch_exec or mpirun; the transports come from the
// environment (PYTORCH_DC_TRANSPORT, PYTORCH_DC_INTRA, PYTORCH_DC_INTER, PYTORCH_DC_NODE).  For
// each size: one allreduce of the test pattern, checked; one untimed batch; then --reps timed
// batches of in-place f32 sum allreduces, each preceded by a barrier (--bucket: single
// allreduces back to back, each timed).  The time of a batch is
// reduced over ranks with the library's own allreduce (max).  Only the public API is used.
// See common.h for the command line and the output.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common.h"
#include "pytorch_exec/dc.hpp"

namespace dc = pytorch_exec::dc;

namespace {

double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

// Checks one allreduce of the pattern, times reps batches (--bucket: reps single allreduces back
// to back, the checked one first); returns the wrong elements here.
long long run_size(dc::ProcessGroup& pg, std::vector<float>& buf, size_t count, int iters,
                   const pe_args& a, double* us) {
  float* b = buf.data();
  long long wrong = 0;
  auto allreduce = [&] { pg.allreduce(b, count, dc::DType::F32, dc::Op::Sum); };
  for (size_t i = 0; i < count; i++) b[i] = pe_pattern(pg.rank(), i);
  double t0 = now_us();
  allreduce();
  if (a.bucket) us[0] = now_us() - t0;
  for (size_t i = 0; i < count; i++) wrong += b[i] != pe_expected(pg.size(), i);
  std::fill(b, b + count, 0.0f);  // zeros stay zeros: no overflow however many iterations
  for (int r = 1; a.bucket && r < a.reps; r++) {
    t0 = now_us();
    allreduce();
    us[r] = now_us() - t0;
  }
  if (!a.bucket) {
    for (int k = 0; k < iters; k++) allreduce();
    for (int r = 0; r < a.reps; r++) {
      pg.barrier();
      t0 = now_us();
      for (int k = 0; k < iters; k++) allreduce();
      us[r] = (now_us() - t0) / iters;
    }
  }
  for (size_t i = 0; i < count; i++) wrong += b[i] != 0.0f;
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  pe_args a;
  if (pe_parse_args(argc, argv, &a) != 0) return 2;
  int rank = -1;
  try {
    auto pg = dc::ProcessGroup::init();
    rank = pg->rank();
    if (rank == 0) {
      std::printf("@@INFO ranks=%d nodes=%d intra=%s inter=%s shm_lanes=%d\n", pg->size(),
                  pg->nodes(), pg->intra_transport().c_str(), pg->inter_transport().c_str(),
                  pg->shm_lanes());
      std::fflush(stdout);
    }
    std::vector<float> buf(pe_max_bytes(&a) / sizeof(float) + 1);
    for (int s = 0; s < a.nsizes; s++) {
      double us[PE_MAX_REPS];
      size_t count = a.bytes[s] / sizeof(float);
      long long wrong = run_size(*pg, buf, count, a.iters[s], a, us);
      pg->allreduce(us, a.reps, dc::DType::F64, dc::Op::Max);
      int64_t wrong_all = wrong;
      pg->allreduce(&wrong_all, 1, dc::DType::I64, dc::Op::Sum);
      if (rank == 0) pe_print_row(a.bytes[s], count, wrong_all, us, a.reps);
    }
    pg->barrier();
  } catch (const dc::Error& e) {
    std::fprintf(stderr, "dc_bench: rank %d: %s\n", rank, e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dc_bench: rank %d: unexpected error: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
