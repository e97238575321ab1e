"""stdout/stderr: volume, line integrity, tags, timestamps, per-rank files, partial last lines."""
import os
import re
import signal
import subprocess
import time

from harness import (EXEC, SYSTEM_PYTHON, TestFailure, assert_no_leftovers, check, main, marker_env,
                     reaped, run, script, start, tmpdir)

MB = 1 << 20

WRITER = script("""#!/usr/bin/python3
import os, sys
rank = int(os.environ["RANK"])
out_bytes, err_bytes = int(sys.argv[1]), int(sys.argv[2])
# Lines of varying length, numbered, so loss, duplication and interleaving are all visible.
def emit(stream, total, tag):
    n, written, chunk = 0, 0, []
    while written < total:
        line = f"{tag} r{rank} n{n} " + "x" * (n % 200) + "\\n"
        chunk.append(line); written += len(line); n += 1
        if len(chunk) == 500:
            stream.write("".join(chunk)); chunk = []
    stream.write("".join(chunk)); stream.flush()
    return n
no = emit(sys.stdout, out_bytes, "OUT")
ne = emit(sys.stderr, err_bytes, "ERR")
sys.stdout.write(f"END r{rank} {no} {ne}\\n")
sys.stdout.write(f"partial-last-line-r{rank}")   # no newline, then exit at once
sys.stdout.flush()
os._exit(0)
""", ".py")

LINE = re.compile(r"^(\[1,(\d)\]<std(?:out|err)>:)?(OUT|ERR) r(\d) n(\d+) (x*)$")


def check_stream(text, stream_tag, nranks, tagged):
    seen = {r: 0 for r in range(nranks)}
    ends = {}
    partial = set()
    lines = text.split("\n")
    if lines[-1] == "":  # untagged output ends with the last rank's partial line as it is
        lines.pop()
    for line in lines:
        body = line
        if tagged:
            m = re.match(r"^\[1,(\d)\]<(stdout|stderr)>:(.*)$", line)
            check(m, f"untagged line: {line[:80]!r}")
            body = m.group(3)
            check((m.group(2) == "stdout") == (stream_tag == "OUT"), "wrong stream tag")
        if body.startswith("END "):
            _, r, no, ne = body.split()
            ends[int(r[1:])] = (int(no), int(ne))
            continue
        if body.startswith("partial-last-line-r"):
            partial.add(int(body[-1]))
            continue
        m = LINE.match(body)
        check(m and m.group(3) == stream_tag, f"mangled line: {line[:100]!r}")
        r, n = int(m.group(4)), int(m.group(5))
        if tagged:
            check(line.startswith(f"[1,{r}]"), f"line of rank {r} tagged {line[:8]}")
        check(n == seen[r], f"rank {r} {stream_tag}: line {n} where {seen[r]} was expected")
        check(len(m.group(6)) == n % 200, f"rank {r} line {n} has the wrong length")
        seen[r] += 1
    return seen, ends, partial


def volume(tagged):
    n = 4
    args = ["-n", str(n)] + (["--tag-output"] if tagged else []) + \
           [SYSTEM_PYTHON, WRITER, str(10 * MB), str(2 * MB)]
    r = run(args, timeout=240)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-500:]}")
    out_seen, ends, partial = check_stream(r.stdout, "OUT", n, tagged)
    err_seen, _, _ = check_stream(r.stderr, "ERR", n, tagged)
    check(sorted(ends) == list(range(n)), f"END lines: {sorted(ends)}")
    check(partial == set(range(n)), f"partial last lines of ranks {sorted(partial)} only")
    for rank, (no, ne) in ends.items():
        check(out_seen[rank] == no, f"rank {rank}: {out_seen[rank]} of {no} stdout lines")
        check(err_seen[rank] == ne, f"rank {rank}: {err_seen[rank]} of {ne} stderr lines")


def test_ten_megabytes_per_rank_intact():
    volume(tagged=False)


def test_ten_megabytes_per_rank_tagged():
    volume(tagged=True)


def test_timestamps():
    r = run(["-n", "2", "--timestamp-output", "--tag-output", "sh", "-c", "echo hi"])
    check(r.returncode == 0, r.stderr)
    for line in r.stdout.splitlines():
        check(re.match(r"^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\]\[1,[01]\]<stdout>:hi$", line),
              f"bad line {line!r}")
    r = run(["-n", "1", "--timestamp-output", "sh", "-c", "echo hi"])
    check(re.match(r"^\[[-0-9T:.]+\] hi\n$", r.stdout), f"bad line {r.stdout!r}")


def test_output_files():
    d = os.path.join(tmpdir(), "out")
    r = run(["-n", "3", "--output-filename", d, "sh", "-c", 'echo "o$RANK"; echo "e$RANK" >&2'])
    check(r.returncode == 0, r.stderr)
    check(sorted(r.stdout.split()) == ["o0", "o1", "o2"], "output not copied to the terminal")
    for rank in range(3):
        with open(os.path.join(d, f"rank.{rank}", "stdout")) as f:
            check(f.read() == f"o{rank}\n", f"rank {rank} stdout file")
        with open(os.path.join(d, f"rank.{rank}", "stderr")) as f:
            check(f.read() == f"e{rank}\n", f"rank {rank} stderr file")
    d2 = os.path.join(tmpdir(), "quiet")
    r = run(["-n", "2", "--output-filename", d2 + ":nocopy", "sh", "-c", 'echo "o$RANK"'])
    check(r.returncode == 0 and r.stdout == "", f"nocopy printed {r.stdout!r}")
    with open(os.path.join(d2, "rank.1", "stdout")) as f:
        check(f.read() == "o1\n", "nocopy file")
    # A generation's partial last line stays as it is; the next generation starts a line.
    d3 = os.path.join(tmpdir(), "gens")
    r = run(["-n", "1", "--max-restarts", "1", "--output-filename", d3, "sh", "-c",
             'if [ $PYTORCH_EXEC_GENERATION = 0 ]; then printf partial; exit 1; fi; printf end'])
    check(r.returncode == 0, r.stderr)
    with open(os.path.join(d3, "rank.0", "stdout")) as f:
        got = f.read()
    check(got == "partial\nend", f"rank 0's file across generations: {got!r}")


def run_dir_of(stderr):
    m = re.search(r"pytorch_exec: the ranks' logs \(--redirects, --tee\) are in (\S+)\n", stderr)
    check(m, f"no run directory said: {stderr!r}")
    return m.group(1)


def tree(d):
    """{relative path: contents} of the files under d."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            with open(os.path.join(root, f)) as fh:
                out[os.path.relpath(os.path.join(root, f), d)] = fh.read()
    return out


def test_torchruns_log_options():
    """torchrun's --log-dir, --redirects, --tee, --local-ranks-filter, --role, as torchtitan's
    run_train.sh spells them: per-attempt files by local rank, prefixed tee'd lines, one local
    rank on the terminal.  They were unknown options ('unknown option --local-ranks-filter')."""
    base = os.path.join(tmpdir(), "logs")
    prog = 'echo "out $RANK $ROLE_NAME"; echo "err $RANK" >&2'
    r = run(["--nproc_per_node=3", "--rdzv_backend", "c10d", "--rdzv_endpoint=localhost:0",
             "--local-ranks-filter", "0", "--role", "rank", "--tee", "3", "--log-dir", base,
             "--run-id", "titan", "sh", "-c", prog])
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    check(r.stdout == "[rank0]:out 0 rank\n", f"stdout {r.stdout!r}")
    run_dir = run_dir_of(r.stderr)
    check(r.stderr.endswith("[rank0]:err 0\n"), f"stderr {r.stderr!r}")
    check(os.path.dirname(run_dir) == base and os.path.basename(run_dir).startswith("titan_"),
          run_dir)
    want = {f"attempt_0/{i}/{s}.log": f"{s[3:]} {i}" + (" rank" if s == "stdout" else "") + "\n"
            for i in range(3) for s in ("stdout", "stderr")}
    check(tree(run_dir) == want, f"files {tree(run_dir)}")
    # --redirects: files only; per local rank; a restart writes attempt_1; the default base is a
    # new torchelastic_ directory in TMPDIR.
    tmp = tmpdir()
    # Rank 1 fails in generation 0 once rank 0 has written both lines (else the stop may come
    # first).
    flaky = ('echo "o$RANK g$TORCHELASTIC_RESTART_COUNT"; echo "e$RANK" >&2; '
             f'touch {tmp}/w$RANK.$TORCHELASTIC_RESTART_COUNT; '
             '[ "$TORCHELASTIC_RESTART_COUNT$RANK" = 01 ] || exit 0; '
             f'while [ ! -e {tmp}/w0.0 ]; do sleep 0.01; done; exit 3')
    r = run(["-n", "2", "--max-restarts", "1", "-r", "3", "--tee", "1:2", "sh", "-c", flaky],
            env=dict(os.environ, TMPDIR=tmp))
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    check(r.stdout == "", f"redirected stdout printed: {r.stdout!r}")
    # (Rank 0's line is in no form: "e0" alone may be in the run directory's random name.)
    check(r.stderr.count("[default1]:e1\n") == 2 and "[default0]" not in r.stderr and
          "\ne0\n" not in r.stderr and not r.stderr.startswith("e0\n"), r.stderr)
    run_dir = run_dir_of(r.stderr)
    check(re.match(re.escape(tmp) + r"/torchelastic_\w{6}/", run_dir), run_dir)
    got = tree(run_dir)
    for g in (0, 1):
        for i in (0, 1):
            check(got.get(f"attempt_{g}/{i}/stdout.log") == f"o{i} g{g}\n" and
                  got.get(f"attempt_{g}/{i}/stderr.log") == f"e{i}\n", f"attempt {g}: {got}")
    # A log directory that cannot be made is a usage error, as --output-filename's.
    r = run(["-n", "1", "--tee", "3", "--log-dir", "/proc/no/such", "true"])
    check(r.returncode == 2 and r.stderr.startswith("pytorch_exec: --log-dir: cannot create"),
          f"exit {r.returncode}: {r.stderr}")


def on_terminal(args, rows, cols, until=None, timeout=60):
    """pytorch_exec ARGS with a terminal of rows x cols as its stdout and stderr (raw: bytes come
    as the ranks wrote them); returns (exit status, output).  `until`: (text, path): once the
    output has `text`, `path` is created (a rank waiting for it goes on); the test fails when
    `text` does not come within 20 s."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import tty
    master, slave = pty.openpty()
    tty.setraw(slave)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    p = start(args, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    got = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if until and until[0].encode() in got:
                open(until[1], "w").close()
                until = None
            if until and time.monotonic() > deadline - timeout + 20:
                raise TestFailure(f"{until[0]!r} did not come within 20 s: {got!r}")
            if not select.select([master], [], [], 0.1)[0]:
                if p.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer is gone
                break
            if not chunk:
                break
            got += chunk
        p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, got.decode(errors="replace")


def test_ranks_stdout_is_a_terminal_where_ours_is():
    """Where pytorch_exec's stdout is a terminal, each rank's is one too, of its size (as
    mpirun's ranks have one, and torchrun's share the terminal): C and Perl stdio flush each
    line then.  Before, it was a pipe, and a program's lines came a block at a time, after it
    had gone on (here: after it had waited for its first line to be seen).  stderr stays a
    pipe; a pytorch_exec whose stdout is a pipe gives pipes."""
    seen = os.path.join(tmpdir(), "seen")
    prog = ('print "first\\n"; for (1..300) { last if -e $ARGV[0]; select(undef, undef, undef, '
            '0.1) } print "second\\n"')
    rc, out = on_terminal(["-n", "1", "perl", "-e", prog, seen], 33, 99, until=("first\n", seen))
    check(rc == 0 and out == "first\nsecond\n", f"exit {rc}: {out!r}")
    show = ("import os, sys; print(os.environ['RANK'], os.isatty(1), os.isatty(2), "
            "tuple(os.get_terminal_size(1)))")
    rc, out = on_terminal(["-n", "2", SYSTEM_PYTHON, "-c", show], 33, 99)
    check(rc == 0 and sorted(out.splitlines()) == ["0 True False (99, 33)",
                                                   "1 True False (99, 33)"], f"exit {rc}: {out!r}")
    r = run(["-n", "1", "sh", "-c", "[ -t 1 ] && echo tty || echo pipe"])
    check(r.returncode == 0 and r.stdout == "pipe\n", f"exit {r.returncode}: {r.stdout!r}")


def test_merge_stderr_to_stdout():
    """mpirun's --merge-stderr-to-stdout (an unknown option before): the ranks' stderr lines
    come on stdout, pytorch_exec's own lines (the failure report) stay on stderr."""
    r = run(["-n", "2", "--merge-stderr-to-stdout", "--tag-output", "sh", "-c",
             'echo "out $RANK"; echo "err $RANK" >&2; exit $RANK'])
    check(r.returncode == 1 and sorted(r.stdout.splitlines()) ==
          ["[1,0]<stderr>:err 0", "[1,0]<stdout>:out 0", "[1,1]<stderr>:err 1",
           "[1,1]<stdout>:out 1"], f"exit {r.returncode}: {r.stdout!r}")
    check(r.stderr.startswith("pytorch_exec: rank 1 (pid ") and "err 1" in r.stderr and
          "<stderr>" not in r.stderr, f"stderr {r.stderr!r}")


def test_output_dir_that_cannot_be_created():
    r = run(["-n", "1", "--output-filename", "/proc/no/such", "true"])
    check(r.returncode != 0, "no error")
    check(r.stderr.startswith("pytorch_exec: ") and "cannot create" in r.stderr, r.stderr)


def test_output_files_refuse_links_and_others_directories():
    # Issue 13, item 8: --output-filename followed a symbolic link planted as a rank's file or
    # directory, and wrote into a directory of another user.
    base = tmpdir()
    victim = os.path.join(base, "victim")
    with open(victim, "w") as f:
        f.write("precious\n")
    d = os.path.join(base, "out")
    os.makedirs(os.path.join(d, "rank.0"))
    os.symlink(victim, os.path.join(d, "rank.0", "stdout"))
    r = run(["-n", "1", "--output-filename", d, "sh", "-c", "echo overwritten"])
    check(r.returncode != 0 and "is a symbolic link" in r.stderr, f"{r.returncode} {r.stderr}")
    os.makedirs(os.path.join(base, "victim_dir"))
    d = os.path.join(base, "out2")
    os.makedirs(d)
    os.symlink(os.path.join(base, "victim_dir"), os.path.join(d, "rank.0"))
    r = run(["-n", "1", "--output-filename", d, "sh", "-c", "echo overwritten"])
    check(r.returncode != 0 and "is a symbolic link" in r.stderr, f"{r.returncode} {r.stderr}")
    with open(victim) as f:
        check(f.read() == "precious\n", "the link's target was overwritten")
    check(os.listdir(os.path.join(base, "victim_dir")) == [], "wrote through a linked directory")
    if os.geteuid() == 0:
        d = os.path.join(base, "foreign")
        os.makedirs(d)
        os.chown(d, 65534, 65534)
        r = run(["-n", "1", "--output-filename", d, "true"])
        check(r.returncode != 0 and "belongs to another user" in r.stderr, f"{r.returncode} {r.stderr}")


def closed_reader(args):
    """`pytorch_exec ARGS | head -2`: reads two lines of the job's output, closes the pipe, and
    returns (exit status, stderr) once pytorch_exec is gone, and after checking that none of the
    job's processes is left."""
    env = marker_env()
    if "--launch-agent" in args:
        args = [a.replace("{marker}", env["PE_TEST_MARKER"]) for a in args]
    with reaped(start(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)) as p:
        lines = [p.stdout.readline() for _ in range(2)]
        p.stdout.close()
        err = p.stderr.read().decode(errors="replace")
        rc = p.wait(timeout=60)
    check(all(l == b"y\n" for l in lines), f"read {lines}")
    assert_no_leftovers(env["PE_TEST_MARKER"])
    return rc, err


def test_closed_output_stops_the_job():
    # `pytorch_exec -n 2 yes | head -2` used to run until it was killed: the ranks' output was
    # dropped and the job went on.  Now it ends like a pipeline's writer on SIGPIPE (141), as
    # mpirun aborts, on one machine and with daemons on other nodes.
    for args in (["-n", "2", "yes"],
                 ["-H", "a:1,b:1", "--launch-agent",
                  "env -i PATH=/usr/bin:/bin PE_TEST_MARKER={marker} PE_NODE={host}", "yes"]):
        rc, err = closed_reader(args)
        check(rc == 141 and "standard output of the job was closed (broken pipe)" in err,
              f"{args}: exit {rc}: {err[-1500:]}")


def test_sigterm_while_the_output_is_not_read():
    # `pytorch_exec -n 2 yes | sleep 1000`: pytorch_exec waited for the pipe to take the ranks'
    # output, inside its loop, so SIGTERM (timeout(1), SLURM) was never handled: it ran until the
    # reader went away.  Now the wait gives up on a signal and the job stops.
    env = marker_env()
    with reaped(start(["-n", "2", "yes"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)) as p:
        time.sleep(2)  # the pipe is full long before
        check(p.poll() is None, f"pytorch_exec ended by itself: {p.returncode}")
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("pytorch_exec did not stop within 60 s of SIGTERM while nobody read its output")
    check(rc == 143, f"exit {rc}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_sigusr1_while_the_output_is_not_read_loses_nothing():
    # SIGUSR1 is forwarded and the job goes on: the output that waited for the pipe when it came
    # must still arrive, whole and in order.
    env = marker_env()
    with reaped(start(["-n", "1", "sh", "-c", "trap '' USR1; seq 1 300000"], env=env,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)) as p:
        time.sleep(1.5)  # 2 MB of lines: the pipe is full long before
        for _ in range(3):
            p.send_signal(signal.SIGUSR1)
            time.sleep(0.3)
        out, err = p.communicate(timeout=60)
    want = "".join(f"{i}\n" for i in range(1, 300001)).encode()
    check(p.returncode == 0 and out == want,
          f"exit {p.returncode}, {len(out)} of {len(want)} bytes, the same: {out == want}: {err[-1000:]}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_closed_stdout():
    # `pytorch_exec ... >&-`: the first descriptor pytorch_exec opened (its epoll instance) was
    # then its "standard output", the ranks' output went into it and the job hung.
    r = subprocess.run(["sh", "-c", f"exec {EXEC} -n 2 sh -c 'echo out; echo err >&2' >&-"],
                       capture_output=True, text=True, timeout=60, env=marker_env())
    check(r.returncode == 0 and r.stderr.count("err\n") == 2, f"exit {r.returncode}: {r.stderr[-1500:]}")


def test_one_ranks_bytes_as_they_are():
    """Without tags one rank's output is passed on byte for byte: binary data, and a last line
    without a newline (one was added); with tags each line is tagged and ended."""
    data = bytes(range(256)) * 4096 + b"no newline at the end"
    path = os.path.join(tmpdir(), "data.bin")
    with open(path, "wb") as f:
        f.write(data)
    out = tmpdir()
    r = subprocess.run([EXEC, "-n", "1", "--output-filename", out, "cat", path],
                       capture_output=True, timeout=60, env=marker_env())
    check(r.returncode == 0 and r.stdout == data, f"exit {r.returncode}: {len(r.stdout)} bytes of "
          f"{len(data)}, the same: {r.stdout == data}, ends {r.stdout[-30:]!r}")
    with open(os.path.join(out, "rank.0", "stdout"), "rb") as f:
        check(f.read() == data, "the rank's file differs from its output")
    r = run(["-n", "1", "--tag-output", "sh", "-c", "printf 'a\\nb'"])
    check(r.stdout == "[1,0]<stdout>:a\n[1,0]<stdout>:b\n", f"{r.stdout!r}")


def test_a_prompt_shows_before_its_line_ends():
    """A partial line (a prompt) is passed on while the rank waits, not when its newline comes;
    pytorch_exec's own messages start a line of their own."""
    env = marker_env()
    with reaped(start(["-n", "1", "sh", "-c", "printf 'prompt> '; sleep 3; echo done"], env=env,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)) as p:
        os.set_blocking(p.stdout.fileno(), False)
        got, deadline = b"", time.monotonic() + 2.5
        while got != b"prompt> " and time.monotonic() < deadline:
            got += p.stdout.read() or b""
            time.sleep(0.05)
        check(got == b"prompt> ", f"after {2.5 - (deadline - time.monotonic()):.1f} s: {got!r}")
        os.set_blocking(p.stdout.fileno(), True)
        out, _ = p.communicate(timeout=30)
        check(out == b"done\n", f"then {out!r}")
    r = run(["-n", "1", "sh", "-c", "printf 'half a line' >&2; exit 3"])
    check(r.returncode == 3 and r.stderr.startswith("half a line\npytorch_exec: rank 0 "),
          f"exit {r.returncode}: {r.stderr!r}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


if __name__ == "__main__":
    main([test_ten_megabytes_per_rank_intact, test_ten_megabytes_per_rank_tagged, test_timestamps,
          test_output_files, test_torchruns_log_options,
          test_ranks_stdout_is_a_terminal_where_ours_is, test_merge_stderr_to_stdout,
          test_output_dir_that_cannot_be_created,
          test_output_files_refuse_links_and_others_directories, test_closed_output_stops_the_job,
          test_sigterm_while_the_output_is_not_read,
          test_sigusr1_while_the_output_is_not_read_loses_nothing, test_closed_stdout,
          test_one_ranks_bytes_as_they_are, test_a_prompt_shows_before_its_line_ends])
