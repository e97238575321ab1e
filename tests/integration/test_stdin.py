"""--stdin: one rank (default 0), all ranks, none; from a pipe and from a file."""
import os
import subprocess

from harness import check, main, run, tmpdir

READER = ["sh", "-c", 'printf "%s:%s\\n" "$RANK" "$(cat | tr "\\n" ",")"']


def lines(r):
    return sorted(r.stdout.splitlines())


def test_default_goes_to_rank_zero():
    r = run(["-n", "3"] + READER, input="a\nb\n")
    check(r.returncode == 0, r.stderr)
    check(lines(r) == ["0:a,b,", "1:", "2:"], f"{lines(r)}")


def test_one_chosen_rank():
    r = run(["-n", "3", "--stdin", "2"] + READER, input="x\n")
    check(lines(r) == ["0:", "1:", "2:x,"], f"{lines(r)}")


def test_all_ranks_from_a_pipe():
    data = "".join(f"line{i}\n" for i in range(2000))
    r = run(["-n", "3", "--stdin", "all", "sh", "-c", 'echo "$RANK $(wc -l)"'], input=data)
    check(lines(r) == ["0 2000", "1 2000", "2 2000"], f"{lines(r)}")


def test_all_ranks_from_a_file():
    path = os.path.join(tmpdir(), "in.txt")
    with open(path, "w") as f:
        f.write("one\ntwo\n")
    with open(path) as f:
        r = run(["-n", "2", "--stdin", "all"] + READER, stdin=f)
    check(lines(r) == ["0:one,two,", "1:one,two,"], f"{lines(r)}")


def test_none():
    r = run(["-n", "2", "--stdin", "none"] + READER, input="ignored\n")
    check(lines(r) == ["0:", "1:"], f"{lines(r)}")


def test_worker_that_never_reads_does_not_block_the_job():
    r = run(["-n", "2", "true"], input="x" * (8 << 20), timeout=30)
    check(r.returncode == 0, f"exit {r.returncode}")


def test_a_restarted_generation_sees_the_end_of_stdin():
    """The job's stdin (a pipe) ended in generation 0; the next generation's ranks read its end
    at once, whether or not generation 0 read it all (they waited forever)."""
    for mode in (["--stdin", "all"], []):
        r = run(["-n", "2", "--max-restarts", "1"] + mode + [
            "sh", "-c", 'got=$(cat | tr "\\n" ,); [ $PYTORCH_EXEC_GENERATION = 0 ] && exit 1; '
                        'echo "$RANK:$got"'], input="a\nb\n", timeout=30)
        check(r.returncode == 0 and lines(r) == ["0:", "1:"],
              f"{mode}: exit {r.returncode}: {r.stdout} {r.stderr}")
    r = run(["-n", "1", "--max-restarts", "1", "sh", "-c",
             '[ $PYTORCH_EXEC_GENERATION = 0 ] && { sleep 0.3; exit 1; }; echo "[$(cat)]"'],
            input="unread\n", timeout=30)
    check(r.returncode == 0 and r.stdout == "[]\n", f"exit {r.returncode}: {r.stdout} {r.stderr}")


if __name__ == "__main__":
    main([test_default_goes_to_rank_zero, test_one_chosen_rank, test_all_ranks_from_a_pipe,
          test_all_ranks_from_a_file, test_none, test_worker_that_never_reads_does_not_block_the_job,
          test_a_restarted_generation_sees_the_end_of_stdin])
