"""Join mode across network namespaces (netns.py): every host runs its own
`pytorch_exec --rdzv-endpoint HOST:PORT ...`, as in a Kubernetes PyTorchJob or with torchrun, each
in its own UTS namespace so that its host name is its own.  The one whose address is HOST hosts
the job; the others join it.  Checked: a torch gloo allreduce across hosts with torchrun's
flags; the Kubeflow training operator's PET_* variables alone (c10d and static rendezvous); a
wrong secret refused with one line while the job goes on; a
node killed (SIGKILL of its pytorch_exec and workers) and the job finishing on the others; a
node that starts late joining a new generation; SIGTERM to a joining node and to the host; the
host lost; nothing left running anywhere.  Needs root (skips otherwise)."""
import os
import re
import signal
import subprocess
import time

import netns
from harness import (EXEC, SRCDIR, TORCH_PYTHON, TestFailure, assert_no_leftovers, check, finish,
                     main, marker_env, need_torch, script, tmpdir, skip)

BED = None
SECRET = "join test secret"


def endpoint(port):
    return f"{BED.addr(1)}:{port}"


def node(i, args, env, name=None):
    """pytorch_exec ARGS on host i (1-based), named node<i> (or `name`), in the background."""
    cmd = ["ip", "netns", "exec", BED.nodes[i - 1], "unshare", "-u", "sh", "-c",
           'hostname "$0" && exec "$@"', name or f"node{i}", EXEC] + args
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def secret_env(extra=None):
    env = marker_env(extra)
    env["PYTORCH_EXEC_RDZV_SECRET"] = SECRET
    return env


def wait_files(d, n, timeout=30):
    deadline = time.monotonic() + timeout
    while len(os.listdir(d)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    check(len(os.listdir(d)) >= n, f"only {len(os.listdir(d))} of {n} ranks started")


def wait_generation(d, world, after=-1, timeout=30):
    """Waits for a generation later than `after` whose `world` ranks all wrote up.G.RANK.WORLD
    into `d`; returns its number."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gens = {}
        for f in os.listdir(d):
            _, g, _, w = f.split(".")
            if int(w) == world and int(g) > after:
                gens[int(g)] = gens.get(int(g), 0) + 1
        done = [g for g, n in gens.items() if n == world]
        if done:
            return max(done)
        time.sleep(0.05)
    raise TestFailure(f"no generation of {world} ranks after {after}: {sorted(os.listdir(d))}")


ENV_SCRIPT = ("#!/bin/sh\necho \"$(hostname) rank=$RANK world=$WORLD_SIZE group=$GROUP_RANK "
              "groups=$GROUP_WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE run=$TORCHELASTIC_RUN_ID "
              "master=$MASTER_ADDR secret=${PYTORCH_EXEC_RDZV_SECRET:-unset}\"\n")


def test_gloo_allreduce_with_torchrun_flags():
    """Three hosts with 1, 2 and 1 ranks, torchrun's spellings; host 3 starts first (it waits
    for the host), host 1 last.  Each host prints its own ranks' lines; rank 0 the result."""
    need_torch()
    env = secret_env({"GLOO_SOCKET_IFNAME": "pe0"})
    prog = os.path.join(SRCDIR, "examples", "hello_allreduce.py")
    procs = {}
    for i, n in ((3, 1), (2, 2), (1, 1)):
        procs[i] = node(i, ["--nnodes", "3", "--nproc_per_node", str(n), "--rdzv_backend", "c10d",
                            "--rdzv_endpoint", endpoint(29400), "--rdzv_id", "allreduce",
                            TORCH_PYTHON, prog], env)
        time.sleep(0.3)
    res = dict(zip((3, 2, 1), finish([procs[3], procs[2], procs[1]], timeout=180)))
    for i, (rc, out, err) in res.items():
        check(rc == 0, f"host {i}: exit {rc}: {out} {err[-2000:]}")
    check("allreduce over 4 ranks: [6.0, 10.0, 14.0, 18.0] (correct)" in res[1][1], res[1][1])
    for i, want in ((1, 1), (2, 2), (3, 1)):
        rows = re.findall(r"rank \d+ of 4 .* on (node\d)", res[i][1])
        check(rows == [f"node{i}"] * want, f"host {i}: {res[i][1]}")
    check("rendezvous allreduce complete: 3 node(s)" in res[1][2], res[1][2])
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def test_pet_variables_only():
    """No flags but the program: PET_* as the Kubeflow training operator sets them (c10d with
    MASTER_* set too), the secret from PYTORCH_EXEC_RDZV_SECRET, which workers do not see.
    PET_TEE and PET_LOG_DIR too: each node writes its own ranks' files, by local rank, and
    prefixes its terminal's lines, as each node's torchrun does."""
    logs = os.path.join(tmpdir(), "logs")
    env = secret_env({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_RDZV_BACKEND": "c10d",
                      "PET_RDZV_ENDPOINT": endpoint(29401), "PET_RDZV_ID": "petjob",
                      "PET_MASTER_ADDR": BED.addr(1), "PET_MASTER_PORT": "23456",
                      "PET_NODE_RANK": "0", "PET_TEE": "1", "PET_LOG_DIR": logs})
    prog = script(ENV_SCRIPT)
    res = finish([node(2, [prog], env), node(1, [prog], env)])
    lines = []
    for rc, out, err in res:
        check(rc == 0, f"exit {rc}: {out} {err}")
        lines += out.splitlines()
    want = {(n, l): f"node{n + 1} rank={2 * n + l} world=4 group={n} groups=2 local={l}/2 "
                    f"run=petjob master={BED.addr(1)} secret=unset" for n in (0, 1) for l in (0, 1)}
    check(sorted(lines) == sorted(f"[default{l}]:{v}" for (_, l), v in want.items()),
          f"{sorted(lines)} != {sorted(want.values())}")
    runs = sorted(os.listdir(logs))
    check(len(runs) == 2 and all(r.startswith("petjob_") for r in runs), runs)
    files = set()
    for r in runs:
        for l in (0, 1):
            with open(os.path.join(logs, r, "attempt_0", str(l), "stdout.log")) as f:
                files.add((l, f.read()))
    check(files == {(l, v + "\n") for (_, l), v in want.items()}, f"{files}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def test_static_rendezvous_keeps_node_ranks():
    """PET_MASTER_ADDR/PORT and PET_NODE_RANK (torchrun's static rendezvous): nodes 2 and 1
    start before node 0, in that order; GROUP_RANK is each node's own rank.  Node 2 tags its
    own output (--tag-output): its partial last line is ended, the others' are not."""
    prog = script(ENV_SCRIPT + "printf 'no newline'\n")
    env = secret_env({"PET_NNODES": "3", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": BED.addr(1),
                      "PET_MASTER_PORT": "29402"})
    procs = []
    for host, rank in ((3, 2), (2, 1), (1, 0)):
        procs.append(node(host, (["--tag-output"] if rank == 2 else []) + [prog],
                          dict(env, PET_NODE_RANK=str(rank))))
        time.sleep(0.3)
    res = finish(procs)
    for (rc, out, err), (host, rank) in zip(res, ((3, 2), (2, 1), (1, 0))):
        check(rc == 0, f"host {host}: exit {rc}: {err}")
        check(f"node{host} rank={rank} world=3 group={rank} groups=3" in out, f"host {host}: {out}")
    check(res[0][1].startswith("[1,2]<stdout>:node3 rank=2"), res[0][1])
    check(res[0][1].endswith("\n[1,2]<stdout>:no newline\n"), repr(res[0][1]))
    check(res[1][1].endswith("\nno newline"), repr(res[1][1]))
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def sleeper(d):
    """Generation 0 records its pid and sleeps; later generations print where they run."""
    return script(f"#!/bin/sh\nif [ $PYTORCH_EXEC_GENERATION = 0 ]; then echo $$ > {d}/up.$RANK; "
                  f"sleep ${{SLEEP:-120}}; exit 0; fi\n"
                  "echo gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE on $(hostname)\n")


def recorder(d, last_gen=None):
    """Each rank records its pid in d/up.GENERATION.RANK.WORLD_SIZE and prints where it runs;
    then it sleeps, or exits 0 in generation `last_gen`."""
    end = f"[ $PYTORCH_EXEC_GENERATION = {last_gen} ] && exit 0\n" if last_gen is not None else ""
    return script(f"#!/bin/sh\necho $$ > {d}/up.$PYTORCH_EXEC_GENERATION.$RANK.$WORLD_SIZE\n"
                  "echo gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE on $(hostname)\n"
                  f"{end}exec sleep 120\n")


def test_wrong_secret_is_refused():
    """While a two-host job runs: a node with the wrong secret is refused with one line and
    exits non-zero; the job is not disturbed.  (A second pytorch_exec on a host is a node of its
    own, as torchrun's agents: see test_torch.)"""
    env = secret_env({"SLEEP": "4"})
    d = tmpdir()
    prog = sleeper(d)
    args = ["--nnodes", "2:3", "--rdzv-endpoint", endpoint(29403), "--rdzv-id", "refusals", prog]
    job = [node(1, args, env), node(2, args, env)]
    wait_files(d, 2)
    bad = node(3, args, dict(env, PYTORCH_EXEC_RDZV_SECRET="not the secret"))
    ((rc_bad, _, err_bad),) = finish([bad], timeout=30)
    check(rc_bad != 0, f"wrong secret: exit {rc_bad}")
    check(f"pytorch_exec: refused by the rendezvous host {endpoint(29403)}: authentication failed"
          in err_bad, err_bad)
    res = finish(job)
    for rc, out, err in res:
        check(rc == 0, f"exit {rc}: {err}")
    check("re-forming" not in res[0][2] and "joined" not in res[0][2], res[0][2])
    check("(node 'node3'): authentication failed" in res[0][2], res[0][2])
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def test_killed_node_and_late_node():
    """--nnodes 2:3: hosts 1 and 2 start the job; host 3 starts late and joins generation 1;
    then its pytorch_exec and its worker are killed (SIGKILL): generation 2 runs on hosts 1 and
    2 and finishes."""
    env = secret_env()
    d = tmpdir()
    prog = recorder(d, last_gen=2)
    args = ["-v", "--nnodes", "2:3", "--last-call", "0.2", "--rdzv-endpoint", endpoint(29404),
            "--rdzv-id", "elastic", prog]
    job = [node(1, args, env), node(2, args, env)]
    wait_generation(d, 2)
    late = node(3, args, env)
    g = wait_generation(d, 3)
    check(g == 1, f"generation {g} on three hosts")
    victim = int(open(os.path.join(d, "up.1.2.3")).read())
    t0 = time.monotonic()
    late.kill()
    os.kill(victim, signal.SIGKILL)
    rc3, _, _ = finish([late])[0]
    check(rc3 == -signal.SIGKILL, f"killed node: {rc3}")
    wait_generation(d, 2, after=1)
    took = time.monotonic() - t0
    res = finish(job)
    for rc, out, err in res:
        check(rc == 0, f"exit {rc}: {out} {err[-2000:]}")
    check("gen 2 rank 0 of 2 on node1" in res[0][1], res[0][1])
    check("gen 2 rank 1 of 2 on node2" in res[1][1], res[1][1])
    check("gen 1 rank 2 of 3 on node3" not in res[0][1], "a joined node's output went to the host")
    check(re.search(r"node node3: .*re-forming the group on the 2 node\(s\) left", res[0][2]),
          res[0][2])
    times = re.findall(r"generation (\d) timeline: detected 0 ms -> stopped (\d+) ms -> "
                       r"re-formed (\d+) ms -> all workers running (\d+) ms", res[0][2])
    check([t[0] for t in times] == ["1", "2"], res[0][2])
    for gen, stopped, reformed, running in times:
        check(int(stopped) <= int(reformed) <= int(running), times)
    print(f"  arrival -> larger group running: {times[0][3]} ms (last call 200 ms); loss -> "
          f"re-formed group running: {times[1][3]} ms (stopped {times[1][1]} ms); the job done "
          f"{took:.2f} s after the kill")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def test_signals_rejoin_and_a_lost_host():
    """SIGTERM to a joined node: it leaves, its worker gets the signal and time to say so, the
    job goes on (>= MIN), the host saying the node left (not that it lost contact); the node
    started again is refused during its cool-down, keeps trying,
    and joins.  SIGTERM to the host: the whole job stops, every node exits with its status.
    SIGKILL of the host: the nodes say they lost it and exit 1."""
    env = secret_env()
    d = tmpdir()
    prog = script(f"#!/bin/sh\necho $$ > {d}/up.$PYTORCH_EXEC_GENERATION.$RANK.$WORLD_SIZE\n"
                  "trap 'echo saved gen $PYTORCH_EXEC_GENERATION on $(hostname); kill $!; exit 0' "
                  "TERM\nsleep 120 & wait\n")
    args = ["--nnodes", "1:3", "--last-call", "0.5", "--heartbeat-timeout", "2",
            "--host-cooldown", "1", "--rdzv-endpoint", endpoint(29405), "--rdzv-id", "signals", prog]
    others = [node(2, args, env), node(3, args, env)]
    host = node(1, args, env)
    g = wait_generation(d, 3)
    others[1].send_signal(signal.SIGTERM)
    rc, out, err = finish([others[1]])[0]
    check(rc == 128 + signal.SIGTERM, f"SIGTERM to a node: exit {rc}: {err}")
    check("leaving the job" in err and f"saved gen {g} on node3" in out, f"{out} {err}")
    g = wait_generation(d, 2, after=g)
    check(host.poll() is None and others[0].poll() is None, "the job ended with the node")
    t0 = time.monotonic()
    others[1] = node(3, args, env)
    wait_generation(d, 3, after=g)
    print(f"  node 3 joined again {time.monotonic() - t0:.2f} s after it was started again "
          "(cool-down 1 s)")
    host.send_signal(signal.SIGTERM)
    (rc1, _, err1), (rc2, _, err2), (rc3, _, err3) = finish([host] + others, timeout=30)
    check(rc1 == rc2 == rc3 == 128 + signal.SIGTERM,
          f"SIGTERM to the host: exits {rc1}, {rc2}, {rc3}: {err1} {err2} {err3}")
    check("kept out for another" in err1, err1)
    check("node node3: left the job (signal 15 to its pytorch_exec)" in err1, err1)
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)

    env = secret_env()
    d = tmpdir()
    args[-1] = recorder(d)
    joined = node(2, args, env)
    host = node(1, args, env)
    wait_generation(d, 2)
    host.kill()
    t0 = time.monotonic()
    rc, _, err = finish([joined], timeout=30)[0]
    check(rc == 1 and f"pytorch_exec: lost the rendezvous host {endpoint(29405)}" in err,
          f"exit {rc}: {err}")
    print(f"  host killed: the joined node exited {time.monotonic() - t0:.2f} s later")
    finish([host])
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def test_node_beyond_max_waits_as_a_spare():
    """--nnodes 2: a third node waits as a spare (no ranks); when node 2 leaves (SIGTERM), the
    spare takes its place and the group keeps two nodes."""
    env = secret_env()
    d = tmpdir()
    prog = recorder(d)
    args = ["-v", "--nnodes", "2", "--last-call", "0.2", "--rdzv-endpoint", endpoint(29407),
            "--rdzv-id", "spare", prog]
    host, second = node(1, args, env), node(2, args, env)
    g = wait_generation(d, 2)
    spare = node(3, args, env)
    time.sleep(1)
    check(not [f for f in os.listdir(d) if int(f.split(".")[1]) > g], "a spare changed the group")
    second.send_signal(signal.SIGTERM)
    wait_generation(d, 2, after=g)
    host.send_signal(signal.SIGTERM)
    res = finish([host, second, spare])
    check([r[0] for r in res] == [143, 143, 143], [(r[0], r[2][-500:]) for r in res])
    check(re.search(r"node node3 is ready: it waits as a spare", res[0][2]), res[0][2][-3000:])
    check(re.search(r"node node2: .*a spare taking its place", res[0][2]), res[0][2][-3000:])
    check(re.search(rf"gen {g + 1} rank 1 of 2 on node3", res[2][1]), res[2][1])
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def test_too_few_nodes_within_the_join_timeout():
    """--nnodes 4 with a 3 s join timeout: three nodes join, node 3 leaves again before the job
    starts, so two are there when the timeout ends: the host says so, every node exits 1."""
    env = secret_env()
    args = ["--nnodes", "4", "--rdzv-conf", "join_timeout=3", "--rdzv-endpoint", endpoint(29408),
            "--rdzv-id", "few", "true"]
    host, second, third = node(1, args, env), node(2, args, env), node(3, args, env)
    time.sleep(1)
    third.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    (rc1, _, err1), (rc2, _, err2), (rc3, _, _) = finish([host, second, third], timeout=30)
    check(rc1 == 1 and "only 2 of at least 4 node(s) joined within the join timeout of 3 s" in err1,
          f"host: exit {rc1}: {err1}")
    check("node node3 left before the job started" in err1, err1)
    check(rc2 == 1 and "the job ended with exit status 1" in err2, f"node 2: exit {rc2}: {err2}")
    check(rc3 == 128 + signal.SIGTERM, f"node 3: exit {rc3}")
    check(time.monotonic() - t0 < 5, "the join timeout was not kept")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def test_cut_off_host():
    """The host's link is cut: the joined node hears nothing for the heartbeat timeout, stops its
    worker and exits 1 saying so; the host goes on alone (MIN 1) until SIGTERM."""
    env = secret_env()
    d = tmpdir()
    prog = recorder(d)
    args = ["--nnodes", "1:2", "--last-call", "0.2", "--heartbeat-interval", "0.5",
            "--heartbeat-timeout", "1.5", "--rdzv-endpoint", endpoint(29406), "--rdzv-id", "cut",
            prog]
    joined = node(2, args, env)
    host = node(1, args, env)
    try:
        wait_generation(d, 2)
        t0 = time.monotonic()
        BED.cut(1)
        rc, _, err = finish([joined], timeout=30)[0]
        took = time.monotonic() - t0
    finally:
        BED.uncut(1)
    check(rc == 1 and f"pytorch_exec: lost the rendezvous host {endpoint(29406)}" in err,
          f"exit {rc}: {err}")
    check(took < 1.5 + 1.0, f"the node took {took:.2f} s to give up (heartbeat timeout 1.5 s)")
    print(f"  host cut off: the joined node gave up {took:.2f} s later (heartbeat timeout 1.5 s)")
    wait_generation(d, 1, after=0)  # the host alone
    host.send_signal(signal.SIGTERM)
    rc, _, err = finish([host])[0]
    check(rc == 128 + signal.SIGTERM, f"host: exit {rc}: {err}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


if __name__ == "__main__":
    why = netns.available()
    if why:
        skip(why)
    with netns.NetnsBed(4) as BED:
        main([test_pet_variables_only, test_static_rendezvous_keeps_node_ranks,
              test_wrong_secret_is_refused, test_killed_node_and_late_node,
              test_signals_rejoin_and_a_lost_host, test_node_beyond_max_waits_as_a_spare,
              test_too_few_nodes_within_the_join_timeout,
              test_cut_off_host,
              test_gloo_allreduce_with_torchrun_flags])
