// How PMIx fences and direct-modex requests leave a node.  The PMIx server host hands them to a
// ModexRouter; on one node the LocalModexRouter completes them at once, and the multi-node
// control plane provides one that carries them to the other nodes.
//
// Threading: called on the event-loop thread; `done` must be called on that thread too.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace pe::pmix {

using ModexDone = std::function<void(int pmix_status, std::string data)>;

// A process of a collective operation; rank -1 stands for every process of the namespace.
struct ProcId {
  std::string nspace;
  int rank = -1;
};

// The participants of a fence (or of a connect/disconnect, `op` "connect" or "disconnect") as
// the key that names it: "NSPACE" for a whole namespace's fence, else
// "[op|]NSPACE:RANKS;NSPACE:RANKS" with RANKS "*" or "0,3,4", namespaces sorted.  Every node
// makes the same key for the same operation; the front end finds the nodes from it.
std::string participants_key(std::vector<ProcId> procs, const std::string& op = "");
// Back from a key (the op is dropped).  Throws std::invalid_argument for a malformed key.
std::vector<ProcId> parse_participants(const std::string& key);

using Published = std::map<std::string, std::string>;
using LookupDone = std::function<void(Published found)>;

class ModexRouter {
 public:
  virtual ~ModexRouter() = default;
  // Every local participant of a fence has arrived (`nspace`: the participants_key); `data` is
  // their contribution (empty unless `collect`).  done() gets the contributions of all nodes,
  // concatenated.
  virtual void fence(const std::string& nspace, bool collect, std::string data, ModexDone done) = 0;
  // A local client asks for the data a process on another node committed.
  virtual void direct_modex(const std::string& nspace, int rank, ModexDone done) = 0;
  // PMIx_Publish / PMIx_Lookup / PMIx_Unpublish (MPI's port names, connect/accept): string
  // values.  This default keeps them on this node; a multi-node router keeps them where every
  // node sees them.  lookup() answers at once with what there is (the caller retries to wait).
  virtual void publish(Published kv);
  virtual void lookup(std::vector<std::string> keys, LookupDone done);
  virtual void unpublish(std::vector<std::string> keys);

 private:
  Published published_;
};

// One node: the local contribution is everything; no process lives elsewhere.
class LocalModexRouter : public ModexRouter {
 public:
  void fence(const std::string& nspace, bool collect, std::string data, ModexDone done) override;
  void direct_modex(const std::string& nspace, int rank, ModexDone done) override;
};

}  // namespace pe::pmix
