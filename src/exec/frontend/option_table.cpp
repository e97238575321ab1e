#include "exec/frontend/option_table.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <sstream>

#include "common/error.hpp"
#include "common/strings.hpp"

namespace po = boost::program_options;

namespace pe {
namespace {

using Table = std::vector<OptionSyntax>;

const OptionSyntax* find_long(const Table& table, const std::string& name) {
  std::string n = name;
  for (char& c : n)
    if (c == '_') c = '-';  // torchrun spells --nproc_per_node, --max_restarts
  for (const auto& o : table)
    if (n == o.name) return &o;
  return nullptr;
}

const OptionSyntax* find_short(const Table& table, char c) {
  for (const auto& o : table)
    if (o.short_name == c || (o.short_alias && o.short_alias == c)) return &o;
  return nullptr;
}

void add_option(po::options_description& desc, const OptionSyntax& o) {
  std::string names = o.name;
  if (o.short_name) names += std::string(",") + o.short_name;
  switch (o.kind) {
    case OptionKind::Flag:
    case OptionKind::Counted:
      desc.add_options()(names.c_str(), po::bool_switch(), o.help);
      break;
    case OptionKind::Value:
      desc.add_options()(names.c_str(), po::value<std::string>()->value_name(o.value_name), o.help);
      break;
    case OptionKind::List:
      desc.add_options()(
          names.c_str(),
          po::value<std::vector<std::string>>()->composing()->value_name(o.value_name), o.help);
      break;
  }
}

// With no groups, every option directly under `title`.
po::options_description describe(const Table& table, const std::string& title,
                                 const std::vector<std::string>& groups) {
  po::options_description all(title, 100, 50);
  if (groups.empty())
    for (const auto& o : table) add_option(all, o);
  for (const auto& g : groups) {
    po::options_description group(g, 100, 50);
    for (const auto& o : table)
      if (g == o.group) add_option(group, o);
    all.add(group);
  }
  return all;
}

// The options part of argv split into named options with their values (so Boost never has to
// guess whether "-1" is a value, nor meets "--name=" with an empty value, which its own tokenizer
// rejects before we could name the problem), counted flags counted, and the rest split off.
struct Prescan {
  std::vector<po::option> options;
  std::map<std::string, int> counts;
  std::vector<std::string> rest;
};

void take(Prescan& p, const OptionSyntax* o, const std::optional<std::string>& inline_value,
          const std::vector<std::string>& toks, size_t& i, const std::string& spelled) {
  if (o->kind == OptionKind::Counted || o->kind == OptionKind::Flag) {
    if (inline_value) throw UsageError("option " + spelled + " takes no value");
    if (o->kind == OptionKind::Counted)
      ++p.counts[o->name];
    else
      p.options.emplace_back(o->name, std::vector<std::string>{});
    return;
  }
  std::string value;
  if (std::string(o->value_name).find(' ') != std::string::npos) {  // "KEY VALUE": two words
    if (inline_value || i + 2 >= toks.size())
      throw UsageError("option " + spelled + " needs two values: " + spelled + " " +
                       o->value_name);
    value = toks[i + 1] + '\0' + toks[i + 2];
    i += 2;
  } else if (inline_value) {
    value = *inline_value;
  } else {
    if (i + 1 >= toks.size()) throw UsageError("option " + spelled + " needs a value");
    value = toks[++i];
  }
  p.options.emplace_back(o->name, std::vector<std::string>{value});
}

// Short options: "-n4", "-n 4", "-vv", "-x FOO=1".
void take_shorts(Prescan& p, const Table& table, const std::vector<std::string>& toks, size_t& i) {
  const std::string& t = toks[i];
  for (size_t k = 1; k < t.size(); ++k) {
    const OptionSyntax* s = find_short(table, t[k]);
    // ("-machinefile" with an unknown name: named whole, not by its first unknown letter)
    if (!s) throw UsageError("unknown option " + (t.size() > 2 ? t : std::string("-") + t[k]));
    if (s->kind == OptionKind::Value || s->kind == OptionKind::List) {
      std::optional<std::string> v;
      if (k + 1 < t.size()) v = t.substr(k + 1);
      take(p, s, v, toks, i, std::string("-") + t[k]);
      return;
    }
    take(p, s, std::nullopt, toks, i, std::string("-") + t[k]);
  }
}

Prescan prescan(const Table& table, const std::vector<std::string>& toks) {
  Prescan p;
  size_t i = 0;
  for (; i < toks.size(); ++i) {
    const std::string& t = toks[i];
    if (t == "--") {
      ++i;
      break;
    }
    if (t.size() < 2 || t[0] != '-') break;  // the rest (pytorch_exec: the program)
    bool dashdash = t[1] == '-';
    std::string body = t.substr(dashdash ? 2 : 1);
    std::string name = body.substr(0, body.find('='));
    std::optional<std::string> inline_value;
    if (body.find('=') != std::string::npos) inline_value = body.substr(body.find('=') + 1);
    // "--name", and mpirun's single-dash long names ("-np", "-wdir").
    const OptionSyntax* o = (dashdash || name.size() > 1) ? find_long(table, name) : nullptr;
    if (o) {
      take(p, o, inline_value, toks, i, (dashdash ? "--" : "-") + name);
      continue;
    }
    if (dashdash) throw UsageError("unknown option --" + name);
    take_shorts(p, table, toks, i);
  }
  p.rest.assign(toks.begin() + static_cast<long>(std::min(i, toks.size())), toks.end());
  return p;
}

}  // namespace

ParsedArgs parse_args(const Table& table, const std::vector<std::string>& args) {
  Prescan p = prescan(table, args);
  po::variables_map vm;
  const po::options_description desc = describe(table, "", {});  // the parser keeps a pointer
  try {
    po::parsed_options parsed(&desc, po::command_line_style::allow_long);  // "--name" in messages
    parsed.options = std::move(p.options);
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const po::multiple_occurrences& e) {
    // Boost names the long form ("--np"): name the short one too, which is what users type.
    std::string name = e.get_option_name();
    for (const auto& o : table)
      if ("--" + std::string(o.name) == name && o.short_name)
        name = std::string("-") + o.short_name +
               (o.short_alias ? std::string(" or -") + o.short_alias : std::string()) + " (" +
               name + ")";
    throw UsageError("option " + name + " is given more than once");
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  ParsedArgs out;
  for (const auto& o : table) {
    if (o.kind == OptionKind::Counted && p.counts[o.name] > 0)
      out.given[o.name].assign(static_cast<size_t>(p.counts[o.name]), "");
    if (o.kind == OptionKind::Flag && vm[o.name].as<bool>()) out.given[o.name];
    if (o.kind == OptionKind::Value && vm.count(o.name))
      out.given[o.name] = {vm[o.name].as<std::string>()};
    if (o.kind == OptionKind::List && vm.count(o.name))
      out.given[o.name] = vm[o.name].as<std::vector<std::string>>();
  }
  out.rest = std::move(p.rest);
  return out;
}

std::string describe_options(const Table& table, const std::string& title,
                             const std::vector<std::string>& groups) {
  std::ostringstream os;
  os << describe(table, title, groups);
  return os.str();
}

double positive_seconds(const std::string& opt, const std::string& v) {
  auto s = parse_seconds(v);
  if (!s || !(*s > 0 && *s <= 3600))
    throw UsageError(opt + ": '" + v + "' is not a number of seconds in (0, 3600]");
  return *s;
}

}  // namespace pe
