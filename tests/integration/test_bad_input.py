"""Every user mistake: one line naming the problem, a non-zero status, no crash, no hang."""
import os
import re

from harness import check, main, run, script, tmpdir

NOT_EXEC = script("#!/bin/sh\necho hi\n")
NOT_RANKFILE = script("host1 slots=2\n")  # a hostfile
os.chmod(NOT_EXEC, 0o644)

CASES = [
    # (arguments, expected status, text the one line must contain)
    (["--frobnicate", "true"], 2, "unknown option --frobnicate"),
    (["-j", "true"], 2, "unknown option -j"),
    (["-q", "-v", "true"], 2, "-q (no warnings) and -v (more logging) disagree"),
    (["--prefix", "opt", "true"], 2, "--prefix: 'opt' is not an absolute path"),
    (["--nolocal", "true"], 2, "--nolocal: no node is given but this machine"),
    (["--gmca", "x"], 2, "--gmca needs two values"),
    (["--rankfile", "/no/such/rankfile", "true"], 2, "--rankfile: cannot read '/no/such/rankfile'"),
    (["-rf", NOT_RANKFILE, "true"], 2, "is not a rankfile line"),
    (["-n", "0", "true"], 2, "-n: expected a positive integer, got '0'"),
    (["-n", "-3", "true"], 2, "got '-3'"),
    (["-np", "abc", "true"], 2, "got 'abc'"),
    (["-n", "1.5", "true"], 2, "got '1.5'"),
    (["-n", "99999999999", "true"], 2, "-n: expected a positive integer"),
    (["--nproc-per-node", "0", "true"], 2, "--nproc-per-node"),
    (["-n"], 2, "option -n needs a value"),
    ([], 2, "no program given"),
    (["-n", "2"], 2, "no program given"),
    (["-n", "2", "no-such-program-anywhere"], 127, "not found in PATH"),
    (["./no/such/path"], 127, "not found"),
    ([NOT_EXEC], 126, "is not executable"),
    (["/tmp"], 126, "is a directory"),
    (["--wdir", "/no/such/dir", "true"], 2, "--wdir: directory '/no/such/dir' does not exist"),
    (["--wdir", "/etc/hostname", "true"], 2, "is not a directory"),
    (["-x", "=1", "true"], 2, "is not a valid environment variable name"),
    (["-x", "9X=1", "true"], 2, "'9X'"),
    (["-x", "PE_SURELY_UNSET_VAR", "true"], 2, "PE_SURELY_UNSET_VAR is not set here"),
    (["--stdin", "sometimes", "true"], 2, "--stdin"),
    (["-n", "2", "--stdin", "5", "true"], 2, "rank 5 does not exist"),
    (["--kill-grace", "soon", "true"], 2, "--kill-grace"),
    (["--max-restarts", "-1", "true"], 2, "--max-restarts"),
    (["--tag-output=1", "true"], 2, "takes no value"),
    # empty values: our message, not Boost's "should follow immediately after the equal sign"
    (["-H", "", "true"], 2, "-H: the host list is empty"),
    (["--host=", "true"], 2, "-H: the host list is empty"),
    (["--hostfile", "", "true"], 2, "--hostfile: the file name is empty"),
    (["--hostfile=", "true"], 2, "--hostfile: the file name is empty"),
    (["--launch-agent", "", "true"], 2, "--launch-agent: the command is empty"),
    (["--launch-agent=", "true"], 2, "--launch-agent: the command is empty"),
    (["--launch-agent", '""', "true"], 2, "--launch-agent: the command is empty"),
    (["--launch-agent", "''  ", "true"], 2, "--launch-agent: the command is empty"),
    (["-n", "", "true"], 2, "-n: expected a positive integer, got ''"),
    # not hostfiles, and host names that ssh would take for its options
    (["--dry-run", "--hostfile", "/dev/zero", "true"], 2,
     "/dev/zero:1: a line longer than 65536 bytes (not a hostfile?)"),
    (["-H", "a,b", "--master-port", "29777", "true"], 2,
     "--master-port 29777 applies to a job on one machine"),
    (["--hostfile", "/tmp", "true"], 2, "--hostfile: '/tmp' is a directory"),
    (["-H", "-1", "true"], 2, "-H: bad host name '-1'"),
    (["-H", "n1,-inf", "true"], 2, "-H: bad host name '-inf'"),
    # an option that took the program for its value says so (not "no program given")
    (["-n", "2", "-x", "./prog"], 2, "-x: './prog' is not a valid environment variable name"),
    (["-n", "2", "--stdin", "./prog"], 2, "--stdin: expected none, all or a rank number, got './prog'"),
    (["-N", "2", "-n", "3", "true"], 2, "-n 3 with -N 2 needs 2 nodes; this machine is one"),
    (["-n", "1000000000", "true"], 2, "more processes than this machine can run"),
    (["-H", "a:1", "--oversubscribe", "-n", "2000000000", "true"], 2,
     "more processes than 1 node(s) can run"),
    (["--output-filename", "/etc/hostname", "true"], 2, "/etc/hostname is not a directory"),
    (["--wdir", "/", "no-such-program-anywhere"], 127,
     "'no-such-program-anywhere' not found in PATH or --wdir /"),
    (["--wdir", "/", "./no-such-program-anywhere"], 127, "not found in --wdir /"),
    (["-n", "2", "-n", "3", "true"], 2, "option -n or -c (--np) is given more than once"),
    (["--standalone", "-H", "a:1,b:1", "true"], 2,
     "--standalone runs on this machine: no -H, --hostfile or --host-discovery"),
]

if not os.path.exists("/dev/nvidia0"):
    # GPU options where there is none: refused as --bind-to gpu is (they ran without a word)
    CASES += [
        (["--map-by", "gpu", "true"], 2, "--map-by gpu: this machine has no GPUs"),
        (["--rank-by", "gpu", "true"], 2, "--rank-by gpu: this machine has no GPUs"),
        (["--gpus-per-rank", "2", "true"], 2, "--gpus-per-rank 2: this machine has no GPUs"),
    ]


def test_every_mistake_gets_one_line_and_a_status():
    for args, status, text in CASES:
        r = run(args, timeout=20)
        lines = r.stderr.splitlines()
        check(r.returncode == status, f"{args}: exit {r.returncode}, expected {status} ({r.stderr!r})")
        check(len(lines) == 1, f"{args}: {len(lines)} lines on stderr: {r.stderr!r}")
        check(lines[0].startswith("pytorch_exec: ") and text in lines[0],
              f"{args}: {lines[0]!r} does not say {text!r}")
        check(r.stdout == "", f"{args}: printed {r.stdout!r}")


def test_a_mistake_from_pet_variables_names_them():
    """Kubeflow's PET_* variables stand for torchrun's options: a mistake they make names them
    (the user typed none of it); -n or -N on the command line outweighs PET_NPROC_PER_NODE."""
    for var, args, text in (("PET_MASTER_PORT=abc", ["-n", "1", "true"], "--master-port: 'abc'"),
                            ("PET_NNODES=2", ["-n", "2", "true"], "--nnodes 2:2 needs at least 2")):
        k, v = var.split("=")
        r = run(args, env=dict(os.environ, **{k: v}), timeout=20)
        check(r.returncode == 2 and text in r.stderr and
              f"(with {var} from the environment)" in r.stderr and len(r.stderr.splitlines()) == 1,
              f"{var}: exit {r.returncode}: {r.stderr}")
    r = run(["-n", "2", "sh", "-c", "echo $WORLD_SIZE"],
            env=dict(os.environ, PET_NPROC_PER_NODE="3"), timeout=20)
    check(r.returncode == 0 and r.stdout == "2\n2\n", f"exit {r.returncode}: {r.stdout} {r.stderr}")


def test_bad_log_spec():
    r = run(["true"], env=dict(os.environ, PYTORCH_EXEC_LOG="loud"))
    check(r.returncode == 2 and "PYTORCH_EXEC_LOG" in r.stderr, f"{r.returncode} {r.stderr!r}")


def test_help_and_version():
    r = run(["--help"])
    check(r.returncode == 0 and "Usage: pytorch_exec" in r.stdout and "--max-restarts" in r.stdout,
          "help")
    r = run(["--version"])
    check(r.returncode == 0 and re.fullmatch(r"pytorch_exec \S+ \(control protocol \d+\)\n", r.stdout),
          r.stdout)


if __name__ == "__main__":
    main([test_every_mistake_gets_one_line_and_a_status, test_a_mistake_from_pet_variables_names_them,
          test_bad_log_spec, test_help_and_version])
