// Small string helpers shared by the command line, allocation parsers and the wire codec.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace pe {

std::vector<std::string> split(const std::string& s, char sep);

// Parses a whole string as a base-10 integer in [min, max]; nullopt for anything else
// (empty, sign where not allowed, trailing junk, overflow).
std::optional<long long> parse_int(const std::string& s, long long min, long long max);

// Parses a non-negative decimal number of seconds such as "5", "0.5"; nullopt otherwise.
std::optional<double> parse_seconds(const std::string& s);

// A valid environment variable name: [A-Za-z_][A-Za-z0-9_]*.
bool is_env_name(const std::string& s);

}  // namespace pe
