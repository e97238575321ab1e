// Small string helpers shared by the command line, allocation parsers and the wire codec.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace pe {

std::vector<std::string> split(const std::string& s, char sep);
// Words separated by blanks; single or double quotes group words ("a 'b c'" -> a, b c).
// Throws pe::UsageError for an unterminated quote.
std::vector<std::string> split_words(const std::string& s);
std::string join(const std::vector<std::string>& v, const std::string& sep);

// Parses a whole string as a base-10 integer in [min, max]; nullopt for anything else
// (empty, sign where not allowed, trailing junk, overflow).
std::optional<long long> parse_int(const std::string& s, long long min, long long max);

// Parses a non-negative decimal number of seconds such as "5", "0.5"; nullopt otherwise.
std::optional<double> parse_seconds(const std::string& s);
// Seconds as parse_seconds reads them back and a person reads them: "5", "0.5", "600".
std::string seconds_text(double s);

// A valid environment variable name: [A-Za-z_][A-Za-z0-9_]*.
bool is_env_name(const std::string& s);
// Untrusted text made safe for a terminal or a log line: non-printable bytes (escape sequences,
// newlines) as \xNN, a backslash as \\, cut after `max` bytes with "...".
std::string printable(const std::string& s, size_t max = 128);

}  // namespace pe
