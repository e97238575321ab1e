#include "pmix_rdzv/modex_router.hpp"

#include <pmix_common.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "common/strings.hpp"

namespace pe::pmix {

std::string participants_key(std::vector<ProcId> procs, const std::string& op) {
  std::map<std::string, std::set<int>> by_ns;  // a wildcard is -1, the smallest
  for (const auto& p : procs) by_ns[p.nspace].insert(p.rank < 0 ? -1 : p.rank);
  if (op.empty() && by_ns.size() == 1 && by_ns.begin()->second.count(-1))
    return by_ns.begin()->first;
  std::vector<std::string> parts;
  for (const auto& [ns, ranks] : by_ns) {
    std::vector<std::string> r;
    if (ranks.count(-1))
      r.push_back("*");
    else
      for (int x : ranks) r.push_back(std::to_string(x));
    parts.push_back(ns + ":" + join(r, ","));
  }
  return (op.empty() ? "" : op + "|") + join(parts, ";");
}

std::vector<ProcId> parse_participants(const std::string& key) {
  std::string rest = key.substr(key.find('|') == std::string::npos ? 0 : key.find('|') + 1);
  if (rest.find(':') == std::string::npos) return {ProcId{rest, -1}};
  std::vector<ProcId> out;
  for (const auto& part : split(rest, ';')) {
    auto colon = part.rfind(':');
    if (colon == std::string::npos || colon == 0) throw std::invalid_argument("bad key " + key);
    std::string ns = part.substr(0, colon);
    for (const auto& r : split(part.substr(colon + 1), ',')) {
      if (r == "*") {
        out.push_back(ProcId{ns, -1});
        continue;
      }
      if (r.empty() || r.size() > 9 || r.find_first_not_of("0123456789") != std::string::npos)
        throw std::invalid_argument("bad rank in key " + key);
      out.push_back(ProcId{ns, std::stoi(r)});
    }
  }
  return out;
}

void ModexRouter::publish(Published kv) {
  for (auto& [k, v] : kv) published_[k] = std::move(v);
}

void ModexRouter::lookup(std::vector<std::string> keys, LookupDone done) {
  Published found;
  for (const auto& k : keys)
    if (auto it = published_.find(k); it != published_.end()) found.insert(*it);
  done(std::move(found));
}

void ModexRouter::unpublish(std::vector<std::string> keys) {
  for (const auto& k : keys) published_.erase(k);
}

void LocalModexRouter::fence(const std::string&, bool, std::string data, ModexDone done) {
  done(PMIX_SUCCESS, std::move(data));
}

void LocalModexRouter::direct_modex(const std::string&, int, ModexDone done) {
  done(PMIX_ERR_NOT_FOUND, {});
}

}  // namespace pe::pmix
