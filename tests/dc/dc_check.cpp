// dc_check: the DataChannel as real processes, for tests/integration/test_dc.py.
//   dc_check conformance SEED   every dtype x op x a few counts, plus reduce_scatter, allgather,
//                               broadcast, send/recv and split; every rank builds every rank's
//                               input from SEED and checks against the reference.  "ok" on rank 0.
//   dc_check die RANK           ranks loop over large allreduces; RANK exits abruptly in the
//                               middle; the others must report an error within the timeout
//                               (exit 4, "error after S s: ...").
//   dc_check split-exit         rank 0 (which serves the bootstrap's store) leaves the job right
//                               after a split that it is not part of; the others set up their
//                               group, split it again and allreduce in both.  "ok" on rank 1.
//   dc_check info               one line per rank: rank size node nodes local_rank local_size intra
//   inter,
//                               the domains of all ranks, and those of its half after split(rank %
//                               2)
//   dc_check hold SECONDS       an allreduce, "ready" on rank 0, SECONDS of sleep with the
//                               group's connections open (for a look at them from outside),
//                               a barrier, "done" on rank 0
//   dc_check forked             every rank forks right after the set-up and its child, which
//                               has none of the parent's threads, takes its place: allreduces of
//                               4 MiB (with shm lanes: in slices, all on the child's one
//                               thread) in a buffer from before the fork, checked; the child
//                               lets go of the group and exits; "ok" on rank 0's child
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "testlib.hpp"

using namespace dctest;

namespace {

int failures = 0;

std::vector<std::vector<char>> inputs(uint64_t seed, int n, size_t count, DType t, Op op) {
  std::vector<std::vector<char>> in;
  for (int r = 0; r < n; ++r) {
    std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(r) * 7919 + count * 31 +
                        static_cast<uint64_t>(t) * 7 + static_cast<uint64_t>(op));
    in.push_back(random_input(count, t, op, rng));
  }
  return in;
}

void conformance_allreduce(ProcessGroup& pg, uint64_t seed) {
  for (DType t :
       {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8})
    for (Op op : {Op::Sum, Op::Prod, Op::Min, Op::Max, Op::Avg})
      for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{4097}, size_t{300007}}) {
        auto in = inputs(seed, pg.size(), count, t, op);
        auto out = in[static_cast<size_t>(pg.rank())];
        pg.allreduce(out.data(), count, t, op);
        if (check_result(out.data(), in, count, t, op) != 0) ++failures;
      }
}

void conformance_others(ProcessGroup& pg, uint64_t seed) {
  int n = pg.size(), me = pg.rank();
  size_t count = 10001;
  auto in = inputs(seed, n, count * static_cast<size_t>(n), DType::F32, Op::Sum);
  std::vector<float> block(count), all(count * static_cast<size_t>(n));
  pg.reduce_scatter(in[static_cast<size_t>(me)].data(), block.data(), count, DType::F32, Op::Sum);
  pg.allgather(block.data(), all.data(), count, DType::F32);
  if (check_result(all.data(), in, count * static_cast<size_t>(n), DType::F32, Op::Sum) != 0)
    ++failures;
  std::vector<int64_t> b(300000);
  for (int root = 0; root < n; ++root) {
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = me == root ? static_cast<int64_t>(i * 3 + static_cast<size_t>(root)) : -1;
    pg.broadcast(b.data(), b.size(), DType::I64, root);
    if (b.back() != static_cast<int64_t>((b.size() - 1) * 3 + static_cast<size_t>(root)))
      ++failures, std::fprintf(stderr, "broadcast from %d wrong\n", root);
  }
  if (n > 1) {
    std::vector<int> msg(5000, me), got(5000, -1);
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    if (me % 2 == 0)
      pg.send(msg.data(), 20000, next), pg.recv(got.data(), 20000, prev);
    else
      pg.recv(got.data(), 20000, prev), pg.send(msg.data(), 20000, next);
    if (got[4999] != prev) ++failures, std::fprintf(stderr, "send/recv wrong\n");
  }
  auto sub = pg.split(me % 2, me);
  int64_t v = me;
  sub->allreduce(&v, 1, DType::I64, Op::Sum);
  int64_t want = 0;
  for (int q = me % 2; q < n; q += 2) want += q;
  if (v != want)
    ++failures, std::fprintf(stderr, "split allreduce %lld, expected %lld\n",
                             static_cast<long long>(v), static_cast<long long>(want));
  pg.barrier();
}

int die(ProcessGroup& pg, int victim) {
  std::vector<float> v(4 << 20, 1.0f);
  auto start = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 1000; ++i) {
      if (pg.rank() == victim && i == 3) _exit(3);  // in the middle of the job, no clean-up
      pg.allreduce(v.data(), v.size(), DType::F32, Op::Sum, 30);
    }
  } catch (const Error& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d: error after %.2f s: %s\n", pg.rank(), s, e.what());
    std::fflush(stdout);
    return 4;
  }
  std::printf("rank %d: no error\n", pg.rank());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  try {
    auto pg = ProcessGroup::init();
    if (mode == "info") {
      auto domains = [](ProcessGroup& g) {
        std::string s;
        for (int r = 0; r < g.size(); ++r) s += (r ? "," : "") + std::to_string(g.domain_of(r));
        return s;
      };
      auto half = pg->split(pg->rank() % 2);
      std::printf(
          "rank %d size %d node %d nodes %d local_rank %d local_size %d intra %s inter %s domain "
          "%d domains %s half %s\n",
          pg->rank(), pg->size(), pg->node(), pg->nodes(), pg->local_rank(), pg->local_size(),
          pg->intra_transport().c_str(), pg->inter_transport().c_str(), pg->domain(),
          domains(*pg).c_str(), domains(*half).c_str());
      pg->barrier();
      return 0;
    }
    if (mode == "reinit") {  // more groups made by init() while the first one lives
      for (int i = 0; i < 3; ++i) {
        auto again = ProcessGroup::init();
        int64_t v = again->rank();
        again->allreduce(&v, 1, DType::I64, Op::Sum);
        if (v != static_cast<int64_t>(pg->size()) * (pg->size() - 1) / 2) return 1;
      }
      pg->barrier();
      if (pg->rank() == 0) std::printf("ok\n");
      return 0;
    }
    if (mode == "split-exit") {
      auto rest = pg->split(pg->rank() == 0 ? -1 : 1);
      if (!rest) return 0;
      auto again = rest->split(0);
      int64_t v = pg->rank(), want = static_cast<int64_t>(pg->size()) * (pg->size() - 1) / 2;
      rest->allreduce(&v, 1, DType::I64, Op::Sum);
      again->allreduce(&v, 1, DType::I64, Op::Max);
      if (v != want)
        std::printf("rank %d: %lld, expected %lld\n", pg->rank(), static_cast<long long>(v),
                    static_cast<long long>(want));
      else if (pg->rank() == 1)
        std::printf("ok\n");
      return v == want ? 0 : 1;
    }
    if (mode == "hold" && argc > 2) {
      int64_t v = 1;
      pg->allreduce(&v, 1, DType::I64, Op::Sum);
      if (pg->rank() == 0) std::printf("ready %lld\n", static_cast<long long>(v));
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(argv[2])));
      pg->barrier();
      if (pg->rank() == 0) std::printf("done\n");
      return 0;
    }
    if (mode == "die" && argc > 2) return die(*pg, std::atoi(argv[2]));
    if (mode == "forked") {
      std::vector<float> v(1 << 20);  // the parent has it too, at the same address
      std::fflush(stdout);
      pid_t child = ::fork();
      if (child < 0) throw std::runtime_error("fork failed");
      if (child > 0) {
        int status = 0;
        ::waitpid(child, &status, 0);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      }
      int n = pg->size(), bad = 0;
      for (int i = 0; i < 3; ++i) {
        for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(pg->rank() + 1 + k % 7);
        pg->allreduce(v.data(), v.size(), DType::F32, Op::Sum, 60);
        for (size_t k = 0; k < v.size(); ++k)
          bad += v[k] != static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(k % 7));
      }
      if (pg->rank() == 0) std::printf(bad ? "FAILED\n" : "ok\n");
      pg->barrier();
      pg.reset();  // its helper threads are the parent's: not joined here
      std::fflush(stdout);
      ::_exit(bad ? 1 : 0);
    }
    if (mode == "conformance" && argc > 2) {
      uint64_t seed = std::strtoull(argv[2], nullptr, 10);
      conformance_allreduce(*pg, seed);
      conformance_others(*pg, seed);
      int64_t bad = failures;
      pg->allreduce(&bad, 1, DType::I64, Op::Sum);
      if (pg->rank() == 0)
        std::printf("%s (%d ranks, %d nodes, %s/%s)\n", bad ? "FAILED" : "ok", pg->size(),
                    pg->nodes(), pg->intra_transport().c_str(), pg->inter_transport().c_str());
      return bad ? 1 : 0;
    }
    std::fprintf(stderr,
                 "usage: dc_check conformance SEED | die RANK | split-exit | reinit | info | "
                 "hold SECONDS | forked\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dc_check: %s\n", e.what());
    return 1;
  }
}
