"""The DataChannel's tcp transport on each rank's own NIC (rail alignment).

A network namespace of its own (the machine's is not touched) holds two interfaces (veth),
pe-rail0 and pe-rail1, each with an address on a subnet of its own: the two rails of a GPU
server with one NIC per GPU.  A 4-rank job runs there as two simulated nodes of two, each rank
told what pytorch_exec tells a rank on such a server (PYTORCH_EXEC_GPU, PYTORCH_EXEC_NIC=its
rail); while the ranks hold their group open, `ss` in the namespace shows every connection of the
group's tcp transport between rail addresses, each rank's leaving from its own rail, so that the
cross-node step of local rank j's shard goes over rail j.  PYTORCH_DC_SOCKET_IFNAME chooses the
interface instead; a name that has no address is a one-line error; a rail NIC without an address
(or with a link-local one only) falls back to the interface facing MASTER_ADDR.  Needs root and iproute2 (skips otherwise).
"""
import os
import random
import re
import shutil
import subprocess
import time

from harness import DC_CHECK, EXEC, check, main, marker_env, skip

NS = f"perail{os.getpid() % 100000}"
SUBNET = f"10.215.{random.randrange(0, 120) * 2}"  # rail i: SUBNET + i, .1


def rail_addr(i):
    a, b, c = SUBNET.split(".")
    return f"{a}.{b}.{int(c) + i}.1"


def ip(*args):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0, f"ip {' '.join(args)}: {r.stderr.strip()}")


def link(name):
    """An interface in the bed, up: one end of a veth pair (kernels without the dummy driver
    have veth, which the other namespace tests use too)."""
    ip("-n", NS, "link", "add", name, "type", "veth", "peer", "name", name + "p")
    ip("-n", NS, "link", "set", name, "up")
    ip("-n", NS, "link", "set", name + "p", "up")


def bed_up():
    ip("netns", "add", NS)
    ip("-n", NS, "link", "set", "lo", "up")
    for i in (0, 1):
        link(f"pe-rail{i}")
        ip("-n", NS, "addr", "add", f"{rail_addr(i)}/24", "dev", f"pe-rail{i}")


def job(setting, seconds="0"):
    """pytorch_exec -n 4 in the namespace, two simulated nodes of two, `setting` (shell
    assignments) before dc_check hold."""
    inner = (f"PYTORCH_DC_NODE=n$((RANK / 2)) {setting} exec {DC_CHECK} hold {seconds}")
    return ["ip", "netns", "exec", NS, EXEC, "-n", "4", "sh", "-c", inner]


def connections():
    """(local address, peer address, pid) of the established tcp connections in the bed."""
    r = subprocess.run(["ip", "netns", "exec", NS, "ss", "-tnpH", "state", "established"],
                       capture_output=True, text=True, timeout=30)
    out = []
    for line in r.stdout.splitlines():
        f = line.split()
        pid = re.search(r"pid=(\d+)", line)
        if len(f) >= 4 and pid:
            out.append((f[-3].rsplit(":", 1)[0], f[-2].rsplit(":", 1)[0], int(pid.group(1))))
    return out


def ranks_of_job():
    """pid -> rank of the dc_check processes in the bed (their RANK)."""
    r = subprocess.run(["ip", "netns", "pids", NS], capture_output=True, text=True, timeout=30)
    out = {}
    for pid in r.stdout.split():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "dc_check":
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            out[int(pid)] = int(env[b"RANK"])
        except (OSError, KeyError, ValueError):
            pass
    return out


def held(setting):
    """Runs the job with its group held open for a while; (connections of its ranks, rank of
    pid), looked at while it holds."""
    p = subprocess.Popen(job(setting, "4"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=marker_env())
    try:
        line = p.stdout.readline()
        check(line.startswith("ready 4"), f"{setting}: no ready line ({line!r})")
        ranks = ranks_of_job()
        conns = [c for c in connections() if c[2] in ranks]
        out, err = p.communicate(timeout=60)
        check(p.returncode == 0 and "done" in out, f"{setting}: {p.returncode} {out} {err[-2000:]}")
        check(len(ranks) == 4, f"{setting}: expected 4 ranks in the bed, found {ranks}")
        return conns, ranks
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def rails_of(conns, ranks):
    """rank -> set of its connections' local addresses, among those between rail addresses."""
    rails = {rail_addr(0), rail_addr(1)}
    by_rank = {}
    for local, peer, pid in conns:
        if local in rails and peer in rails:
            by_rank.setdefault(ranks[pid], set()).add(local)
    return by_rank


def test_each_rank_on_its_rail_nic():
    conns, ranks = held("PYTORCH_EXEC_GPU=$((RANK % 2)) PYTORCH_EXEC_NIC=pe-rail$((RANK % 2)),pe-rail$((1 - RANK % 2))")
    by_rank = rails_of(conns, ranks)
    check(sorted(by_rank) == [0, 1, 2, 3], f"ranks with rail connections: {by_rank} (all: {conns})")
    for r, locals_ in by_rank.items():
        check(locals_ == {rail_addr(r % 2)}, f"rank {r} connects from {locals_}, expected its rail "
              f"{rail_addr(r % 2)} only")
    per_rank = {}
    for local, peer, pid in conns:
        if local in (rail_addr(0), rail_addr(1)):
            per_rank[ranks[pid]] = per_rank.get(ranks[pid], 0) + 1
    check(all(per_rank.get(r, 0) >= 3 for r in range(4)), f"a full mesh has 3 connections per rank: {per_rank}")


def test_socket_ifname_chooses_the_interface():
    conns, ranks = held("PYTORCH_DC_SOCKET_IFNAME=nosuch0,pe-rail1")
    by_rank = rails_of(conns, ranks)
    check(sorted(by_rank) == [0, 1, 2, 3] and all(v == {rail_addr(1)} for v in by_rank.values()),
          f"expected every rank on {rail_addr(1)}: {by_rank}")


def test_no_address_is_a_clear_error_or_a_fallback():
    r = subprocess.run(job("PYTORCH_DC_SOCKET_IFNAME=nosuch0"), capture_output=True, text=True,
                       env=marker_env(), timeout=120)
    check(r.returncode != 0 and "PYTORCH_DC_SOCKET_IFNAME=nosuch0: no such network interface" in r.stderr
          and "terminate" not in r.stderr, f"{r.returncode} {r.stderr[-2000:]}")
    # A rail NIC without an IPv4 address (an InfiniBand port without IPoIB), or with only a
    # link-local one, which other hosts do not route to: the usual interface.
    link("pe-bare")
    r = subprocess.run(job("PYTORCH_EXEC_GPU=0 PYTORCH_EXEC_NIC=pe-bare,nosuch1"), capture_output=True,
                       text=True, env=marker_env(), timeout=120)
    check(r.returncode == 0 and "done" in r.stdout, f"{r.returncode} {r.stdout} {r.stderr[-2000:]}")
    ip("-n", NS, "addr", "add", "169.254.77.1/16", "dev", "pe-bare")
    conns, _ = held("PYTORCH_EXEC_GPU=0 PYTORCH_EXEC_NIC=pe-bare")
    check(conns and not any(local == "169.254.77.1" for local, _, _ in conns),
          f"a link-local address was used: {conns}")


if __name__ == "__main__":
    if not os.path.exists(DC_CHECK):
        skip(f"{DC_CHECK} is not built")
    if os.geteuid() != 0:
        skip("network namespaces and dummy interfaces need root")
    if not shutil.which("ip") or not shutil.which("ss"):
        skip("iproute2 (ip, ss) is not installed")
    probe = subprocess.run(["ip", "netns", "add", NS], capture_output=True, text=True)
    if probe.returncode != 0:
        skip(f"cannot create a network namespace: {probe.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    try:
        bed_up()
        main([test_each_rank_on_its_rail_nic, test_socket_ifname_chooses_the_interface,
              test_no_address_is_a_clear_error_or_a_fallback])
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)
