"""Elastic membership (--nnodes MIN:MAX): a node's daemon dies in the middle of a job; the others
are stopped and the group re-forms on the nodes left, with a new generation and WORLD_SIZE, and
finishes.  Below MIN the job fails naming the node.  A frozen daemon (SIGSTOP) is lost by its
silence; a host that comes back waits its cool-down and joins after the survivors.  The "nodes"
are names given with -H or a hostfile, their daemons started by a launch agent on this machine
(as in test_multinode.py)."""
import os
import random
import re
import signal
import subprocess
import time

from harness import (EXEC, assert_no_leftovers, check, main, processes_with_marker, run, script,
                     tmpdir, wait_until)
from test_multinode import BIN, agent, build_mpi, daemon_of, job_env

# Generation 0: the first rank of node b kills its own daemon (its parent); every other rank
# waits to be stopped.  Later generations report who they are, and run $PE_THEN when given.
WORKER = script("""#!/bin/sh
if [ "$PYTORCH_EXEC_GENERATION" = 0 ]; then
  if [ "$PE_NODE" = b ] && [ "$LOCAL_RANK" = 0 ]; then kill -9 $PPID; fi
  exec sleep 60
fi
echo "gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE node $PE_NODE group $GROUP_RANK/$GROUP_WORLD_SIZE restarts $TORCHELASTIC_RESTART_COUNT"
if [ -n "$PE_THEN" ]; then exec "$PE_THEN"; fi
""")


# Generation 0: the first rank of node b is killed (SIGKILL), and its daemon 0.1 s later, as SLURM
# kills a node set DOWN: the rank's death is reported first.
KILLED_WORKER = script("""#!/bin/sh
if [ "$PYTORCH_EXEC_GENERATION" = 0 ]; then
  if [ "$PE_NODE" = b ] && [ "$LOCAL_RANK" = 0 ]; then
    setsid sh -c "sleep 0.15; kill -9 $PPID" &  # (out of the rank's process group first)
    sleep 0.05; kill -9 $$
  fi
  exec sleep 60
fi
echo "gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE node $PE_NODE group $GROUP_RANK/$GROUP_WORLD_SIZE restarts $TORCHELASTIC_RESTART_COUNT"
""")


def lines_until(stream, text):
    """The lines read from `stream` up to the first that holds `text` (or the end)."""
    said = []
    for line in stream:
        said.append(line)
        if text in line:
            break
    return said


def waits_until_c_is_listed(cmd, env, hostfile, said):
    """Runs `cmd`, which says that it waits up to 60 s for more nodes in a line holding `said`;
    then lists c in `hostfile`: the job must end well.  Its standard output and error."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        lines = lines_until(p.stderr, "waiting up to 60 s for more (--join-timeout)")
        check(lines and said in lines[-1], "".join(lines))
        with open(hostfile, "a") as f:
            f.write("c\n")
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    check(p.returncode == 0, f"exit {p.returncode}: {''.join(lines) + err}")
    return out, "".join(lines) + err


def reformed_on_a_and_c(elastic_args, said, worker=WORKER):
    """Nodes a, b, c of two ranks; b's daemon dies in generation 0: the job finishes with
    generation 1 on a and c (4 ranks), the front end having said `said` (a regex)."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    r = run(elastic_args + ["-H", "a:2,b:2,c:2", "--launch-agent", agent(marker), worker],
            env=env, timeout=90)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}")
    check(re.search(said, r.stderr), r.stderr[-2000:])
    rows = sorted(r.stdout.splitlines())
    want = sorted(f"gen 1 rank {i} of 4 node {n} group {g}/2 restarts 1"
                  for i, (n, g) in enumerate([("a", 0), ("a", 0), ("c", 1), ("c", 1)]))
    check(rows == want, f"re-formed group: {rows}")
    assert_no_leftovers(marker, timeout=5)


def test_a_lost_node_reforms_the_group():
    reformed_on_a_and_c(["--nnodes", "2:3"], r"node b: lost contact with its daemon .*; "
                        r"re-forming the group on the 2 node\(s\) left")


def test_a_rank_killed_as_its_node_goes_is_the_nodes_loss():
    """A rank killed with SIGKILL a moment before its daemon (SLURM killing a node set DOWN):
    the node's loss re-forms the group; the rank's death was no failure of the job (it ended
    the job, exit 137, in one CI run out of many)."""
    reformed_on_a_and_c(["--nnodes", "2:3"], r"node b: lost contact with its daemon .*; "
                        r"re-forming the group on the 2 node\(s\) left", KILLED_WORKER)


def test_a_lost_relay_takes_the_nodes_below_it():
    """--tree-radix 1: a chain, a above b above c above d.  b's daemon dies: c and d, below it,
    go with it, and the group re-forms once, on a."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    r = run(["--nnodes", "1:4", "--tree-radix", "1", "-H", "a,b,c,d", "--launch-agent",
             agent(marker), WORKER], env=env, timeout=90)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}")
    check(re.search(r"node b: lost contact with its daemon .*; and with it the node\(s\) below it in "
                    r"the control tree: c, d; re-forming the group on the 1 node\(s\) left",
                    r.stderr), r.stderr[-2000:])
    check(r.stdout == "gen 1 rank 0 of 1 node a group 0/1 restarts 1\n", r.stdout)
    assert_no_leftovers(marker, timeout=5)


def test_mpi_programs_run_in_the_reformed_group():
    if not build_mpi():
        print("  (mpicc not found: MPI part not run)")
        return
    env = job_env({"PE_THEN": os.path.join(BIN, "collectives")})
    marker = env["PE_TEST_MARKER"]
    r = run(["--nnodes", "2:3", "-H", "a:1,b:1,c:2", "--launch-agent",
             agent(marker, "OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo"), "-x", "PE_THEN",
             WORKER], env=env, timeout=120)
    check(r.returncode == 0 and "collectives over 3 ranks: ok" in r.stdout,
          f"exit {r.returncode}: {r.stdout} {r.stderr[-2000:]}")
    assert_no_leftovers(marker, timeout=5)


def test_a_spare_takes_the_place_of_a_lost_node():
    reformed_on_a_and_c(["--nnodes", "2:2", "--spares", "1"],
                        re.escape("re-forming the group on 2 node(s), a spare taking its place"))


def test_a_frozen_daemon_is_lost_by_its_silence():
    """Node b's daemon is stopped (SIGSTOP: its connection stays open, nothing is sent): the
    heartbeat finds it silent, and the group re-forms on a and c as after a death."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    d = tmpdir()
    body = script(f"""#!/bin/sh
if [ "$PYTORCH_EXEC_GENERATION" = 0 ]; then echo up > {d}/up.$RANK; exec sleep 60; fi
echo "gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE node $PE_NODE"
""")
    p = subprocess.Popen([EXEC, "--nnodes", "2:3", "--kill-grace", "1", "--heartbeat-interval", "0.5",
                          "--heartbeat-timeout", "2", "-H", "a:1,b:1,c:1", "--launch-agent",
                          agent(marker), body], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    frozen = None
    try:
        if not wait_until(lambda: len(os.listdir(d)) == 3, timeout=30):
            p.kill()
            check(False, f"the ranks did not start: {p.communicate()[1][-2000:]}")
        frozen = daemon_of(marker, "b")
        os.kill(frozen, signal.SIGSTOP)
        out, err = p.communicate(timeout=60)
    finally:
        if frozen:
            try:
                os.kill(frozen, signal.SIGCONT)  # if pytorch_exec has not killed it already
            except ProcessLookupError:
                pass
        if p.poll() is None:
            p.kill()
            p.wait()
    check(p.returncode == 0, f"exit {p.returncode}: {err[-2000:]}")
    check(re.search(r"node b: lost contact with its daemon \(no heartbeat for 2 s\); re-forming the "
                    r"group on the 2 node\(s\) left", err), err[-2000:])
    check(sorted(out.splitlines()) == ["gen 1 rank 0 of 2 node a", "gen 1 rank 1 of 2 node c"], out)
    assert_no_leftovers(marker, timeout=10)


# Generations 0 and 1 run `gen0` and `gen1` (shell, then sleep until stopped); generation 2
# reports who it is.
B_LEAVES_AND_COMES_BACK = """#!/bin/sh
case "$PYTORCH_EXEC_GENERATION" in
0) %s; exec sleep 60 ;;
1) %s; exec sleep 60 ;;
esac
echo "gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE node $PE_NODE restarts $TORCHELASTIC_RESTART_COUNT"
"""


def a_c_then_b(gen0, gen1, args):
    """A job of --nnodes 2:3 on hosts a, b, c listed in a hostfile (its path in $HOSTFILE), which
    loses b in generation 0 (`gen0`) and has it back, after the survivors, in generation 2."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    hostfile = os.path.join(tmpdir(), "hosts")
    with open(hostfile, "w") as f:
        f.write("a\nb\nc\n")
    env["HOSTFILE"] = hostfile
    body = script(B_LEAVES_AND_COMES_BACK % (gen0, gen1))
    r = run(["-v", "--kill-grace", "1", "--nnodes", "2:3", "--last-call", "0.5", "-x", "HOSTFILE",
             "--launch-agent", agent(marker)] + [a.replace("HOSTFILE", hostfile) for a in args] +
            [body], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}")
    check(sorted(r.stdout.splitlines()) == ["gen 2 rank 0 of 3 node a restarts 2",
                                            "gen 2 rank 1 of 3 node c restarts 2",
                                            "gen 2 rank 2 of 3 node b restarts 2"], r.stdout)
    assert_no_leftovers(marker, timeout=10)
    return r.stderr


def test_a_host_that_comes_back_waits_its_cooldown():
    """--hostfile a,b,c: b's daemon dies in generation 0, the group re-forms on a and c; b, still
    listed, is kept out for its cool-down, then started again and admitted after the last call:
    generation 2 runs on a, c and b, in that order (survivors first)."""
    err = a_c_then_b('if [ "$PE_NODE" = b ]; then kill -9 $PPID; fi', "true",
                     ["--host-cooldown", "1.5", "--hostfile", "HOSTFILE"])
    said = [line for line in err.splitlines() if re.search(r"node(\(s\))? b\b", line)]
    steps = [r"node b is kept out for 1.5 s \(cool-down\)",
             r"node b: lost contact with its daemon .*re-forming the group on the 2 node\(s\) left",
             r"node b: lost 1 time\(s\): kept out for another .* s \(cool-down\)",
             r"node b arrives with 1 rank\(s\): starting its daemon",
             r"node\(s\) b joined; re-forming the group on 3 node\(s\)"]
    at = 0
    for line in said:
        if at < len(steps) and re.search(steps[at], line):
            at += 1
    check(at == len(steps), f"missing, in this order: {steps[at:]}\n" + "\n".join(said))


def test_a_host_no_longer_listed_leaves_and_may_come_back():
    """--hostfile a,b,c: in generation 0, rank 0 takes b out of the file: b's daemon is stopped
    and the group re-forms on a and c; in generation 1, rank 0 lists b again: it is admitted at
    once (no cool-down: --host-cooldown 60 would outlast the test) and generation 2 runs on a, c
    and b.  The same with --host-discovery printing the file.  b's daemon, told it is let go,
    does not report a lost front end."""
    rewrite = ('if [ "$RANK" = 0 ]; then sleep 0.5; printf \'%s\' > "$HOSTFILE.new"; '
               'mv "$HOSTFILE.new" "$HOSTFILE"; fi')
    for source in (["--hostfile", "HOSTFILE"],
                   ["--host-discovery", "cat HOSTFILE", "--host-discovery-interval", "0.2"]):
        err = a_c_then_b(rewrite % "a\\nc\\n", rewrite % "a\\nc\\nb\\n",
                         ["--host-cooldown", "60"] + source)
        check("node b: no longer listed by its node source; re-forming the group on the 2 "
              "node(s) left" in err, err[-3000:])
        check("cool-down" not in err, err[-3000:])
        check("lost the front end" not in err, f"b's daemon did not know it was let go: {err}")


def test_a_host_listed_with_other_slots_runs_that_many_ranks():
    """--nnodes 1:2 --hostfile a:1,b:1: in generation 0, rank 0 lists a with 2 slots: the group
    re-forms after the last call and a runs 2 ranks from generation 1 (changes of slots were
    ignored); then b with 2 slots too (generation 2: 4 ranks)."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    hostfile = os.path.join(tmpdir(), "hosts")
    with open(hostfile, "w") as f:
        f.write("a:1\nb:1\n")
    env["HOSTFILE"] = hostfile
    body = script("""#!/bin/sh
echo "gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE node $PE_NODE local $LOCAL_RANK"
relist() { printf "$1" > "$HOSTFILE.new"; mv "$HOSTFILE.new" "$HOSTFILE"; exec sleep 60; }
if [ "$RANK" = 0 ] && [ "$PYTORCH_EXEC_GENERATION" = 0 ]; then relist 'a:2\nb:1\n'; fi
if [ "$RANK" = 0 ] && [ "$PYTORCH_EXEC_GENERATION" = 1 ]; then relist 'a:2\nb:2\n'; fi
[ "$PYTORCH_EXEC_GENERATION" -lt 2 ] && exec sleep 60
exit 0
""")
    r = run(["--kill-grace", "1", "--nnodes", "1:2", "--last-call", "0.3", "-x", "HOSTFILE",
             "--hostfile", hostfile, "--launch-agent", agent(marker), body], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}")
    rows = sorted(r.stdout.splitlines())
    want = sorted(["gen 0 rank 0 of 2 node a local 0", "gen 0 rank 1 of 2 node b local 0",
                   "gen 1 rank 0 of 3 node a local 0", "gen 1 rank 1 of 3 node a local 1",
                   "gen 1 rank 2 of 3 node b local 0",
                   "gen 2 rank 0 of 4 node a local 0", "gen 2 rank 1 of 4 node a local 1",
                   "gen 2 rank 2 of 4 node b local 0", "gen 2 rank 3 of 4 node b local 1"])
    check(rows == want, f"{rows}\n{r.stderr[-3000:]}")
    check("node(s) a listed with other slots; re-forming the group on 2 node(s)" in r.stderr,
          r.stderr[-3000:])
    assert_no_leftovers(marker, timeout=10)


def test_below_the_minimum_the_job_fails():
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    r = run(["--nnodes", "3:3", "-H", "a,b,c", "--launch-agent", agent(marker), WORKER],
            env=env, timeout=90)
    check(r.returncode == 1, f"exit {r.returncode}: {r.stderr[-2000:]}")
    check("node b: lost contact with its daemon" in r.stderr and
          "2 node(s) left, --nnodes needs at least 3" in r.stderr, r.stderr[-2000:])
    assert_no_leftovers(marker, timeout=5)
    r = run(["--nnodes", "2:3", "--max-scale-events", "0", "-H", "a,b,c", "--launch-agent",
             agent(marker), WORKER], env=env, timeout=90)
    check(r.returncode == 1 and "no scale events left (--max-scale-events 0)" in r.stderr,
          f"exit {r.returncode}: {r.stderr[-2000:]}")
    assert_no_leftovers(marker, timeout=5)


def test_below_the_minimum_the_job_waits_for_a_replacement():
    """--nnodes 2:2 --hostfile a,b: b's daemon dies in generation 0; one node is left, so a's
    ranks are stopped and the job waits (--join-timeout) for another host.  c is added to the
    hostfile: generation 1 runs on a and c.  With nothing added, the job fails once the join
    timeout is over, saying how many nodes it had."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    hostfile = os.path.join(tmpdir(), "hosts")
    with open(hostfile, "w") as f:
        f.write("a\nb\n")
    args = [EXEC, "--kill-grace", "1", "--nnodes", "2:2", "--hostfile", hostfile, "--launch-agent",
            agent(marker)]
    out, err = waits_until_c_is_listed(args + ["--join-timeout", "60", WORKER], env, hostfile,
                                       "1 node(s) left, --nnodes needs at least 2")
    rows = sorted(out.splitlines())
    check(rows == ["gen 1 rank 0 of 2 node a group 0/2 restarts 1",
                   "gen 1 rank 1 of 2 node c group 1/2 restarts 1"], f"{rows}\n{err}")
    assert_no_leftovers(marker, timeout=5)
    with open(hostfile, "w") as f:
        f.write("a\nb\n")
    t0 = time.monotonic()
    r = run(args[1:] + ["--join-timeout", "1", WORKER], env=env, timeout=60)
    took = time.monotonic() - t0
    check(r.returncode == 1 and "only 1 of at least 2 node(s) left or arrived within the join "
          "timeout of 1 s (--join-timeout)" in r.stderr, f"exit {r.returncode}: {r.stderr}")
    check(took < 20, f"took {took:.1f} s")
    assert_no_leftovers(marker, timeout=5)


def test_too_few_hosts_at_the_start_wait_for_more():
    """--nnodes 2:3 with a hostfile that lists only a (or a discovery command that prints no
    host yet): the job says so and waits, as torchrun's rendezvous does; once b is listed (and
    the last call is over) generation 0 runs on a and b.  Listed nothing more, it fails when the
    join timeout is over, having started nothing; SIGTERM ends the wait at once (143), the
    discovery command it was running with it."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    hostfile = os.path.join(tmpdir(), "hosts")
    hello = script('#!/bin/sh\necho "gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE '
                   'node $PE_NODE"\n')
    base = [EXEC, "--nnodes", "2:3", "--last-call", "0.5", "--launch-agent", agent(marker)]
    for first, source in (("a\n", ["--hostfile", hostfile]),
                          ("", ["--host-discovery", f"cat {hostfile}",
                                "--host-discovery-interval", "0.2"])):
        with open(hostfile, "w") as f:
            f.write(first)
        p = subprocess.Popen(base + source + ["--join-timeout", "60", hello], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = []
        try:
            said = lines_until(p.stderr, "waiting up to 60 s for more (--join-timeout)")
            check(said and f"lists {first.count('a')} host(s), --nnodes 2:3 needs at least 2"
                  in said[-1], "".join(said))
            others = [q for q in processes_with_marker(marker) if q != p.pid]
            check(not any(b"pytorch_execd" in open(f"/proc/{q}/cmdline", "rb").read()
                          for q in others if os.path.exists(f"/proc/{q}")),
                  "daemons started before MIN hosts")
            with open(hostfile + ".new", "w") as f:
                f.write("a\nb\n")
            os.rename(hostfile + ".new", hostfile)
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        check(p.returncode == 0, f"{source[0]}: exit {p.returncode}: {''.join(said) + err}")
        check(sorted(out.splitlines()) == ["gen 0 rank 0 of 2 node a", "gen 0 rank 1 of 2 node b"],
              f"{source[0]}: {out}\n{err}")
        assert_no_leftovers(marker, timeout=5)
    with open(hostfile, "w") as f:
        f.write("a\n")
    t0 = time.monotonic()
    r = run(base[1:] + ["--hostfile", hostfile, "--join-timeout", "1", hello], env=env, timeout=60)
    check(r.returncode == 1 and "only 1 of at least 2 host(s) listed within the join timeout of "
          "1 s (--join-timeout)" in r.stderr, f"exit {r.returncode}: {r.stderr}")
    check(time.monotonic() - t0 < 20, f"took {time.monotonic() - t0:.1f} s")
    # SIGTERM while the first discovery runs, and while the job waits (a discovery running).
    for command, when in (("sleep 30", "while running the --host-discovery command"),
                          (f"sleep 0.5; cat {hostfile}", "while waiting for nodes")):
        p = subprocess.Popen(base + ["--host-discovery", command, hello], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if "cat" in command:
            check("waiting up to" in p.stderr.readline(), "no wait")
        check(wait_until(lambda: [q for q in processes_with_marker(marker) if q != p.pid], 10),
              "the discovery command does not run")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        check(p.returncode == 143 and f"interrupted by signal 15 {when}" in err,
              f"exit {p.returncode}: {err}")
        assert_no_leftovers(marker, timeout=5)


def test_a_slow_first_node_joins_later():
    """--nnodes 2:3 on a, b, c, c's daemon slow to start (its launch agent waits): generation 0
    starts on a and b once they are ready and the start's last call (10 s) is over, not when c
    is (nor at the daemon timeout); c joins in generation 1 once ready.  A c that never starts
    does not hold the job: it ends after generation 0, c's launch agent ended at once (not
    waited for)."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    slow = script(f"""#!/bin/sh
host=$1; shift
if [ "$host" = c ]; then sleep "$PE_C_DELAY"; fi
exec env -i PATH=/usr/bin:/bin PE_TEST_MARKER={marker} PE_NODE="$host" "$@"
""")
    worker = script("""#!/bin/sh
echo "gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE node $PE_NODE"
if [ "$PYTORCH_EXEC_GENERATION" = 0 ] && [ -z "$PE_ONCE" ]; then exec sleep 60; fi
""")
    args = ["-v", "--nnodes", "2:3", "--last-call", "0.5", "-H", "a,b,c", "--launch-agent",
            f"{slow} {{host}}", worker]
    t0 = time.monotonic()
    r = run(args, env=dict(env, PE_C_DELAY="12"), timeout=90)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}")
    check("starting without node(s) c, not ready yet: they join when they are" in r.stderr,
          r.stderr[-3000:])
    rows = sorted(r.stdout.splitlines())
    check(rows == ["gen 0 rank 0 of 2 node a", "gen 0 rank 1 of 2 node b",
                   "gen 1 rank 0 of 3 node a", "gen 1 rank 1 of 3 node b",
                   "gen 1 rank 2 of 3 node c"], f"{rows}\n{r.stderr[-3000:]}")
    check(time.monotonic() - t0 < 40, f"took {time.monotonic() - t0:.1f} s")
    assert_no_leftovers(marker, timeout=5)
    t0 = time.monotonic()
    r = run(["-x", "PE_ONCE=1"] + args, env=dict(env, PE_C_DELAY="600",
                                                   PYTORCH_EXEC_DAEMON_TIMEOUT="40"), timeout=90)
    took = time.monotonic() - t0
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}")
    check(sorted(r.stdout.splitlines()) == ["gen 0 rank 0 of 2 node a", "gen 0 rank 1 of 2 node b"],
          f"{r.stdout}\n{r.stderr[-3000:]}")
    check(took < 30 and "did not exit: killing it" not in r.stderr,
          f"took {took:.1f} s, c's agent waited for: {r.stderr[-3000:]}")
    assert_no_leftovers(marker, timeout=5)


def test_below_the_minimum_before_the_start_the_hostfile_brings_more():
    """--nnodes 2:2 --hostfile a,b where b's daemon cannot start: before generation 0 the job is
    below MIN; it waits, watching the hostfile, and c listed later makes the first generation
    (a and c)."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    hostfile = os.path.join(tmpdir(), "hosts")
    with open(hostfile, "w") as f:
        f.write("a\nb\n")
    agent_b_fails = script(f"""#!/bin/sh
host=$1; shift
[ "$host" = b ] && exit 1
exec env -i PATH=/usr/bin:/bin PE_TEST_MARKER={marker} PE_NODE="$host" "$@"
""")
    hello = script('#!/bin/sh\necho "gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE '
                   'node $PE_NODE"\n')
    out, err = waits_until_c_is_listed(
        [EXEC, "--nnodes", "2:2", "--last-call", "0.3", "--join-timeout", "60", "--hostfile",
         hostfile, "--launch-agent", f"{agent_b_fails} {{host}}", hello], env, hostfile,
        "node b: its daemon could not be started")
    check(sorted(out.splitlines()) == ["gen 0 rank 0 of 2 node a", "gen 0 rank 1 of 2 node c"],
          f"{out}\n{err}")
    assert_no_leftovers(marker, timeout=5)


def test_generations_are_a_multiple_of_nnodes_multiple():
    """--nnodes 2:4 --nnodes-multiple 2 on a, b, c, d: b's daemon dies; of the three left, a and c
    form generation 1 and d stands by."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    r = run(["-v", "--nnodes", "2:4", "--nnodes-multiple", "2", "-H", "a,b,c,d", "--launch-agent",
             agent(marker), WORKER], env=env, timeout=90)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}")
    check(sorted(r.stdout.splitlines()) == ["gen 1 rank 0 of 2 node a group 0/2 restarts 1",
                                            "gen 1 rank 1 of 2 node c group 1/2 restarts 1"],
          f"{r.stdout}\n{r.stderr[-2000:]}")
    assert_no_leftovers(marker, timeout=5)


def test_node_counts_are_checked_against_the_allocation():
    r = run(["--nnodes", "4:5", "-H", "a,b,c", "true"], timeout=30)
    check(r.returncode == 2 and "--nnodes 4:5 needs at least 4 nodes; -H a,b,c has 3" in r.stderr,
          f"exit {r.returncode}: {r.stderr}")


def test_random_losses_and_arrivals():
    """Fault injection: daemons killed and hosts added to the hostfile at random moments (while
    the daemons start, while ranks run, while the group re-forms); a killed host, still listed,
    comes back after its cool-down.  Every job ends by itself with status 0, and nothing is left
    running.  PE_ELASTIC_SOAK=N runs N jobs (default 3); PE_SOAK_SEED fixes the draws."""
    seed = int(os.environ.get("PE_SOAK_SEED", time.time()))
    rng = random.Random(seed)
    runs = int(os.environ.get("PE_ELASTIC_SOAK", "3"))
    body = script("#!/bin/sh\necho \"gen $PYTORCH_EXEC_GENERATION $RANK $WORLD_SIZE\"\n"
                  "sleep 0.5\n")
    hangs = failed = kills = arrivals = reforms = 0
    for i in range(runs):
        env = job_env()
        marker = env["PE_TEST_MARKER"]
        hostfile = os.path.join(tmpdir(), "hosts")
        listed = ["n0", "n1", "n2"]
        with open(hostfile, "w") as f:
            f.write("".join(h + "\n" for h in listed))
        p = subprocess.Popen([EXEC, "--kill-grace", "1", "--nnodes", "2:4", "--hostfile", hostfile,
                              "--host-cooldown", "0.5", "--last-call", "0.2", "--join-timeout",
                              "20", "--launch-agent", agent(marker), body], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(rng.randint(1, 3)):
            time.sleep(rng.uniform(0, 0.8))
            new = [h for h in ("n3", "n4") if h not in listed]
            if new and rng.random() < 0.4:
                listed.append(new[0])
                with open(hostfile + ".new", "w") as f:
                    f.write("".join(h + "\n" for h in listed))
                os.rename(hostfile + ".new", hostfile)
                arrivals += 1
                continue
            try:
                os.kill(daemon_of(marker, rng.choice(listed)), 9)
                kills += 1
            except (AssertionError, ProcessLookupError):
                pass  # not started yet, or the job is over
        try:
            out, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            hangs += 1
            p.kill()
            out, err = p.communicate()
        reforms += err.count("re-forming the group")
        if p.returncode != 0:
            failed += 1
            print(f"  run {i}: exit {p.returncode}: {err[-1500:]}")
        assert_no_leftovers(marker, timeout=10)
    print(f"  seed {seed}: {runs} jobs, {kills} daemons killed, {arrivals} hosts added, {reforms} "
          f"re-formings: {runs - failed - hangs} finished, {failed} failed, {hangs} hung")
    check(failed == 0 and hangs == 0, f"{failed} failed, {hangs} hung (PE_SOAK_SEED={seed})")


if __name__ == "__main__":
    main([test_a_lost_node_reforms_the_group, test_a_rank_killed_as_its_node_goes_is_the_nodes_loss, test_a_lost_relay_takes_the_nodes_below_it,
          test_mpi_programs_run_in_the_reformed_group,
          test_a_spare_takes_the_place_of_a_lost_node, test_a_frozen_daemon_is_lost_by_its_silence,
          test_a_host_that_comes_back_waits_its_cooldown,
          test_a_host_no_longer_listed_leaves_and_may_come_back,
          test_a_host_listed_with_other_slots_runs_that_many_ranks,
          test_below_the_minimum_the_job_fails,
          test_below_the_minimum_the_job_waits_for_a_replacement,
          test_too_few_hosts_at_the_start_wait_for_more, test_a_slow_first_node_joins_later,
          test_below_the_minimum_before_the_start_the_hostfile_brings_more,
          test_generations_are_a_multiple_of_nnodes_multiple,
          test_node_counts_are_checked_against_the_allocation,
          test_random_losses_and_arrivals])
