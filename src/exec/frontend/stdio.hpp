// Output of the ranks as the user sees it: prefixes (--tag-output, --timestamp-output), the
// terminal, per-rank files (--output-filename, or torchrun's --log-dir with --redirects/--tee),
// torchrun's --local-ranks-filter, and the tail of each rank's stderr for the failure report.
// The formatting and parsing functions are pure.
//
// Threading: used from the event-loop thread only.
#pragma once

#include <ctime>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <optional>

#include "common/unique_fd.hpp"
#include "exec/frontend/job_map.hpp"
#include "exec/frontend/launch_config.hpp"

namespace pe {

enum class Stream { Out, Err };

struct OutputOptions {
  bool tag = false;
  bool timestamp = false;
  std::string dir;   // per-rank files; empty: none
  bool copy = true;  // also to the terminal when dir is set
  TorchLogs torch;     // torchrun's logs (not with dir)
  std::string run_id;  // TORCHELASTIC_RUN_ID: the prefix of torchrun's run directory
  bool merge = false;  // --merge-stderr-to-stdout: the ranks' stderr goes where their stdout does
};

// The launch's output options; `run_id`: its TORCHELASTIC_RUN_ID.
OutputOptions output_options(const LaunchConfig& cfg, const std::string& run_id);

// torchrun's --redirects/--tee value ("3", "0:1,1:2"), or nothing when it is not one.
std::optional<StdStreams> parse_std_streams(const std::string& v);
// A tee'd line's prefix on the terminal: torchrun's template with ${role_name}, ${local_rank},
// ${rank} and ${hostname} (also without braces) replaced and "$$" made "$"; other '$' text stays
// as it is.
std::string expand_prefix_template(const std::string& tmpl, const std::string& role,
                                   int local_rank, int rank, const std::string& host);

// "[2026-11-22T10:00:00.123456]" in local time.
std::string format_timestamp(const struct timespec& ts);
// The prefix of each line: "[ts]" and/or "[G,RANK]<stdout>:" ("[G.S,RANK]" for spawned job S
// of generation G, MPI_Comm_spawn); when only a timestamp is asked for, it is followed by a space.
std::string line_prefix(const OutputOptions& o, int generation, int rank, Stream s,
                        const std::string& timestamp, int spawn = 0);
// Where --output-filename DIR puts the files of rank `rank` of spawned job `spawn` of generation
// `generation` (from 0): "DIR/G.N/rank.R", named as --tag-output tags its lines ("[G.N,R]").
std::string spawned_output_dir(const std::string& dir, int generation, int spawn, int rank);
// Puts `prefix` before every line of `lines` (the last may lack its '\n'); `continuing`: the
// first goes on a partial line written before, without a prefix.
std::string prefix_lines(std::string_view lines, const std::string& prefix,
                         bool continuing = false);
// The last `max_lines` lines of `text`.
std::vector<std::string> last_lines(std::string_view text, size_t max_lines);

class OutputSink {
 public:
  OutputSink(OutputOptions o, int nranks, int out_fd = 1, int err_fd = 2);
  // Creates DIR/rank.N/{stdout,stderr} (of ranks that have none yet); throws SystemError with
  // the path.
  void open_files();
  // Elastic arrivals: the job has `nranks` ranks now (more tails, and files once open).
  void grow(int nranks);
  // Generation `generation` (TORCHELASTIC_RESTART_COUNT `restart_count`) runs on `map`; this
  // sink prints the ranks of node `node` of it (-1: of every node).  Ranks' local ranks and
  // hosts are taken from it (the console filter, tee prefixes), and with torchrun's logs their
  // files RUN_DIR/attempt_<restart_count>/<R>/{stdout,stderr}.log are created, R the local rank
  // (one node's sink, as torchrun's agent) or the rank (node -1).  Throws SystemError with the
  // path.
  void start_generation(int generation, int restart_count, const JobMap& map, int node = -1);
  // torchrun's run directory (LOG_DIR/RUN_ID_XXXXXXXX), created by open_files; empty: none.
  const std::string& run_dir() const { return run_dir_; }
  // While the terminal or pipe does not take our output, `waiting` is called every `every`
  // seconds (pytorch_exec's daemons keep hearing from it: its loop waits here).  When
  // `interrupt_fd` (SignalPipe's) becomes readable, the wait gives up, so that the loop gets
  // to the signal; the rest of that output goes first next time.
  void while_blocked(double every, std::function<void()> waiting, int interrupt_fd = -1) {
    every_ = every;
    waiting_ = std::move(waiting);
    interrupt_fd_ = interrupt_fd;
  }
  // --timeout: a wait for the terminal or pipe gives up at `when` (steady seconds,
  // ctrl::Heartbeats::steady_seconds(); 0: never), as for a signal, so that the loop gets to the
  // time limit's timer.
  void set_deadline(double when) { deadline_ = when; }
  // The job is being stopped: from now on, output that the terminal or pipe does not take
  // within `every` seconds is dropped, so that the timers of the stop still run.
  void stop_waiting() { stop_waiting_ = true; }
  // Called once per stream when the terminal or pipe of the ranks' stdout (or stderr) goes away
  // (EPIPE: `pytorch_exec ... | head`); from then on that stream's copy to it is dropped.
  void when_closed(std::function<void(Stream)> closed) { closed_ = std::move(closed); }
  // `lines` are whole lines ending with '\n', or end with a partial line whose rest may follow
  // in a later call (the agent's kPartialHold).  Without prefixes the bytes go on as they are;
  // with them, each line gets one.  `spawn` > 0: a process of that spawned job (its files, once
  // open, are spawned_output_dir's, created at its first output).
  void write(int generation, int rank, Stream s, std::string_view lines, int spawn = 0);
  // At the end of the job: what a signal held back (see while_blocked) is written now, and a
  // newline after a prefixed partial last line.
  void flush();
  // pytorch_exec's own lines (`text`, ending with '\n') to stderr, on a line of their own.
  void message(const std::string& text);
  std::vector<std::string> stderr_tail(int rank, size_t max_lines) const;
  // At a group restart: the tails start again with the new generation.
  void clear_tails();

 private:
  static constexpr size_t kTailBytes = 8192;
  bool write_out(int fd, std::string_view& data);
  int file_of(int generation, int spawn, int rank, Stream s);
  int spawned_file(int generation, int spawn, int rank, Stream s);
  struct ProcessFiles {
    UniqueFd out, err;
  };
  void make_run_dir();
  // Whether rank `rank`'s stream `s` goes to the terminal, and a tee'd stream's prefix there.
  bool to_console(int generation, int rank, Stream s, std::string& tee_prefix) const;
  struct RankLabel {
    int local_rank = 0;
    std::string host;
  };
  // By rank, of the generation running and of the one before (its last output may come after
  // the new one started); a rank not here: its local rank is taken to be its rank.
  std::map<int, std::map<int, RankLabel>> labels_;
  std::string run_dir_;
  // By generation, then rank: the generation running's and the one before's (late output).
  std::map<int, std::map<int, ProcessFiles>> torch_files_;
  OutputOptions opts_;
  int out_fd_, err_fd_;  // the ranks' (err_fd_ is out_fd_ with opts_.merge)
  int own_fd_;           // pytorch_exec's own lines: its stderr
  bool out_broken_ = false, err_broken_ = false;
  std::string out_held_, err_held_;  // output that a signal interrupted (write)
  // Whether the last line of a terminal (or pipe, or file) is partial, and whose.
  using Who = std::tuple<int, int, int, Stream>;  // generation, spawn, rank, stream
  struct OpenLine {
    bool mid = false;
    Who who;
  };
  static std::string carry(OpenLine& open, const Who& who, std::string_view lines,
                           const std::string& prefix);
  OpenLine& line_of(Stream s) { return s == Stream::Out || same_file_ ? out_open_ : err_open_; }
  OpenLine out_open_, err_open_;
  bool same_file_ = false;  // stdout and stderr are one file: out_open_ serves both
  std::map<int, OpenLine> file_lines_;  // --output-filename files: the open line of each
  bool files_open_ = false;
  double every_ = 1.0;
  double deadline_ = 0;
  int interrupt_fd_ = -1;
  bool stop_waiting_ = false;
  std::function<void()> waiting_;
  std::function<void(Stream)> closed_;
  std::vector<UniqueFd> files_out_, files_err_;
  std::map<std::tuple<int, int, int>, ProcessFiles> spawned_files_;  // generation, spawn, rank
  std::vector<std::string> tails_;
};

}  // namespace pe
