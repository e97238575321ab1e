// How PMIx fences and direct-modex requests leave a node.  The PMIx server host hands them to a
// ModexRouter; on one node the LocalModexRouter completes them at once, and the multi-node
// control plane provides one that carries them to the other nodes.
//
// Threading: called on the event-loop thread; `done` must be called on that thread too.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace pe::pmix {

using ModexDone = std::function<void(int pmix_status, std::string data)>;

class ModexRouter {
 public:
  virtual ~ModexRouter() = default;
  // Every local participant of a fence has arrived; `data` is their contribution (empty unless
  // `collect`).  done() gets the contributions of all nodes, concatenated.
  virtual void fence(const std::string& nspace, bool collect, std::string data, ModexDone done) = 0;
  // A local client asks for the data a process on another node committed.
  virtual void direct_modex(const std::string& nspace, int rank, ModexDone done) = 0;
};

// One node: the local contribution is everything; no process lives elsewhere.
class LocalModexRouter : public ModexRouter {
 public:
  void fence(const std::string& nspace, bool collect, std::string data, ModexDone done) override;
  void direct_modex(const std::string& nspace, int rank, ModexDone done) override;
};

}  // namespace pe::pmix
