// The real machines of tests/fixtures/hwloc, loaded and analysed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "topology/domains.hpp"

struct Loaded {
  std::unique_ptr<pe::topo::Topology> t;
  pe::topo::Analysis a;
};

inline Loaded load(const std::string& name) {
  Loaded l;
  l.t = pe::topo::load_topology(
      pe::topo::LoadOptions{std::string(PE_FIXTURES) + "/" + name + ".xml"});
  l.a = pe::topo::analyse(*l.t);
  return l;
}

// The names of NICs given by their positions in t.nics().
inline std::vector<std::string> nic_names(const pe::topo::Topology& t,
                                          const std::vector<int>& nics) {
  std::vector<std::string> v;
  for (int n : nics) v.push_back(t.nics()[static_cast<size_t>(n)].name);
  return v;
}
