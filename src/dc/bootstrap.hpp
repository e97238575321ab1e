// How the ranks of a DataChannel group find each other.
//
//   PMIx:    the process is a PMIx client (PMIX_NAMESPACE and PMIX_RANK set: under pytorch_exec,
//            srun --mpi=pmix or mpirun).  Rank and size come from PMIx; every rank puts its node
//            name and transport address with PMIx_Put/Commit and a collecting PMIx_Fence.
//   env://:  RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's variables); rank 0 serves a
//            small TCP store on MASTER_PORT+1 (or PYTORCH_DC_PORT) through which the same
//            information is gathered.
//   threads: ranks are threads of one process sharing an in-memory store (tests).
// PYTORCH_DC_BOOTSTRAP=pmix|env forces one.  The node of a rank is its host name, or
// PYTORCH_DC_NODE when set (to simulate several nodes on one machine).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dc/store.hpp"
#include "dc/transport.hpp"

namespace pytorch_exec::dc {

struct World {
  int rank = 0;
  int size = 1;
  std::vector<std::string> nodes;  // node name of every rank
  std::vector<int> domains;  // locality domain of every rank on its node (PYTORCH_EXEC_DOMAIN)
  std::vector<std::string> addrs;  // tcp transport address of every rank ("" without tcp)
  // Every rank's `mine`, in rank order; all ranks call it with the same `key` (unique within the
  // world), during set-up only.  Through PMIx or the world's store.
  std::function<std::vector<std::string>(const std::string& key, const std::string& mine)>
      allgather;
  uint64_t session = 0;  // random, the same on every rank
  std::string key;       // unique among the groups on this machine (shm names, store keys)
  bool threads = false;
};

// Bootstraps this process.  `tcp_port` > 0: this rank's tcp listener port, whose address is
// exchanged.  Throws Error with a sentence that says what to set.
World bootstrap_process(int tcp_port, double timeout);
// Rank `rank` of `size` threads sharing `store`.  `session` and `key` are the same in all.
World bootstrap_thread(int rank, int size, std::vector<std::string> nodes,
                       std::shared_ptr<Store> store, uint64_t session, const std::string& key,
                       int tcp_port, double timeout);

// Every rank's `mine`, in rank order, through the store (O(size) requests).  All ranks call it
// with the same `key`.
std::vector<std::string> store_allgather(Store& store, const std::string& key, int rank, int size,
                                         const std::string& mine, double timeout);

// The records of an allgather as rank 0 joins them ("<length>:<bytes>" each), `size` of them;
// Error naming `key` when `all` is malformed.
std::vector<std::string> parse_gathered(const std::string& all, const std::string& key, int size);
// This rank's address for its tcp transport (where it listens and what it publishes, so that
// the traffic of its connections goes through that interface):
//   PYTORCH_DC_SOCKET_IFNAME set: the first of its comma-separated interfaces or RDMA devices
//     that has an IPv4 address (Error naming the variable when none has);
//   else, when pytorch_exec placed the rank on a GPU (PYTORCH_EXEC_GPU), the first of its
//     rail-aligned NICs (PYTORCH_EXEC_NIC, nearest its GPU first) that has one: the cross-node
//     step of the rank's shard leaves through its own NIC;
//   else the address facing `toward` (MASTER_ADDR, or this host's name when that is unset).
std::string transport_address(const std::string& toward);
// transport_address(MASTER_ADDR or this host's name).
std::string facing_address();

// 64 random bits (a group's session number).
uint64_t random64();
// Numbers the groups this process bootstraps: 0, 1, ... (unique keys within a process).
int next_generation();

// The environment variable `name`, or `def` when it is unset or empty.
std::string env_or(const char* name, const std::string& def);
// The environment variable `name` as a number, or `def` when unset; Error naming it when it is
// set to something else.
double env_number(const char* name, double def);
// The first line of a small file (/proc, /sys), "" if it cannot be read.
std::string first_line(const std::string& path);

}  // namespace pytorch_exec::dc
