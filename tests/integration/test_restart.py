"""Group restart: all workers stopped and started again, TORCHELASTIC_RESTART_COUNT counts."""
import os
import re

from harness import assert_no_leftovers, check, main, marker_env, run, script, tmpdir

RECORDER = script("""#!/bin/sh
# Records each generation's start; rank 1 fails while the restart count is below FAIL_UNTIL.
out=$1
echo "$RANK $TORCHELASTIC_RESTART_COUNT $PYTORCH_EXEC_GENERATION $MASTER_PORT $$" >> "$out/starts"
if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" -lt "$FAIL_UNTIL" ]; then
  echo "rank 1 fails in generation $PYTORCH_EXEC_GENERATION" >&2
  exit 4
fi
sleep 0.2
echo "done $RANK $TORCHELASTIC_RESTART_COUNT"
""")


def starts(out):
    with open(os.path.join(out, "starts")) as f:
        return [tuple(l.split()) for l in f.read().splitlines()]


def test_restart_once_then_succeed():
    out = tmpdir()
    env = marker_env({"FAIL_UNTIL": "1"})
    r = run(["-n", "3", "--max-restarts", "2", RECORDER, out], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    done = sorted(l for l in r.stdout.splitlines() if l.startswith("done"))
    check(done == ["done 0 1", "done 1 1", "done 2 1"], f"final generation: {done}")
    check(re.search(r"rank 1 \(pid \d+ on \S+\) exited with status 4; restarting all 3 ranks "
                    r"\(restart 1 of 2\)", r.stderr), r.stderr)
    gen1 = [s for s in starts(out) if s[1] == "1"]
    check(sorted(s[0] for s in gen1) == ["0", "1", "2"], f"generation 1 starts: {gen1}")
    check(all(s[2] == "1" for s in gen1), "PYTORCH_EXEC_GENERATION not 1")
    check(len({s[3] for s in gen1}) == 1, "generation 1 ranks disagree on MASTER_PORT")
    assert_no_leftovers(env["PE_TEST_MARKER"])


TIMELINE = re.compile(r"generation (\d+) timeline: detected 0 ms -> stopped (\d+) ms -> "
                      r"re-formed (\d+) ms -> all workers running (\d+) ms")


def test_verbose_logs_each_generations_timeline():
    """-v: one line per generation with the times from the failure to the old group stopped,
    the new one started and every worker running, in that order."""
    out = tmpdir()
    env = marker_env({"FAIL_UNTIL": "1"})
    r = run(["-v", "-n", "2", "--max-restarts", "1", RECORDER, out], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    lines = TIMELINE.findall(r.stderr)
    check(len(lines) == 1 and lines[0][0] == "1", r.stderr)
    stopped, reformed, running = (int(x) for x in lines[0][1:])
    check(stopped <= reformed <= running < 5000, lines)
    check("generation 0: all workers running" in r.stderr, r.stderr)
    print(f"  restart: stopped {stopped} ms, re-formed {reformed} ms, running {running} ms")
    check(not TIMELINE.search(run(["-n", "1", "true"]).stderr), "logged without -v")


def test_restarts_exhausted():
    out = tmpdir()
    env = marker_env({"FAIL_UNTIL": "100"})
    r = run(["-n", "2", "--max-restarts", "2", RECORDER, out], env=env, timeout=60)
    check(r.returncode == 4, f"exit {r.returncode}, expected 4: {r.stderr}")
    gens = sorted({s[1] for s in starts(out)})
    check(gens == ["0", "1", "2"], f"generations started: {gens}")
    check("(restart 2 of 2)" in r.stderr and "no restarts left (2 used)" in r.stderr, r.stderr)
    check(re.search(r"^pytorch_exec: rank 1 \(pid \d+ on \S+\) exited with status 4$", r.stderr, re.M),
          r.stderr)
    check("rank 1 fails in generation 2" in r.stderr, "stderr tail of the last failure missing")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_no_restart_by_default():
    out = tmpdir()
    r = run(["-n", "2", RECORDER, out], env=marker_env({"FAIL_UNTIL": "1"}), timeout=60)
    check(r.returncode == 4, f"exit {r.returncode}")
    check({s[1] for s in starts(out)} == {"0"}, "restarted without --max-restarts")


if __name__ == "__main__":
    main([test_restart_once_then_succeed, test_verbose_logs_each_generations_timeline,
          test_restarts_exhausted, test_no_restart_by_default])
