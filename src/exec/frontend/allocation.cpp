#include "exec/frontend/allocation.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/error.hpp"
#include "common/strings.hpp"

namespace pe {
namespace {

constexpr size_t kMaxHosts = 1 << 20;  // a hostlist that expands beyond this is a mistake

// Splits at commas outside brackets.
std::vector<std::string> split_top(const std::string& s, const std::string& what) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[' && ++depth > 1) throw UsageError(what + ": nested '[' in '" + s + "'");
    if (c == ']' && --depth < 0) throw UsageError(what + ": unmatched ']' in '" + s + "'");
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw UsageError(what + ": unmatched '[' in '" + s + "'");
  out.push_back(cur);
  return out;
}

void expand_item(const std::string& item, const std::string& list, std::vector<std::string>& out) {
  const std::string what = "hostlist '" + list + "'";
  size_t open = item.find('[');
  if (open == std::string::npos) {
    if (item.empty()) throw UsageError(what + ": empty host name");
    if (item.find(']') != std::string::npos) throw UsageError(what + ": unmatched ']'");
    out.push_back(item);
    return;
  }
  size_t close = item.find(']', open);
  std::string prefix = item.substr(0, open);
  std::string rest = item.substr(close + 1);
  std::string body = item.substr(open + 1, close - open - 1);
  if (body.empty()) throw UsageError(what + ": empty range '[]'");
  for (const auto& range : split(body, ',')) {
    auto dash = range.find('-');
    std::string lo_s = range.substr(0, dash);
    std::string hi_s = dash == std::string::npos ? lo_s : range.substr(dash + 1);
    auto lo = parse_int(lo_s, 0, LLONG_MAX / 2);
    auto hi = parse_int(hi_s, 0, LLONG_MAX / 2);
    if (lo_s.empty() || hi_s.empty() || !lo || !hi || lo_s[0] == '+' || lo_s[0] == '-' ||
        hi_s[0] == '+' || hi_s[0] == '-')
      throw UsageError(what + ": bad range '" + range + "'");
    if (*hi < *lo) throw UsageError(what + ": range '" + range + "' runs backwards");
    if (static_cast<size_t>(*hi - *lo) >= kMaxHosts ||
        out.size() + static_cast<size_t>(*hi - *lo) >= kMaxHosts)
      throw UsageError(what + ": more than " + std::to_string(kMaxHosts) + " hosts");
    size_t width = lo_s.size();  // zero padding: "01-03" keeps two digits
    for (long long v = *lo; v <= *hi; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < width) num.insert(0, width - num.size(), '0');
      expand_item(prefix + num + rest, list, out);  // further bracket groups in `rest`
    }
  }
}

int parse_slots(const std::string& v, const std::string& where) {
  auto n = parse_int(v, 0, 1 << 20);
  if (!n || v[0] == '+' || v[0] == '-') throw UsageError(where + ": bad slot count '" + v + "'");
  return static_cast<int>(*n);
}

bool valid_host(const std::string& h) {
  // Not an option of ssh or of a launch agent's command ("-F...", "-oProxyCommand=...").
  if (h.empty() || h[0] == '-' || h[0] == '.') return false;
  for (char c : h)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_'))
      return false;
  return true;
}

void add(std::vector<HostSlots>& v, const std::string& host, int slots) {
  for (auto& h : v)
    if (h.host == host) {
      h.slots += slots;
      return;
    }
  v.push_back(HostSlots{host, slots});
}

}  // namespace

int Allocation::total_slots() const {
  long long t = 0;
  for (const auto& n : nodes) t += n.slots;
  return t > INT_MAX ? INT_MAX : static_cast<int>(t);
}

std::vector<std::string> expand_hostlist(const std::string& list) {
  if (list.empty()) throw UsageError("hostlist: empty");
  std::vector<std::string> out;
  for (const auto& item : split_top(list, "hostlist '" + list + "'")) expand_item(item, list, out);
  return out;
}

std::vector<int> expand_counts(const std::string& what, const std::string& spec) {
  std::vector<int> out;
  if (spec.empty()) throw UsageError(what + ": empty");
  for (const auto& item : split(spec, ',')) {
    std::string n = item, rep = "1";
    auto paren = item.find("(x");
    if (paren != std::string::npos) {
      if (item.back() != ')')
        throw UsageError(what + ": bad item '" + item + "' in '" + spec + "'");
      n = item.substr(0, paren);
      rep = item.substr(paren + 2, item.size() - paren - 3);
    }
    auto count = parse_int(n, 0, 1 << 20);
    auto times = parse_int(rep, 1, 1 << 20);
    if (!count || !times || n[0] == '+' || rep[0] == '+')
      throw UsageError(what + ": bad item '" + item + "' in '" + spec + "'");
    if (out.size() + static_cast<size_t>(*times) > kMaxHosts)
      throw UsageError(what + ": too many entries");
    out.insert(out.end(), static_cast<size_t>(*times), static_cast<int>(*count));
  }
  return out;
}

namespace {

constexpr size_t kMaxHostfileLine = 64 << 10;

// std::getline with a bound: a file that is no hostfile (/dev/zero, a binary) is refused before
// it fills memory.
bool bounded_line(std::istream& in, std::string& line, const std::string& where) {
  line.clear();
  std::istream::int_type c;
  while ((c = in.get()) != std::istream::traits_type::eof()) {
    if (c == '\n') return true;
    if (line.size() == kMaxHostfileLine)
      throw UsageError(where + ": a line longer than " + std::to_string(kMaxHostfileLine) +
                       " bytes (not a hostfile?)");
    line += static_cast<char>(c);
  }
  return !line.empty();
}

// Calls f(line, where, number) for each line of a hostfile or rankfile, its '#' comment cut off;
// `where` is "NAME:NUMBER", for messages.
template <class F>
void each_line(std::istream& in, const std::string& name, F&& f) {
  std::string line;
  int lineno = 0;
  while (bounded_line(in, line, name + ":" + std::to_string(lineno + 1))) {
    ++lineno;
    f(line.substr(0, line.find('#')), name + ":" + std::to_string(lineno), lineno);
  }
}

}  // namespace

std::vector<RankfileLine> parse_rankfile(std::istream& in, const std::string& name) {
  std::vector<RankfileLine> out;
  each_line(in, name, [&](const std::string& line, const std::string& where, int lineno) {
    // "rank 0 = aa  slot = 1:0" as "rank 0=aa slot=1:0"
    std::string tight;
    for (char ch : line) {
      bool space = std::isspace(static_cast<unsigned char>(ch));
      if (ch == '=')
        while (!tight.empty() && std::isspace(static_cast<unsigned char>(tight.back())))
          tight.pop_back();
      if (space && !tight.empty() && tight.back() == '=') continue;
      tight += ch;
    }
    std::istringstream words(tight);
    std::string kw, who, slot, extra;
    if (!(words >> kw)) return;  // blank
    words >> who >> slot >> extra;
    auto eq = who.find('=');
    auto form = [&](const std::string& why) {
      return UsageError(where + ": " + why + " (expected: rank N=HOST slot=LIST)");
    };
    if (kw != "rank" || eq == std::string::npos || !extra.empty())
      throw form("'" + printable(join(split_words(tight), " "), 80) + "' is not a rankfile line");
    RankfileLine r;
    r.line = lineno;
    auto n = parse_int(who.substr(0, eq), 0, (1 << 22) - 1);
    if (!n) throw form("'" + printable(who.substr(0, eq), 32) + "' is not a rank number");
    r.rank = static_cast<int>(*n);
    r.host = who.substr(eq + 1);
    bool relative = r.host.size() > 2 && r.host.compare(0, 2, "+n") == 0 &&
                    parse_int(r.host.substr(2), 0, INT_MAX);
    if (!relative && !valid_host(r.host))
      throw form("bad host name '" + printable(r.host, 64) + "'");
    if (!slot.empty()) {
      auto seq = slot.find('=');
      std::string key = slot.substr(0, seq);
      if (seq == std::string::npos || (key != "slot" && key != "slots"))
        throw form("'" + printable(slot, 64) + "' is not slot=LIST");
      r.slots = slot.substr(seq + 1);
      if (r.slots.empty()) throw form("slot= is empty");
    }
    out.push_back(std::move(r));
  });
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (size_t i = 0; i < out.size(); ++i) {
    if (i > 0 && out[i].rank == out[i - 1].rank)
      throw UsageError(name + ":" + std::to_string(out[i].line) + ": rank " +
                       std::to_string(out[i].rank) + " is given twice (also on line " +
                       std::to_string(out[i - 1].line) + ")");
    if (out[i].rank != static_cast<int>(i))
      throw UsageError(name + ": rank " + std::to_string(i) +
                       " has no line (the ranks must be 0 to " + std::to_string(out.size() - 1) +
                       ", each once)");
  }
  if (out.empty()) throw UsageError(name + ": no rank lines");
  return out;
}

std::vector<HostSlots> parse_hostfile(std::istream& in, const std::string& name) {
  std::vector<HostSlots> out;
  each_line(in, name, [&](const std::string& line, const std::string& where, int) {
    std::istringstream words(line);
    std::string host;
    if (!(words >> host)) return;
    int slots = 1;
    auto colon = host.find(':');
    if (colon != std::string::npos) {
      slots = parse_slots(host.substr(colon + 1), where);
      host.resize(colon);
    }
    if (!valid_host(host))
      throw UsageError(where + ": bad host name '" + printable(host, 64) + "'");
    std::string w;
    int max_slots = -1;
    bool given = colon != std::string::npos;
    while (words >> w) {
      auto eq = w.find('=');
      std::string key = w.substr(0, eq);
      if (eq == std::string::npos || (key != "slots" && key != "max_slots" && key != "max-slots"))
        throw UsageError(where + ": unknown '" + printable(w, 64) +
                         "' (expected slots=N or max_slots=N)");
      int v = parse_slots(w.substr(eq + 1), where);
      bool twice = key == "slots" ? given : max_slots >= 0;
      if (twice) throw UsageError(where + ": " + key + " given twice for " + host);
      if (key == "slots") {
        slots = v;
        given = true;
      } else {
        max_slots = v;
      }
    }
    if (max_slots >= 0 && slots > max_slots)
      throw UsageError(where + ": " + host + " has slots=" + std::to_string(slots) +
                       ", more than max_slots=" + std::to_string(max_slots));
    if (max_slots >= 0 && !given) slots = max_slots;  // max_slots alone: that many, as mpirun
    add(out, host, slots);
  });
  if (out.empty()) throw UsageError(name + ": no hosts");
  return out;
}

std::vector<HostSlots> parse_host_list(const std::string& spec) {
  std::vector<HostSlots> out;
  for (const auto& item : split(spec, ',')) {
    std::string host = item;
    int slots = 1;
    auto colon = item.find(':');
    if (colon != std::string::npos) {
      slots = parse_slots(item.substr(colon + 1), "-H " + spec);
      host = item.substr(0, colon);
    }
    if (!valid_host(host)) throw UsageError("-H: bad host name '" + host + "' in '" + spec + "'");
    add(out, host, slots);
  }
  return out;
}

bool is_task_step_id(const std::string& step_id) {
  const long long first_special = 0xfffffff0LL;
  return parse_int(step_id, 0, 0xffffffffLL).value_or(first_special) < first_special;
}

std::optional<Allocation> slurm_allocation(const std::map<std::string, std::string>& env) {
  auto get = [&env](const char* k) -> std::string {
    auto it = env.find(k);
    return it == env.end() ? "" : it->second;
  };
  std::string list = get("SLURM_JOB_NODELIST");
  if (list.empty()) list = get("SLURM_NODELIST");
  if (list.empty()) return std::nullopt;
  Allocation a;
  std::string job = get("SLURM_JOB_ID");
  if (job.empty()) job = get("SLURM_JOBID");
  a.source = "SLURM job " + (job.empty() ? std::string("?") : job);
  a.limited = true;
  a.slurm = true;
  auto hosts = expand_hostlist(list);
  std::string counts_var = "SLURM_TASKS_PER_NODE";
  std::string counts = is_task_step_id(get("SLURM_STEP_ID")) ? "" : get("SLURM_TASKS_PER_NODE");
  if (counts.empty()) {
    counts_var = "SLURM_JOB_CPUS_PER_NODE";
    counts = get("SLURM_JOB_CPUS_PER_NODE");
  }
  std::vector<int> slots(hosts.size(), 1);
  if (!counts.empty()) {
    slots = expand_counts(counts_var, counts);
    if (slots.size() != hosts.size())
      throw UsageError(counts_var + "='" + counts + "' names " + std::to_string(slots.size()) +
                       " nodes but SLURM_JOB_NODELIST='" + list + "' has " +
                       std::to_string(hosts.size()));
  }
  if (counts_var == "SLURM_JOB_CPUS_PER_NODE") {
    // Processors, not tasks: the job's --ntasks-per-node where given, else one task per
    // --cpus-per-task processors.
    auto per_node = parse_int(get("SLURM_NTASKS_PER_NODE"), 1, INT_MAX);
    auto per_task = parse_int(get("SLURM_CPUS_PER_TASK"), 1, INT_MAX);
    for (int& s : slots)
      s = per_node ? static_cast<int>(*per_node)
                   : std::max(1, s / static_cast<int>(per_task.value_or(1)));
  }
  for (size_t i = 0; i < hosts.size(); ++i) add(a.nodes, hosts[i], slots[i]);
  return a;
}

namespace {

// -H or --hostfile inside a SLURM allocation: when it names only the allocation's nodes, their
// daemons are started with srun, as mpirun does (there may be no ssh between them).
Allocation within_slurm(Allocation a, const std::map<std::string, std::string>& env) {
  auto nodes = slurm_nodes(env);
  a.slurm = !nodes.empty() && std::all_of(a.nodes.begin(), a.nodes.end(), [&](const HostSlots& h) {
    return std::find(nodes.begin(), nodes.end(), h.host) != nodes.end();
  });
  return a;
}

}  // namespace

std::vector<std::string> slurm_nodes(const std::map<std::string, std::string>& env) {
  std::vector<std::string> out;
  try {
    if (auto a = slurm_allocation(env))
      for (const auto& n : a->nodes) out.push_back(n.host);
  } catch (const UsageError&) {  // its variables do not agree: none
  }
  return out;
}

namespace {

// The names of this machine in a host list (localhost, 127.0.0.1, its name) are one node, under
// the first of them, with their slots added up, as mpirun takes them.
std::vector<HostSlots> one_node_here(std::vector<HostSlots> nodes, const std::string& host) {
  std::vector<HostSlots> out;
  size_t here = nodes.size();  // its index in out, once there
  for (auto& h : nodes) {
    if (is_local_host(h.host, host) && here < out.size()) {
      out[here].slots += h.slots;
      continue;
    }
    if (is_local_host(h.host, host)) here = out.size();
    out.push_back(h);
  }
  return out;
}

}  // namespace

Allocation find_allocation(const std::string& hosts, const std::string& hostfile,
                           const std::map<std::string, std::string>& env, const std::string& host,
                           const std::string& hostfile_option) {
  Allocation a;
  a.limited = true;
  if (!hosts.empty()) {
    a.source = "-H " + hosts;
    a.nodes = one_node_here(parse_host_list(hosts), host);
    return within_slurm(std::move(a), env);
  }
  if (!hostfile.empty()) {
    std::ifstream in(hostfile);
    if (!in)
      throw UsageError(hostfile_option + ": cannot open '" + hostfile +
                       "': " + std::strerror(errno));
    struct stat st;
    if (::stat(hostfile.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      throw UsageError(hostfile_option + ": '" + hostfile + "' is a directory");
    a.source = "hostfile " + hostfile;
    a.nodes = one_node_here(parse_hostfile(in, hostfile), host);
    return within_slurm(std::move(a), env);
  }
  if (auto s = slurm_allocation(env)) return *s;
  a.source = "this machine";
  a.limited = false;
  a.nodes.push_back(HostSlots{host, 0});
  return a;
}

bool is_local_host(const std::string& name, const std::string& hostname) {
  std::string shortname = hostname.substr(0, hostname.find('.'));
  return name == "localhost" || name == "127.0.0.1" || name == hostname || name == shortname;
}

std::vector<HostSlots> without_local_host(std::vector<HostSlots> hosts,
                                          const std::string& hostname) {
  hosts.erase(std::remove_if(hosts.begin(), hosts.end(),
                             [&](const HostSlots& h) { return is_local_host(h.host, hostname); }),
              hosts.end());
  return hosts;
}

Allocation without_local_host(Allocation a, const std::string& hostname, bool may_wait) {
  if (!a.limited && a.nodes.size() <= 1)  // this machine alone
    throw UsageError("--nolocal: no node is given but this machine (" + hostname +
                     "): name the others with -H, --hostfile, a rankfile or a SLURM allocation");
  a.nodes = without_local_host(std::move(a.nodes), hostname);
  if (a.nodes.empty() && !may_wait)
    throw UsageError("--nolocal: " + a.source + " lists no node but this machine (" + hostname +
                     ")");
  return a;
}

std::string format_allocation(const Allocation& a) {
  std::ostringstream os;
  os << "allocation (" << a.source << "): " << a.nodes.size() << " node(s)\n";
  for (const auto& n : a.nodes) {
    os << "  " << n.host << " slots=";
    if (a.limited)
      os << n.slots;
    else
      os << "unlimited";
    os << "\n";
  }
  return os.str();
}

}  // namespace pe
