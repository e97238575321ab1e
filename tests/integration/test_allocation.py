"""Allocations: -H, --hostfile and a SLURM allocation's variables, mapped by slot or node,
shown with --dry-run; a job on this machine only runs; mistakes are one line."""
import os
import re
import socket
import subprocess

from harness import (assert_no_leftovers, check, finish, free_port, main, marker_env, run, start,
                     tmpdir)


def ranks_by_node(out):
    nodes, cur = {}, None
    for line in out.splitlines():
        if line.startswith("node "):
            cur = line.split("(")[1].split(",")[0].split(")")[0]
            nodes[cur] = []
        elif line.startswith("  rank "):
            nodes[cur].append(int(line.split()[1]))
    return nodes


def test_host_option_with_different_slot_counts():
    r = run(["--dry-run", "-H", "a:1,b:3", "./train"])
    check(r.returncode == 0, r.stderr)
    check(ranks_by_node(r.stdout) == {"a": [0], "b": [1, 2, 3]}, r.stdout)
    check(r.stdout.startswith("Job map: 4 ranks on 2 node(s)"), r.stdout)


def test_map_by_node_is_round_robin():
    r = run(["--dry-run", "-H", "a:2,b:2", "--map-by", "node", "./train"])
    check(ranks_by_node(r.stdout) == {"a": [0, 2], "b": [1, 3]}, r.stdout)


def test_hostfile_and_npernode():
    path = os.path.join(tmpdir(), "hosts")
    with open(path, "w") as f:
        f.write("# two nodes\nn1 slots=4\n\nn2:4\n")
    r = run(["--dry-run", "--hostfile", path, "-N", "2", "./train"])
    check(ranks_by_node(r.stdout) == {"n1": [0, 1], "n2": [2, 3]}, r.stdout)


def test_slurm_allocation_sets_the_default_count():
    env = dict(os.environ, SLURM_JOB_NODELIST="gpu-[01-03]", SLURM_TASKS_PER_NODE="2(x2),1",
               SLURM_JOB_ID="99")
    r = run(["--dry-run", "./train"], env=env)
    check(r.returncode == 0, r.stderr)
    check(ranks_by_node(r.stdout) == {"gpu-01": [0, 1], "gpu-02": [2, 3], "gpu-03": [4]}, r.stdout)


def test_this_machine_as_a_host_runs():
    r = run(["-H", "localhost:3", "sh", "-c", 'echo "$RANK/$WORLD_SIZE/$LOCAL_WORLD_SIZE"'])
    check(r.returncode == 0, r.stderr)
    check(sorted(r.stdout.split()) == ["0/3/3", "1/3/3", "2/3/3"], r.stdout)


def test_names_of_this_machine_are_one_node():
    """-H localhost:2,127.0.0.1:1,HOSTNAME:1 is this machine: one node of 4 ranks (they were three
    nodes, each rank its node's local rank 0), as mpirun takes it."""
    r = run(["-H", f"localhost:2,127.0.0.1:1,{socket.gethostname()}:1", "sh", "-c",
             'echo "$RANK $LOCAL_RANK/$LOCAL_WORLD_SIZE $GROUP_WORLD_SIZE"'])
    check(r.returncode == 0 and sorted(r.stdout.splitlines()) ==
          [f"{i} {i}/4 1" for i in range(4)], f"exit {r.returncode}: {r.stdout} {r.stderr}")


def test_a_hostfile_line_with_max_slots_alone_has_that_many_slots():
    path = os.path.join(tmpdir(), "hosts")
    with open(path, "w") as f:
        f.write("n1 max_slots=3\nn2 slots=1 max_slots=4\n")
    r = run(["--dry-run", "--hostfile", path, "./train"])
    check(ranks_by_node(r.stdout) == {"n1": [0, 1, 2], "n2": [3]}, r.stdout + r.stderr)


def test_a_program_in_this_directory_is_found_after_path():
    """mpirun and srun run `prog` from the working directory when PATH has none."""
    d = tmpdir()
    with open(os.path.join(d, "pe-here"), "w") as f:
        f.write("#!/bin/sh\necho here $RANK\n")
    os.chmod(os.path.join(d, "pe-here"), 0o755)
    r = run(["-n", "1", "pe-here"], cwd=d)
    check(r.returncode == 0 and r.stdout == "here 0\n", f"exit {r.returncode}: {r.stdout} {r.stderr}")
    r = run(["-n", "1", "--wdir", d, "pe-here"])
    check(r.returncode == 0 and r.stdout == "here 0\n", f"exit {r.returncode}: {r.stdout} {r.stderr}")


def test_a_python_script_runs_with_python3_as_under_torchrun():
    """`pytorch_exec -n 2 train.py` (torchrun's command line): a script that is not executable
    runs with the python3 of PATH, its arguments after it; so does -m MODULE, as python3 -m;
    --no-python runs the program itself."""
    d = tmpdir()
    with open(os.path.join(d, "train.py"), "w") as f:
        f.write("import os, sys\nprint('py', os.environ['RANK'], sys.argv[1:])\n")
    for prog in ("train.py", "./train.py"):
        r = run(["-n", "2", prog, "--lr", "1"], cwd=d)
        check(r.returncode == 0 and sorted(r.stdout.splitlines()) ==
              ["py 0 ['--lr', '1']", "py 1 ['--lr', '1']"], f"{prog}: {r.stdout} {r.stderr}")
    r = run(["-n", "1", "missing.py"], cwd=d)
    check(r.returncode == 127 and "'missing.py' not found" in r.stderr, r.stderr)
    # torchrun's -m MODULE and --no-python.
    r = run(["-n", "2", "-m", "train", "--lr", "1"], cwd=d)
    check(r.returncode == 0 and sorted(r.stdout.splitlines()) ==
          ["py 0 ['--lr', '1']", "py 1 ['--lr', '1']"], f"-m: {r.stdout} {r.stderr}")
    r = run(["-n", "1", "--no-python", "train.py"], cwd=d)
    check(r.returncode == 126 and "not executable" in r.stderr, f"--no-python: {r.stderr}")


def test_two_launchers_started_together_make_one_job():
    """torchrun's way to try two nodes on one machine, the same line twice, started in the same
    instant (a script's `&`): exactly one hosts.  Each probed the endpoint's port and let it go,
    so both could find it taken (both joined, and waited for a host until the join timeout) or
    both free (the second failed to bind): 4 of 10 such pairs failed.  Then both could bind it
    (SO_REUSEADDR) and both fail to listen: 1 pair in 16."""
    env = marker_env({"PYTORCH_EXEC_RDZV_SECRET": "together"})
    for i in range(20):
        args = ["--nnodes", "2", "--nproc-per-node", "1", "--join-timeout", "15",
                "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", f"pair{i}",
                "sh", "-c", 'echo "$RANK/$WORLD_SIZE $GROUP_RANK/$GROUP_WORLD_SIZE"']
        procs = [start(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        res = finish(procs)
        for rc, _, err in res:
            check(rc == 0, f"pair {i}: exit {rc}: {err}")
        lines = sorted(ln for _, out, _ in res for ln in out.splitlines())
        check(lines == ["0/2 0/2", "1/2 1/2"], f"pair {i}: {lines}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def test_a_launcher_waiting_for_the_rendezvous_says_so():
    """Join mode: a host waiting for its nodes, and a node waiting for its host, say what they
    wait for and until when after 10 s (then every minute), then fail at the join timeout.  They
    waited in silence (600 s by default), like a hung job."""
    env = marker_env({"PYTORCH_EXEC_RDZV_SECRET": "alone"})
    host_port, no_port = free_port(), free_port()
    common = ["--nnodes", "2", "--join-timeout", "13"]
    host = start(common + ["--rdzv-endpoint", f"127.0.0.1:{host_port}", "--rdzv-id", "solo",
                           "true"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True)
    node = start(common + ["--rdzv-endpoint", f"127.0.0.1:{no_port}", "--rdzv-id", "solo",
                           "--rdzv-conf", "is_host=0", "true"], env=env, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    (hrc, _, herr), (nrc, _, nerr) = finish([host, node], timeout=60)
    check(hrc == 1 and re.search(
        rf"^pytorch_exec: waiting for nodes: 1 of at least 2 here \(rendezvous solo at "
        rf"127.0.0.1:{host_port}\); giving up in [1-4] s \(--join-timeout\)\n"
        rf"pytorch_exec: only 1 of at least 2 node\(s\) joined within the join timeout", herr),
        f"host: exit {hrc}: {herr!r}")
    check(nrc == 1 and re.search(
        rf"^pytorch_exec: waiting to join the rendezvous host 127.0.0.1:{no_port} \(.*refused.*\); "
        rf"giving up in [1-4] s \(--join-timeout\)\npytorch_exec: could not join", nerr),
        f"node: exit {nrc}: {nerr!r}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def test_mistakes():
    cases = [
        (["-H", "a:2", "-n", "3", "true"], "-n 3 but -H a:2 has 2 slots (add --oversubscribe"),
        (["-H", "a:x", "true"], "bad slot count 'x'"),
        (["--hostfile", "/no/such/hostfile", "true"], "--hostfile: cannot open '/no/such/hostfile'"),
        (["-H", "a", "--hostfile", "/x", "true"], "either -H or --hostfile"),
        (["-N", "0", "true"], "-N: expected a positive integer"),
    ]
    for args, text in cases:
        r = run(args)
        check(r.returncode == 2 and len(r.stderr.splitlines()) == 1 and text in r.stderr,
              f"{args}: {r.returncode} {r.stderr!r}")
    # Hosts that ssh cannot reach: the daemon that could not start is named, nothing hangs.
    r = run(["-H", "no-such-host-a.invalid:1,no-such-host-b.invalid:1", "true"], timeout=60)
    check(r.returncode != 0 and re.search(r"node no-such-host-[ab]\.invalid: (its daemon could not be "
                                          r"started|cannot start its daemon)", r.stderr), r.stderr)
    r = run(["true"], env=dict(os.environ, SLURM_JOB_NODELIST="n[1-"))
    check(r.returncode == 2 and "hostlist 'n[1-': unmatched '['" in r.stderr, r.stderr)


if __name__ == "__main__":
    main([test_host_option_with_different_slot_counts, test_map_by_node_is_round_robin,
          test_hostfile_and_npernode, test_slurm_allocation_sets_the_default_count,
          test_this_machine_as_a_host_runs, test_names_of_this_machine_are_one_node,
          test_a_hostfile_line_with_max_slots_alone_has_that_many_slots,
          test_a_program_in_this_directory_is_found_after_path,
          test_a_python_script_runs_with_python3_as_under_torchrun,
          test_two_launchers_started_together_make_one_job,
          test_a_launcher_waiting_for_the_rendezvous_says_so, test_mistakes])
