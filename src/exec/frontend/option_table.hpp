// Command lines described by one table per program (pytorch_exec, pytorch_execd): each row names
// an option, its --help text and the member of the program's raw-options struct that receives it.
// Boost.Program_options checks and stores the options and formats --help; a prescan splits argv
// first, so that "-1" can be a value, "--name=" an empty one, mpirun's single-dash long names
// ("-np") work, and every mistake is one UsageError naming the option.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace pe {

// In the order of OptionDef::field's alternatives.
enum class OptionKind { Flag, Counted, Value, List };

struct OptionSyntax {
  const char* name;  // long name
  char short_name;   // 0: none
  OptionKind kind;
  const char* group;       // --help section
  const char* value_name;  // nullptr for flags
  const char* help;
  char short_alias = 0;  // a second short name (mpirun's -c for -n), not shown by --help
};

// One row of a program's table.  The member's type is the option's kind: bool a flag, int a
// flag counted (-vv), std::optional<std::string> a value, std::vector<std::string> a repeatable
// value.  A value named with two words ("KEY VALUE", mpirun's --mca) takes the next two words,
// stored joined by a NUL byte (which no argument holds).
template <typename Raw>
struct OptionDef {
  const char* name;
  char short_name;
  const char* group;
  const char* value_name;
  const char* help;
  std::variant<bool Raw::*, int Raw::*, std::optional<std::string> Raw::*,
               std::vector<std::string> Raw::*>
      field;
  char short_alias = 0;

  OptionSyntax syntax() const {
    return {name, short_name, static_cast<OptionKind>(field.index()), group, value_name,
            help, short_alias};
  }
};

struct ParsedArgs {
  std::map<std::string, std::vector<std::string>> given;  // by long name: values (one "" per
                                                          // use of a counted flag)
  std::vector<std::string> rest;  // from the first word that is not an option, or after "--"
};

// Throws UsageError for unknown options, missing or unwanted values, repeated single values.
ParsedArgs parse_args(const std::vector<OptionSyntax>& table, const std::vector<std::string>& args);

// The options of `groups` (in that order) under `title`, as --help shows them.
std::string describe_options(const std::vector<OptionSyntax>& table, const std::string& title,
                             const std::vector<std::string>& groups);

// A number of seconds in (0, 3600] given with option `opt`, else a UsageError:
// "OPT: 'V' is not a number of seconds in (0, 3600]".
double positive_seconds(const std::string& opt, const std::string& v);

namespace detail {
inline void assign(bool& to, const std::vector<std::string>&) { to = true; }
inline void assign(int& to, const std::vector<std::string>& v) { to = static_cast<int>(v.size()); }
inline void assign(std::optional<std::string>& to, const std::vector<std::string>& v) {
  to = v.at(0);
}
inline void assign(std::vector<std::string>& to, const std::vector<std::string>& v) { to = v; }
}  // namespace detail

template <typename Raw, std::size_t N>
std::vector<OptionSyntax> syntax_of(const OptionDef<Raw> (&table)[N]) {
  std::vector<OptionSyntax> out;
  for (const auto& o : table) out.push_back(o.syntax());
  return out;
}

// argv[1..] into a Raw (value-initialised, then each given option stored through its row); the
// words from the first non-option on go to `rest`.
template <typename Raw, std::size_t N>
Raw parse_into(const OptionDef<Raw> (&table)[N], int argc, const char* const* argv,
               std::vector<std::string>& rest) {
  std::vector<std::string> args;
  if (argc > 1) args.assign(argv + 1, argv + argc);
  ParsedArgs p = parse_args(syntax_of(table), args);
  Raw raw{};
  for (const auto& o : table) {
    auto it = p.given.find(o.name);
    if (it != p.given.end())
      std::visit([&raw, &it](auto member) { detail::assign(raw.*member, it->second); }, o.field);
  }
  rest = std::move(p.rest);
  return raw;
}

}  // namespace pe
