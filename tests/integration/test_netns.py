"""Multi-node jobs across network namespaces: four separate hosts with their own addresses
(netns.py), daemons started with --launch-agent "ip netns exec {host}", the front end in a fifth
namespace.  torch's MASTER_ADDR must be reachable from the other hosts; Open MPI programs wire up
over TCP between them; cutting a host's link ends the job with its name (the heartbeat finds it
silent) and leaves nothing behind; an elastic job re-forms without a cut-off host and grows when
its hostfile or discovery command lists a new one.  Needs root (skips otherwise)."""
import os
import re
import shutil
import signal
import subprocess
import time

import netns
from harness import (EXEC, SRCDIR, TORCH_PYTHON, TestFailure, assert_no_leftovers, check, main,
                     marker_env, need_torch, script, skip, tmpdir)

BED = None
BIN = tmpdir()


def pe(args, env, timeout=120, ns=None, **kw):
    """pytorch_exec ARGS run in the front end's namespace (or in `ns`)."""
    cmd = ["ip", "netns", "exec", ns or BED.front, EXEC, "--launch-agent", "ip netns exec {host}"] + args
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise TestFailure(f"{' '.join(args)} did not finish within {timeout} s") from e


def hosts(spec):
    """'1:1,2:3' -> '<h1>:1,<h2>:3'"""
    return ",".join(f"{BED.nodes[int(i) - 1]}:{n}" for i, n in (x.split(":") for x in spec.split(",")))


def test_each_host_has_its_address():
    env = marker_env()
    r = pe(["-H", hosts("1:1,2:1,3:1,4:1"), "sh", "-c",
            "echo $RANK $(ip -4 -o addr show pe0 | awk '{print $4}') $MASTER_ADDR"], env)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    rows = sorted(r.stdout.split("\n")[:-1])
    want = [f"{i} {BED.addr(i + 1)}/24 {BED.addr(1)}" for i in range(4)]
    check(rows == want, f"{rows} != {want}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_master_addr_faces_the_other_hosts_when_the_front_end_is_node_0():
    """pytorch_exec runs on rank 0's host, whose first address is a bridge the other hosts
    cannot reach (as docker0 or cni0 would be): MASTER_ADDR is still the address they reach."""
    h1 = BED.nodes[0]
    for args in (["link", "add", "cni0", "type", "bridge"], ["addr", "add", "172.31.7.1/24", "dev", "cni0"],
                 ["link", "set", "cni0", "up"]):
        subprocess.run(["ip", "-n", h1, *args], check=True, timeout=30)
    try:
        listed = subprocess.run(["ip", "-n", h1, "-o", "-4", "addr"], capture_output=True, text=True).stdout
        check(listed.find("cni0") < listed.find("pe0"), f"the bridge is not listed first: {listed}")
        # radix 1: no other host talks to pytorch_exec directly (the route toward them decides)
        for radix in ("32", "1"):
            env = marker_env()
            r = pe(["--tree-radix", radix, "-H", hosts("1:1,2:1,3:1"), "sh", "-c", "echo $RANK $MASTER_ADDR"],
                   env, ns=h1)
            check(r.returncode == 0, f"radix {radix}: exit {r.returncode}: {r.stderr}")
            rows = sorted(r.stdout.split("\n")[:-1])
            want = [f"{i} {BED.addr(1)}" for i in range(3)]
            check(rows == want, f"radix {radix}: {rows} != {want}")
            assert_no_leftovers(env["PE_TEST_MARKER"])
    finally:
        subprocess.run(["ip", "-n", h1, "link", "del", "cni0"], timeout=30)


def test_torch_gloo_allreduce_across_hosts():
    need_torch()
    env = marker_env()
    r = pe(["-H", hosts("1:1,2:2,3:1,4:2"), "-x", "GLOO_SOCKET_IFNAME=pe0", TORCH_PYTHON,
            os.path.join(SRCDIR, "examples", "hello_allreduce.py")], env, timeout=180)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    check("allreduce over 6 ranks: [15.0, 21.0, 27.0, 33.0] (correct)" in r.stdout, r.stdout)


def test_mpi_across_hosts():
    if not shutil.which("mpicc"):
        print("  (mpicc not found: not run)")
        return
    prog = os.path.join(BIN, "collectives")
    r = subprocess.run(["mpicc", "-O1", "-o", prog, os.path.join(SRCDIR, "tests", "mpi", "collectives.c")],
                       capture_output=True, text=True)
    check(r.returncode == 0, r.stderr)
    env = marker_env({"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "pe0"})
    r = pe(["-H", hosts("1:2,2:2,3:2,4:2"), prog], env)
    check(r.returncode == 0 and "collectives over 8 ranks: ok" in r.stdout,
          f"exit {r.returncode}: {r.stdout} {r.stderr[-3000:]}")


def run_then(args, env, upd, ranks, action):
    """Starts pytorch_exec ARGS (`ranks` ranks, each writing upd/up.RANK once running), calls
    action() once they all run, and waits for the job: (process, stdout, stderr, seconds from
    the action to its end)."""
    cmd = ["ip", "netns", "exec", BED.front, EXEC, "--launch-agent", "ip netns exec {host}",
           "--kill-grace", "1"] + args
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(os.listdir(upd)) < ranks and time.monotonic() < deadline:
            time.sleep(0.05)
        check(len(os.listdir(upd)) == ranks, "ranks did not start")
        t0 = time.monotonic()
        action()
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            raise TestFailure(f"{' '.join(args)} did not finish: {p.communicate()[1][-3000:]}")
        return p, out, err, time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def run_and_cut(args, env, upd, host):
    """Three ranks; `host` is cut off once they run (and joined again afterwards)."""
    try:
        return run_then(args, env, upd, 3, lambda: BED.cut(host))
    finally:
        BED.uncut(host)


def test_cut_link_ends_the_job_naming_the_host():
    env = marker_env()
    d = tmpdir()
    body = f"#!/bin/sh\necho up > {d}/up.$RANK\nexec sleep 120\n"
    p, out, err, took = run_and_cut(["-H", hosts("1:1,2:1,3:1"), script(body)], env, d, 3)
    check(p.returncode == 1, f"exit {p.returncode}: {err}")
    check(re.search(rf"node {BED.nodes[2]}: lost contact with its daemon", err), err)
    print(f"  partition noticed after {took:.1f} s")
    # The cut-off host notices too: its daemon kills its worker.
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=20)


def test_elastic_job_reforms_after_a_cut_link():
    """--nnodes 2:3: host 4 is cut off while its rank runs; the front end notices (heartbeat),
    stops the others and re-forms the group on hosts 1 and 2, which finishes."""
    env = marker_env()
    d = tmpdir()
    body = (f"#!/bin/sh\nif [ $PYTORCH_EXEC_GENERATION = 0 ]; then echo up > {d}/up.$RANK; "
            "exec sleep 120; fi\necho gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE\n")
    p, out, err, took = run_and_cut(["--nnodes", "2:3", "-H", hosts("1:1,2:1,4:1"), script(body)],
                                    env, d, 4)
    check(p.returncode == 0, f"exit {p.returncode}: {err}")
    check(re.search(rf"node {BED.nodes[3]}: lost contact with its daemon .*re-forming the group on "
                    r"the 2 node\(s\) left", err), err)
    check(sorted(out.splitlines()) == ["gen 1 rank 0 of 2", "gen 1 rank 1 of 2"], out)
    print(f"  cut link: re-formed group done after {took:.1f} s")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=20)


# Elastic arrivals: generation 0 runs until stopped; later ones say where they run.
GROWING = ("#!/bin/sh\nif [ $PYTORCH_EXEC_GENERATION = 0 ]; then echo up > {d}/up.$RANK; "
           "exec sleep 120; fi\necho gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE "
           "$(ip -4 -o addr show pe0 | awk '{{print $4}}')\n")


def write_hosts(path, spec):
    """Replaces the file at once (as an editor or a scheduler would): '1,3:2' -> host lines."""
    with open(path + ".new", "w") as f:
        f.write("".join(f"{BED.nodes[int(x.split(':')[0]) - 1]}:{x.split(':')[1] if ':' in x else 1}\n"
                        for x in spec.split(",")))
    os.rename(path + ".new", path)


def grown_rows(out, where):
    """The rows generation 1 should print on hosts `where` (host number per rank)."""
    return sorted(out.splitlines()), sorted(f"gen 1 rank {r} of {len(where)} {BED.addr(h)}/24"
                                            for r, h in enumerate(where))


def test_elastic_job_grows_when_its_hostfile_lists_a_new_host():
    """--nnodes 2:3 --hostfile with hosts 1 and 2; once they run, host 3 is added to the file:
    its daemon is started, and after the last call the group re-forms on three hosts, host 3's
    rank last."""
    env = marker_env()
    d, hostfile = tmpdir(), os.path.join(tmpdir(), "hosts")
    write_hosts(hostfile, "1,2")
    p, out, err, took = run_then(["-v", "--nnodes", "2:3", "--hostfile", hostfile,
                                  script(GROWING.format(d=d))], env, d, 2,
                                 lambda: write_hosts(hostfile, "1,2,3"))
    check(p.returncode == 0, f"exit {p.returncode}: {err}")
    check(f"node(s) {BED.nodes[2]} joined; re-forming the group on 3 node(s)" in err, err)
    got, want = grown_rows(out, [1, 2, 3])
    check(got == want, f"{got} != {want}")
    print(f"  arrival: larger group done {took:.1f} s after the hostfile changed")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=20)


def test_elastic_job_grows_with_the_discovery_command():
    """--host-discovery prints hosts 1 and 2, then 1, 2, 3 (two slots) and 4, with --nnodes 2:3:
    hosts 3 joins with two ranks, host 4 waits as a spare."""
    env = marker_env()
    d, listed = tmpdir(), os.path.join(tmpdir(), "listed")
    write_hosts(listed, "1,2")
    p, out, err, _ = run_then(["-v", "--nnodes", "2:3", "--host-discovery", f"cat {listed}",
                               script(GROWING.format(d=d))], env, d, 2,
                              lambda: write_hosts(listed, "1,2,3:2,4"))
    check(p.returncode == 0, f"exit {p.returncode}: {err[-3000:]}")
    got, want = grown_rows(out, [1, 2, 3, 3])
    check(got == want, f"{got} != {want}")
    check(re.search(rf"node {BED.nodes[3]} .*waits as a spare", err), err[-3000:])
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=20)



# Elastic training (examples/elastic_ddp.py: DDP that checkpoints every 2 steps and resumes from
# the newest checkpoint) across the hosts, with one fault or arrival once generation 0 has done
# 4 of its 16 steps.  The weights at the end must be those of a run without any change (the
# global batch does not depend on the world size), the generations must have had the expected
# world sizes, and nothing may be left running.
ELASTIC_DDP = os.path.join(SRCDIR, "examples", "elastic_ddp.py")
STEPS = 16
REFERENCE = []


def reference_weights():
    if not REFERENCE:
        r = subprocess.run([EXEC, "-n", "1", TORCH_PYTHON, ELASTIC_DDP, "--ckpt",
                            os.path.join(tmpdir(), "ckpt"), "--steps", str(STEPS)],
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, f"reference run: {r.stderr[-2000:]}")
        REFERENCE.append(float(re.search(r"weights (\S+)", r.stdout).group(1)))
    return REFERENCE[0]


def ns_pids(i):
    """The processes in host i's namespace."""
    r = subprocess.run(["ip", "netns", "pids", BED.nodes[i - 1]], capture_output=True, text=True,
                       timeout=30)
    return [int(x) for x in r.stdout.split()]


def signal_host(i, sig, only=None):
    for pid in ns_pids(i):
        try:
            if only:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() != only:
                        continue
            os.kill(pid, sig)
        except OSError:
            pass


def train_through(args, action, worlds, after=lambda: None):
    """Runs the training with pytorch_exec ARGS; once generation 0 has done 4 steps, action();
    checks the result and that generation g ran on worlds[g] ranks; after() before the check
    for leftovers."""
    need_torch()
    want = reference_weights()
    env = marker_env()
    d = tmpdir()
    log = os.path.join(d, "log")
    cmd = ["ip", "netns", "exec", BED.front, EXEC, "--launch-agent", "ip netns exec {host}",
           "--kill-grace", "1", "-x", "GLOO_SOCKET_IFNAME=pe0"] + args + [
               TORCH_PYTHON, ELASTIC_DDP, "--ckpt", os.path.join(d, "ckpt"), "--steps", str(STEPS),
               "--log", log, "--step-time", "0.25"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def steps():
        if not os.path.exists(log):
            return []
        with open(log) as f:
            return [tuple(int(w) for w in line.split()[1::2]) for line in f if line.count(" ") == 7]
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and p.poll() is None and \
                not any(g == 0 and s >= 4 for g, _, _, s in steps()):
            time.sleep(0.1)
        if p.poll() is not None:
            raise TestFailure(f"the job ended early: {p.communicate()[1][-3000:]}")
        action()
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            raise TestFailure(f"did not finish: {p.communicate()[1][-3000:]}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        after()
    check(p.returncode == 0, f"exit {p.returncode}: {err[-3000:]}")
    done = re.search(r"done: step (\d+) weights (\S+)", out)
    check(done and int(done.group(1)) == STEPS and abs(float(done.group(2)) - want) < 1e-5,
          f"{out!r} (weights without changes: {want})")
    got = {}
    for g, w, _, _ in steps():
        got.setdefault(g, w)
    check([got[g] for g in sorted(got)] == worlds,
          f"world size by generation: {got}, want {worlds}: {err[-3000:]}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=20)


def test_elastic_training_survives_losses_arrivals_and_a_spare():
    one = ["--nnodes", "2:4", "-H", hosts("1:1,2:1,3:1")]
    # A host's daemon and workers killed (SIGKILL): the others go on, 3 ranks then 2.
    train_through(one, lambda: signal_host(3, signal.SIGKILL), [3, 2])
    # Its link cut: the heartbeat finds it silent.
    try:
        train_through(one, lambda: BED.cut(3), [3, 2])
    finally:
        BED.uncut(3)
    # Its daemon frozen (SIGSTOP): silent too; woken afterwards, it stops its worker.
    train_through(one, lambda: signal_host(3, signal.SIGSTOP, "pytorch_execd"), [3, 2],
                  after=lambda: signal_host(3, signal.SIGCONT, "pytorch_execd"))
    # A host added to the hostfile: 2 ranks, then 3.
    hostfile = os.path.join(tmpdir(), "hosts")
    write_hosts(hostfile, "1,2")
    train_through(["--nnodes", "2:4", "--hostfile", hostfile],
                  lambda: write_hosts(hostfile, "1,2,3"), [2, 3])
    # A spare: host 3 lost, host 4 (idle until then) takes its place; the world stays 3.
    train_through(["--nnodes", "2:3", "--spares", "1", "-H", hosts("1:1,2:1,3:1,4:1")],
                  lambda: signal_host(3, signal.SIGKILL), [3, 3])

if __name__ == "__main__":
    why = netns.available()
    if why:
        skip(why)
    with netns.NetnsBed(4) as BED:
        main([test_each_host_has_its_address, test_master_addr_faces_the_other_hosts_when_the_front_end_is_node_0,
              test_torch_gloo_allreduce_across_hosts,
              test_mpi_across_hosts, test_cut_link_ends_the_job_naming_the_host,
              test_elastic_job_reforms_after_a_cut_link,
              test_elastic_job_grows_when_its_hostfile_lists_a_new_host,
              test_elastic_job_grows_with_the_discovery_command,
              test_elastic_training_survives_losses_arrivals_and_a_spare])
