#include "exec/frontend/stdio.hpp"

#include <cstdint>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "common/error.hpp"
#include "common/strings.hpp"
#include "exec/ctrl/heartbeat.hpp"

namespace pe {

std::string format_timestamp(const struct timespec& ts) {
  struct tm tm;
  localtime_r(&ts.tv_sec, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, "[%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%06ld]", static_cast<long>(ts.tv_nsec / 1000));
  return buf;
}

std::string line_prefix(const OutputOptions& o, int generation, int rank, Stream s,
                        const std::string& timestamp, int spawn) {
  std::string p;
  if (o.timestamp) p = timestamp;
  if (o.tag) {
    p += "[" + std::to_string(generation + 1) + (spawn ? "." + std::to_string(spawn) : "") + "," +
         std::to_string(rank) + "]";
    p += s == Stream::Out ? "<stdout>:" : "<stderr>:";
  } else if (o.timestamp) {
    p += ' ';
  }
  return p;
}

std::string prefix_lines(std::string_view lines, const std::string& prefix, bool continuing) {
  std::string out;
  out.reserve(lines.size() + prefix.size() * 8);
  size_t start = 0;
  while (start < lines.size()) {
    size_t nl = lines.find('\n', start);
    size_t end = nl == std::string_view::npos ? lines.size() : nl + 1;
    if (start > 0 || !continuing) out += prefix;
    out.append(lines.substr(start, end - start));
    start = end;
  }
  return out;
}

std::vector<std::string> last_lines(std::string_view text, size_t max_lines) {
  std::vector<std::string> out;
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  while (!text.empty() && out.size() < max_lines) {
    size_t nl = text.rfind('\n');
    size_t start = nl == std::string_view::npos ? 0 : nl + 1;
    out.insert(out.begin(), std::string(text.substr(start)));
    if (nl == std::string_view::npos) break;
    text = text.substr(0, nl);
  }
  return out;
}

std::optional<StdStreams> parse_std_streams(const std::string& v) {
  auto stream = [](const std::string& d) -> std::optional<int> {
    if (d.size() != 1 || d[0] < '0' || d[0] > '3') return std::nullopt;
    return d[0] - '0';
  };
  StdStreams out;
  if (auto all = stream(v)) {
    out.all = *all;
    return out;
  }
  if (v.empty()) return std::nullopt;
  for (const auto& item : split(v, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos) return std::nullopt;
    auto local = parse_int(item.substr(0, colon), 0, INT_MAX);
    auto s = stream(item.substr(colon + 1));
    if (!local || !s) return std::nullopt;
    out.by_local[static_cast<int>(*local)] = *s;
  }
  return out;
}

std::string expand_prefix_template(const std::string& tmpl, const std::string& role,
                                   int local_rank, int rank, const std::string& host) {
  const std::pair<const char*, std::string> macros[] = {{"role_name", role},
                                                        {"local_rank", std::to_string(local_rank)},
                                                        {"rank", std::to_string(rank)},
                                                        {"hostname", host}};
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    bool done = false;
    if (tmpl.compare(i, 2, "$$") == 0) {  // an escaped '$', as in Python's string.Template
      out += '$';
      i += 2;
      continue;
    }
    if (tmpl[i] == '$')
      for (const auto& [name, value] : macros) {
        std::string braced = std::string("${") + name + "}", bare = std::string("$") + name;
        bool b = tmpl.compare(i, braced.size(), braced) == 0;
        // Bare: the name must end there ($rank_x is no macro, as in Python's string.Template).
        size_t end = i + bare.size();
        bool n = !b && tmpl.compare(i, bare.size(), bare) == 0 &&
                 (end == tmpl.size() || !(std::isalnum(static_cast<unsigned char>(tmpl[end])) ||
                                          tmpl[end] == '_'));
        if (b || n) {
          out += value;
          i += b ? braced.size() : bare.size();
          done = true;
          break;
        }
      }
    if (!done) out += tmpl[i++];
  }
  return out;
}

OutputOptions output_options(const LaunchConfig& cfg, const std::string& run_id) {
  OutputOptions o;
  o.tag = cfg.tag_output;
  o.timestamp = cfg.timestamp_output;
  o.dir = cfg.output_dir;
  o.copy = cfg.output_copy;
  o.torch = cfg.torch_logs;
  o.run_id = run_id;
  o.merge = cfg.merge_stderr;
  return o;
}

OutputSink::OutputSink(OutputOptions o, int nranks, int out_fd, int err_fd)
    : opts_(std::move(o)),
      out_fd_(out_fd),
      err_fd_(opts_.merge ? out_fd : err_fd),
      own_fd_(err_fd),
      tails_(static_cast<size_t>(nranks)) {
  // stdout and stderr on one terminal or pipe (2>&1): one line, whichever stream writes it.
  struct stat a, b;
  same_file_ = ::fstat(out_fd, &a) == 0 && ::fstat(err_fd, &b) == 0 && a.st_dev == b.st_dev &&
               a.st_ino == b.st_ino;
}

namespace {

void make_dir(const std::string& d, const char* what = "--output-filename") {
  if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST)
    throw SystemError(std::string(what) + ": cannot create " + d, errno);
}

// `d` and the directories above it.
void make_dirs(const std::string& d, const char* what) {
  for (size_t pos = 1; (pos = d.find('/', pos)) != std::string::npos; ++pos)
    make_dir(d.substr(0, pos), what);
  make_dir(d, what);
}

// The directories the files go into: created, or existing ones of this user that are not
// symbolic links (someone else's directory, or a link, could send the output anywhere).
void make_own_dir(const std::string& d) {
  make_dir(d);
  struct stat st {};
  if (::lstat(d.c_str(), &st) != 0) throw SystemError("--output-filename: " + d, errno);
  if (S_ISLNK(st.st_mode))
    throw Error("--output-filename: " + d + " is a symbolic link; refusing to write through it");
  if (!S_ISDIR(st.st_mode)) throw Error("--output-filename: " + d + " is not a directory");
  if (st.st_uid != ::geteuid())
    throw Error("--output-filename: " + d + " belongs to another user; refusing to write into it");
}

UniqueFd open_log(const std::string& path, const char* what) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0 && errno == ELOOP)
    throw Error(std::string(what) + ": " + path + " is a symbolic link; refusing to follow it");
  if (fd < 0) throw SystemError(std::string(what) + ": cannot open " + path, errno);
  return UniqueFd(fd);
}

// `rd`/stdout and `rd`/stderr, `rd` created first.
void open_process_files(const std::string& rd, UniqueFd& out, UniqueFd& err) {
  make_own_dir(rd);
  out = open_log(rd + "/stdout", "--output-filename");
  err = open_log(rd + "/stderr", "--output-filename");
}

}  // namespace

std::string spawned_output_dir(const std::string& dir, int generation, int spawn, int rank) {
  return dir + "/" + std::to_string(generation + 1) + "." + std::to_string(spawn) + "/rank." +
         std::to_string(rank);
}

void OutputSink::open_files() {
  if (opts_.torch.files() && run_dir_.empty()) make_run_dir();
  if (opts_.dir.empty()) return;
  std::string dir = opts_.dir;
  if (!files_open_) {
    try {  // the directory given is a usage error (exit 2), a rank's within it is not
      make_dirs(dir, "--output-filename");
      make_own_dir(dir);
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    files_open_ = true;
  }
  for (size_t r = files_out_.size(); r < tails_.size(); ++r) {
    UniqueFd out, err;
    open_process_files(dir + "/rank." + std::to_string(r), out, err);
    files_out_.push_back(std::move(out));
    files_err_.push_back(std::move(err));
  }
}

// torchrun's run directory: LOG_DIR/RUN_ID_XXXXXX, LOG_DIR a new TMPDIR/torchelastic_XXXXXX
// when --log-dir is not given (as torchrun's).  Said in one line, since its name is new.
void OutputSink::make_run_dir() {
  try {  // --log-dir is a usage error (exit 2)
    std::string base = opts_.torch.log_dir;
    if (base.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      std::string t = tmp && *tmp ? tmp : "/tmp";
      std::string tpl = t + "/torchelastic_XXXXXX";
      if (!::mkdtemp(tpl.data()))
        throw SystemError("--redirects/--tee: cannot create a log directory in " + t, errno);
      base = tpl;
    } else {
      make_dirs(base, "--log-dir");
    }
    std::string id = opts_.run_id.empty() ? "none" : opts_.run_id;
    std::replace(id.begin(), id.end(), '/', '_');
    std::string tpl = base + "/" + id + "_XXXXXX";
    if (!::mkdtemp(tpl.data())) throw SystemError("--log-dir: cannot create a directory in " + base, errno);
    run_dir_ = tpl;
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  message("pytorch_exec: the ranks' logs (--redirects, --tee) are in " + run_dir_ + "\n");
}

void OutputSink::start_generation(int generation, int restart_count, const JobMap& map,
                                  int node) {
  grow(map.world_size);
  while (!labels_.empty() && labels_.begin()->first < generation - 1) labels_.erase(labels_.begin());
  auto& labels = labels_[generation];
  labels.clear();
  for (size_t n = 0; n < map.nodes.size(); ++n) {
    if (node >= 0 && static_cast<size_t>(node) != n) continue;
    const NodeMap& nm = map.nodes[n];
    for (size_t l = 0; l < nm.ranks.size(); ++l)
      labels[nm.ranks[l]] = RankLabel{static_cast<int>(l), nm.host};
  }
  if (run_dir_.empty()) return;
  while (!torch_files_.empty() && torch_files_.begin()->first < generation - 1) {
    for (const auto& [rank, f] : torch_files_.begin()->second)
      for (int fd : {f.out.get(), f.err.get()}) file_lines_.erase(fd);
    torch_files_.erase(torch_files_.begin());
  }
  auto& files = torch_files_[generation];
  files.clear();
  std::string ad = run_dir_ + "/attempt_" + std::to_string(restart_count);
  make_dir(ad, "--log-dir");
  for (const auto& [rank, label] : labels) {
    int streams = opts_.torch.redirects.of(label.local_rank) | opts_.torch.tee.of(label.local_rank);
    // Named as torchrun's agent names them, by local rank, where this sink prints one node's
    // ranks; by rank where it prints every node's (one directory for all).
    std::string rd = ad + "/" + std::to_string(node >= 0 ? label.local_rank : rank);
    make_dir(rd, "--log-dir");
    ProcessFiles& f = files[rank];
    if (streams & 1) f.out = open_log(rd + "/stdout.log", "--log-dir");
    if (streams & 2) f.err = open_log(rd + "/stderr.log", "--log-dir");
  }
}

// torchrun's rules: a stream redirected and not tee'd, or of a local rank that
// --local-ranks-filter leaves out, stays off the terminal; a tee'd one gets a prefix there.
bool OutputSink::to_console(int generation, int rank, Stream s, std::string& tee_prefix) const {
  const TorchLogs& t = opts_.torch;
  if (t.console_ranks.empty() && !t.files()) return true;
  static const std::map<int, RankLabel> kNone;
  auto g = labels_.find(generation);
  const auto& labels = g != labels_.end() ? g->second : kNone;
  auto it = labels.find(rank);
  int local = it != labels.end() ? it->second.local_rank : rank;
  const auto& f = t.console_ranks;
  if (!f.empty() && std::find(f.begin(), f.end(), local) == f.end()) return false;
  int bit = s == Stream::Out ? 1 : 2;
  if (t.tee.of(local) & bit) {
    tee_prefix = expand_prefix_template(
        t.prefix_template.empty() ? "[${role_name}${local_rank}]:" : t.prefix_template, t.role,
        local, rank, it != labels.end() ? it->second.host : "");
    return true;
  }
  return !(t.redirects.of(local) & bit);
}

// The --output-filename file (or torchrun's log file) of a process's stream s, else -1.
int OutputSink::file_of(int generation, int spawn, int rank, Stream s) {
  if (!spawn && !run_dir_.empty()) {
    auto g = torch_files_.find(generation);
    if (g == torch_files_.end()) return -1;
    auto it = g->second.find(rank);
    if (it == g->second.end()) return -1;
    return (s == Stream::Out ? it->second.out : it->second.err).get();
  }
  if (opts_.dir.empty() || !files_open_) return -1;
  if (spawn) return spawned_file(generation, spawn, rank, s);
  if (rank < 0 || static_cast<size_t>(rank) >= files_out_.size()) return -1;
  return (s == Stream::Out ? files_out_ : files_err_)[static_cast<size_t>(rank)].get();
}

// A spawned process's files, opened at its first output.  One that cannot be opened is said
// once; its output then goes to the terminal only.
int OutputSink::spawned_file(int generation, int spawn, int rank, Stream s) {
  auto key = std::make_tuple(generation, spawn, rank);
  auto it = spawned_files_.find(key);
  if (it == spawned_files_.end()) {
    ProcessFiles& f = spawned_files_[key];
    try {
      std::string gd = spawned_output_dir(opts_.dir, generation, spawn, rank);
      make_own_dir(gd.substr(0, gd.rfind('/')));
      open_process_files(gd, f.out, f.err);
    } catch (const Error& e) {
      std::string line = std::string("pytorch_exec: ") + e.what() + "\n";
      write_all(own_fd_, line.data(), line.size());
    }
    it = spawned_files_.find(key);
  }
  return (s == Stream::Out ? it->second.out : it->second.err).get();
}

void OutputSink::grow(int nranks) {
  if (nranks <= static_cast<int>(tails_.size())) return;
  tails_.resize(static_cast<size_t>(nranks));
  if (files_open_) open_files();
}

void OutputSink::write(int generation, int rank, Stream s, std::string_view lines, int spawn) {
  if (lines.empty()) return;
  // Spawned processes: their own files (spawned_output_dir), no tails (those are the ranks').
  size_t r = spawn ? SIZE_MAX : static_cast<size_t>(rank);
  if (s == Stream::Err && r < tails_.size()) {
    std::string& t = tails_[r];
    t.append(lines);
    if (t.size() > 2 * kTailBytes) t.erase(0, t.size() - kTailBytes);
  }
  std::string ts;
  if (opts_.timestamp) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    ts = format_timestamp(now);
  }
  Who who{generation, spawn, rank, s};
  if (int fd = file_of(generation, spawn, rank, s); fd >= 0) {
    // One writer per file, one after another across generations: a new generation's output
    // starts on a line of its own.
    std::string text = carry(file_lines_[fd], who, lines, opts_.timestamp ? ts + " " : "");
    write_all(fd, text.data(), text.size());
    if (!opts_.copy) return;
  }
  std::string tee_prefix;
  if (!spawn && !to_console(generation, rank, s, tee_prefix)) return;
  bool& broken = s == Stream::Out ? out_broken_ : err_broken_;
  if (broken) return;
  int fd = s == Stream::Out ? out_fd_ : err_fd_;
  std::string& held = s == Stream::Out ? out_held_ : err_held_;
  bool prefixed = opts_.tag || opts_.timestamp;
  std::string text =
      carry(line_of(s), who, lines,
            (prefixed ? line_prefix(opts_, generation, rank, s, ts, spawn) : "") + tee_prefix);
  std::string_view data = text;
  if (!held.empty()) {  // what a signal interrupted goes first
    held.append(data);
    data = held;
  }
  bool ok = write_out(fd, data);
  int err = errno;
  std::string rest(ok ? std::string_view() : data);
  held.swap(rest);
  if (ok || err == EINTR) return;  // a signal came (write_out): the rest is held for next time
  held.clear();
  broken = true;  // from now on dropped (EAGAIN: nobody took it while the job stops)
  if (err == EPIPE && closed_) closed_(s);  // the reader went away (not: stdout closed, >&-)
}

// Everything to the terminal or pipe `fd`, a page at a time once it can take one; while it
// cannot, waiting_ every every_ seconds.  What was written is taken off the front of `data`.
// False on an error (errno says which: EPIPE, the reader went away), or when the wait gave up
// (errno EINTR: a signal came; EAGAIN: it took longer than every_ after stop_waiting()).
bool OutputSink::write_out(int fd, std::string_view& data) {
  while (!data.empty()) {
    double wait = every_;
    if (deadline_ > 0) {
      double left = deadline_ - ctrl::Heartbeats::steady_seconds();
      if (left <= 0) {  // the time limit: the loop is to run its timer (like a signal)
        errno = EINTR;
        return false;
      }
      wait = std::min(wait, left);
    }
    struct pollfd p[2] = {{fd, POLLOUT, 0}, {interrupt_fd_, POLLIN, 0}};
    int r = ::poll(p, interrupt_fd_ >= 0 ? 2 : 1, static_cast<int>(wait * 1000) + 1);
    if (r < 0 && errno != EINTR) return false;
    if (r > 0 && (p[1].revents & POLLIN)) {
      errno = EINTR;
      return false;
    }
    if (r == 0 && stop_waiting_) {
      errno = EAGAIN;
      return false;
    }
    if (r == 0 && waiting_) waiting_();
    if (r <= 0) continue;
    ssize_t n = ::write(fd, data.data(), std::min<size_t>(data.size(), 4096));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// `lines` of `who` as they go onto a terminal or file whose last line is `open` (updated): a
// partial line of another writer (or stream, or generation) is ended first, so that lines do
// not mix; with a prefix, each line gets it but the rest of the writer's own partial line.
// Without one, a writer's bytes stay as they are.
std::string OutputSink::carry(OpenLine& open, const Who& who, std::string_view lines,
                              const std::string& prefix) {
  bool continuing = open.mid && open.who == who;
  std::string out = open.mid && !continuing ? "\n" : "";
  if (prefix.empty())
    out.append(lines);
  else
    out += prefix_lines(lines, prefix, continuing);
  open.mid = lines.back() != '\n';
  open.who = who;
  return out;
}

void OutputSink::flush() {
  for (auto [fd, held, broken, open] :
       {std::tuple{out_fd_, &out_held_, out_broken_, &line_of(Stream::Out)},
        std::tuple{err_fd_, &err_held_, err_broken_, &line_of(Stream::Err)}}) {
    // A prefixed partial last line is ended; without prefixes the bytes stay as they were.
    if (open->mid && (opts_.tag || opts_.timestamp || opts_.torch.tee.any()))
      held->push_back('\n');
    open->mid = false;
    std::string_view data = *held;
    if (!broken && !data.empty()) write_out(fd, data);
    held->clear();
  }
  for (auto& [fd, open] : file_lines_)
    if (open.mid && opts_.timestamp) write_all(fd, "\n", 1);  // as on the terminal
  file_lines_.clear();
}

void OutputSink::message(const std::string& text) {
  OpenLine& open = line_of(Stream::Err);
  std::string line = open.mid ? "\n" + text : text;  // not after a rank's partial line
  open.mid = false;
  write_all(own_fd_, line.data(), line.size());
}

std::vector<std::string> OutputSink::stderr_tail(int rank, size_t max_lines) const {
  if (rank < 0 || static_cast<size_t>(rank) >= tails_.size()) return {};
  return last_lines(tails_[static_cast<size_t>(rank)], max_lines);
}

void OutputSink::clear_tails() {
  for (auto& t : tails_) t.clear();
}

}  // namespace pe
