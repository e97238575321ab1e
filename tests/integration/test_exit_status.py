"""Exit status and the one-line failure report for failing, killed and unexecutable ranks."""
import re

from harness import check, main, run, script


def test_failing_rank_status_and_message():
    prog = script("""#!/bin/sh
if [ "$RANK" = 2 ]; then echo "line one" >&2; echo "the real error" >&2; exit 3; fi
sleep 30
""")
    r = run(["-n", "4", "--kill-grace", "2", prog], timeout=30)
    check(r.returncode == 3, f"exit {r.returncode}, expected 3: {r.stderr}")
    check(re.search(r"^pytorch_exec: rank 2 \(pid \d+ on \S+\) exited with status 3$", r.stderr, re.M),
          f"no failure line: {r.stderr!r}")
    check("last lines of rank 2's stderr:\n    line one\n    the real error\n" in r.stderr, r.stderr)


def test_killed_rank():
    r = run(["-n", "2", "sh", "-c", '[ "$RANK" = 1 ] && kill -9 $$; sleep 30'], timeout=30)
    check(r.returncode == 137, f"exit {r.returncode}, expected 137")
    check(re.search(r"rank 1 \(pid \d+ on \S+\) killed by signal 9 \(Killed\)", r.stderr), r.stderr)


def test_segfault():
    r = run(["-n", "1", "sh", "-c", "kill -SEGV $$"], timeout=30)
    check(r.returncode == 139, f"exit {r.returncode}, expected 139")
    check("killed by signal 11 (Segmentation fault)" in r.stderr, r.stderr)


def test_success_is_zero_and_silent():
    r = run(["-n", "3", "true"])
    check(r.returncode == 0 and r.stderr == "", f"exit {r.returncode}: {r.stderr!r}")


def test_exec_format_error():
    bad = script("this is not a program\n", ".bin")
    with open(bad, "wb") as f:
        f.write(b"\x7fELF-garbage")
    r = run(["-n", "2", bad], timeout=30)
    check(r.returncode == 126, f"exit {r.returncode}, expected 126: {r.stderr}")
    check("could not execute" in r.stderr and "Exec format error" in r.stderr, r.stderr)


if __name__ == "__main__":
    main([test_failing_rank_status_and_message, test_killed_rank, test_segfault,
          test_success_is_zero_and_silent, test_exec_format_error])
