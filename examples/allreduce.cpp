// DataChannel example: allreduces over all ranks and over sub-groups, with the results checked.
//
//   pytorch_exec -n 4 ./build/examples/allreduce
//
// Every rank contributes rank+1.  Rank 0 prints the group's shape and, when every check passed on
// it, "allreduce ok"; a rank that finds a wrong element prints it and exits 1, and a DataChannel
// error (a timeout, a lost peer) is printed and exits 1 as well.  All values are small integers,
// so the checks are exact (with PYTORCH_DC_BF16_WIRE=1 too, up to 22 ranks, while every sum fits
// in bf16's 8 bits).  Build it outside the source tree with:
//   c++ -std=c++17 allreduce.cpp $(pkg-config --cflags --libs pytorch-dc) -o allreduce
#include <cstdio>
#include <memory>
#include <vector>

#include <pytorch_exec/dc.hpp>

namespace dc = pytorch_exec::dc;

namespace {

// True when every element of v is `want`; otherwise prints the first one that is not.
bool check(const char* what, const std::vector<float>& v, float want, int rank) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != want) {
      std::fprintf(stderr, "rank %d: %s: element %zu of %zu is %g, expected %g\n", rank, what, i,
                   v.size(), static_cast<double>(v[i]), static_cast<double>(want));
      return false;
    }
  }
  return true;
}

// 1 + 2 + ... over the ranks r < size with r % 2 == parity: what each rank contributes is r+1.
float parity_sum(int size, int parity) {
  float s = 0;
  for (int r = parity; r < size; r += 2) s += static_cast<float>(r + 1);
  return s;
}

}  // namespace

int main() {
  try {
    std::shared_ptr<dc::ProcessGroup> pg = dc::ProcessGroup::init();
    const int rank = pg->rank(), size = pg->size();
    if (rank == 0)
      std::printf(
          "rank %d of %d: node %d of %d, local rank %d of %d; "
          "transports: %s inside a node, %s across nodes\n",
          rank, size, pg->node(), pg->nodes(), pg->local_rank(), pg->local_size(),
          pg->intra_transport().c_str(), pg->inter_transport().c_str());

    // Sum, in place, of 4 MiB and 3 floats: a large ring allreduce with an odd count.
    std::vector<float> big((size_t{1} << 20) + 3, static_cast<float>(rank + 1));
    pg->allreduce(big.data(), big.size(), dc::DType::F32, dc::Op::Sum);
    if (!check("sum", big, static_cast<float>(size) * static_cast<float>(size + 1) / 2, rank))
      return 1;

    // Average, out of place, of 5 floats: a small allreduce (fewer elements than ranks past 5).
    std::vector<float> in(5, static_cast<float>(rank + 1)), out(in.size());
    pg->allreduce(in.data(), out.data(), in.size(), dc::DType::F32, dc::Op::Avg);
    if (!check("avg", out, static_cast<float>(size + 1) / 2, rank)) return 1;

    // Even and odd ranks in two groups, an allreduce in each.
    std::shared_ptr<dc::ProcessGroup> half = pg->split(rank % 2);
    std::vector<float> part(1000, static_cast<float>(rank + 1));
    half->allreduce(part.data(), part.size(), dc::DType::F32, dc::Op::Sum);
    if (!check(rank % 2 ? "sum over odd ranks" : "sum over even ranks", part,
               parity_sum(size, rank % 2), rank))
      return 1;

    if (rank == 0) std::printf("allreduce ok\n");
    return 0;
  } catch (const dc::Error& e) {
    std::fprintf(stderr, "allreduce: %s\n", e.what());
    return 1;
  }
}
