"""Hostile peers: a stranger on the same network against a running job.

The DataChannel's store (rank 0, MASTER_PORT+1) and tcp transport during set-up, and the
launcher's control port, get garbage, oversized and wrapped lengths, slow partial frames, idle
connections, forged hellos and replays.  Each time the job still finishes with the right result,
nothing crashes, and the target's memory and descriptors stay bounded (read from /proc).  The
figures (connections, bytes, peak RSS and descriptors) are printed.
"""
import hashlib
import hmac
import os
import resource
import socket
import struct
import subprocess
import time

from harness import (DC_CHECK, EXEC, check, comm, control_port, control_protocol, finish, free_port, main, marker_env, processes_with_marker, run, script, skip,
                     start, tmpdir, wait_until)

FIGURES = {"connections": 0, "bytes": 0, "peak_rss_kb": 0, "peak_fds": 0}
# The ranks' token (PYTORCH_DC_TOKEN): the attacks below know it, as an insider without one would
# know the empty one; it keeps jobs of concurrent test runs apart.
TOKEN = os.urandom(8).hex()



def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def observe(pid):
    """Records the target's resident memory and descriptors; returns them."""
    rss, n = status_kb(pid, "VmRSS"), fds(pid)
    FIGURES["peak_rss_kb"] = max(FIGURES["peak_rss_kb"], rss)
    FIGURES["peak_fds"] = max(FIGURES["peak_fds"], n)
    return rss, n


def connect(port, timeout=5, target=None):
    """Connects, retrying while `target` (a process) runs but does not listen yet."""
    deadline = time.monotonic() + 20
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
            FIGURES["connections"] += 1
            return s
        except OSError:
            if target and target.poll() is not None:
                raise AssertionError(f"the target exited ({target.returncode}): {target.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def send(s, data):
    FIGURES["bytes"] += len(data)
    s.sendall(data)


def proof(key, *parts):
    msg = b"".join(struct.pack("<I", len(p)) + p for p in parts)
    return hmac.new(key, msg, hashlib.sha256).digest()


def recv_exact(s, n):
    out = b""
    while len(out) < n:
        b = s.recv(n - len(out))
        if not b:
            break
        out += b
    return out


def store_client(port, token=TOKEN.encode(), target=None):
    """A store connection that proves `token` (the protocol of src/dc/store.cpp)."""
    s = connect(port, target=target)
    nonce_s = recv_exact(s, 32)
    nonce_c = os.urandom(32)
    send(s, nonce_c + proof(token, b"pdc-store-client", nonce_s, nonce_c, b""))
    answer = recv_exact(s, 32)
    if answer and answer != proof(token, b"pdc-store-server", nonce_s, nonce_c, b""):
        raise AssertionError("the store's proof is wrong")
    return s, answer


def hang_up(conns, p):
    """Closes the attack's connections and stops the target if it still runs."""
    for c in conns:
        c.close()
    if p.poll() is None:
        p.kill()
        p.wait()


def closed_soon(s, timeout=5):
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def dc_rank(rank, size, port, extra=None):
    e = marker_env()
    for k in list(e):
        if k.startswith("PMIX_") or k == "PYTORCH_DC_TOKEN":
            del e[k]
    e["PYTORCH_DC_TOKEN"] = TOKEN
    e.update(extra or {})
    e.update(RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
             PYTORCH_DC_BOOTSTRAP="env", PYTORCH_DC_TRANSPORT="tcp", PYTORCH_DC_TIMEOUT="30")
    return subprocess.Popen([DC_CHECK, "info"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish_ranks(procs, size):
    for r, (rc, out, err) in enumerate(finish(procs)):
        check(rc == 0 and f"rank {r} size {size}" in out, f"rank {r}: exit {rc}: {out}{err[-2000:]}")


def test_store_wrapped_length_does_not_kill_rank0():
    # Issue 13, item 1: 'S', key length 0, value length 0xFFFFFFFD wrapped a 32-bit sum.
    port = free_port(2)  # the store listens on port + 1
    r0 = dc_rank(0, 2, port)
    s, _ = store_client(port + 1, target=r0)
    send(s, b"S" + struct.pack("<II", 0, 0xFFFFFFFD))
    check(closed_soon(s), "the store kept a connection with a wrapped length")
    raw = connect(port + 1)  # the same without proving anything
    send(raw, b"S" + struct.pack("<II", 0, 0xFFFFFFFD) + b"\0" * 64)
    check(closed_soon(raw), "the store kept an unproven connection")
    time.sleep(0.2)
    check(r0.poll() is None, f"rank 0 died: {r0.returncode}")
    observe(r0.pid)
    finish_ranks([r0, dc_rank(1, 2, port)], 2)


def test_store_lengths_and_memory_are_bounded():
    # Item 3: a 4 GiB key and 64 MiB of data; slow partial frames; many idle connections.
    port = free_port(2)  # the store listens on port + 1
    r0 = dc_rank(0, 2, port)
    s, _ = store_client(port + 1, target=r0)
    rss0, fds0 = observe(r0.pid)
    send(s, b"S" + struct.pack("<I", 0xFFFFFFF0))
    try:
        for _ in range(64):
            send(s, b"x" * (1 << 20))
    except OSError:
        pass
    idle = [connect(port + 1) for _ in range(200)]
    slow, _ = store_client(port + 1, target=r0)
    for b in b"G\x05\x00\x00":
        send(slow, bytes([b]))
        time.sleep(0.05)
    rss1, fds1 = observe(r0.pid)
    check(rss1 - rss0 < 32 << 10, f"rank 0 grew from {rss0} kB to {rss1} kB")
    check(fds1 - fds0 < 100, f"rank 0 holds {fds1 - fds0} more descriptors for 200 idle connections")
    for c in idle:
        c.close()
    finish_ranks([r0, dc_rank(1, 2, port)], 2)


def test_bootstrap_rejects_a_record_without_colon():
    # Item 3: an injected g0/who/all = "x" made rank 1 allocate until bad_alloc.
    # Three ranks, rank 2 never starts: rank 0 waits for it and does not overwrite the record.
    port = free_port(2)  # the store listens on port + 1
    r0 = dc_rank(0, 3, port)
    s, _ = store_client(port + 1, target=r0)
    key = b"g0/who/all"
    send(s, b"S" + struct.pack("<I", len(key)) + key + struct.pack("<I", 1) + b"x")
    time.sleep(0.2)
    r1 = dc_rank(1, 3, port)
    try:
        out, err = r1.communicate(timeout=30)
    finally:
        r0.kill()
        r0.wait()
    check(r1.returncode == 1 and "the record under 'g0/who/all' is malformed" in err,
          f"rank 1: {r1.returncode} {err[-2000:]}")


def test_token_keeps_strangers_out():
    # Item 2: with PYTORCH_DC_TOKEN a stranger can neither read nor write the store, nor join.
    port = free_port(2)  # the store listens on port + 1
    tok = {"PYTORCH_DC_TOKEN": "s3cret"}
    r0 = dc_rank(0, 2, port, tok)
    s, answer = store_client(port + 1, b"guess")
    check(answer == b"", f"a wrong token got an answer: {answer!r}")
    s, answer = store_client(port + 1, b"", target=r0)
    check(answer == b"", "no token got an answer")
    s, answer = store_client(port + 1, b"s3cret")
    check(len(answer) == 32, "the right token was refused")
    bad = dc_rank(1, 2, port, {"PYTORCH_DC_TOKEN": "other"})
    out, err = bad.communicate(timeout=40)
    check(bad.returncode == 1 and "PYTORCH_DC_TOKEN" in err, f"a rank with another token: {err[-2000:]}")
    finish_ranks([r0, dc_rank(1, 2, port, tok)], 2)
    # Under pytorch_exec every generation's ranks share a fresh token, in the environment.
    r = run(["-n", "2", "sh", "-c", "echo $PYTORCH_DC_TOKEN"], env=marker_env(), timeout=60)
    toks = r.stdout.split()
    check(r.returncode == 0 and len(toks) == 2 and toks[0] == toks[1] and len(toks[0]) == 32,
          f"tokens: {r.stdout!r} {r.stderr[-1000:]}")


def rank0_transport_port(store_port, r0):
    """Reads rank 0's tcp address from the store, as a stranger would without a token."""
    s, _ = store_client(store_port, target=r0)
    key = b"g0/who/0"
    send(s, b"G" + struct.pack("<I", len(key)) + key)
    n = struct.unpack("<I", recv_exact(s, 4))[0]
    return int(recv_exact(s, n).decode().split("\n")[1].rsplit(":", 1)[1])


def test_idle_and_forged_hellos_do_not_stall_set_up():
    # Item 4: six idle connections to rank 0's transport made rank 1 time out; also forged and
    # replayed hellos.
    port = free_port(2)  # the store listens on port + 1
    r0 = dc_rank(0, 3, port)
    tport = rank0_transport_port(port + 1, r0)
    idle = [connect(tport) for _ in range(50)]  # waiting in the backlog until set-up
    forged = connect(tport, timeout=30)
    t0 = time.monotonic()
    others = [dc_rank(1, 3, port), dc_rank(2, 3, port)]
    check(len(recv_exact(forged, 32)) == 32, "no challenge")
    send(forged, struct.pack("<II", 0x32636470, 1) + os.urandom(64))
    check(closed_soon(forged), "a forged hello was kept")
    finish_ranks([r0] + others, 3)
    check(time.monotonic() - t0 < 15, f"set-up took {time.monotonic() - t0:.1f} s")
    for c in idle:
        c.close()


def few_descriptors():
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


class TwoNodeJob:
    """pytorch_exec -v -H a:1,b:1 (daemons on this machine) running a script that waits for a
    file; `attack(port, wait_for_workers)` runs against its control port, then the job ends."""

    def __init__(self, flags=("-v",), **kw):
        self.env = marker_env()
        self.d = tmpdir()
        d = self.d
        body = (f"#!/bin/sh\ntouch {d}/up-$RANK\nwhile [ ! -e {d}/go ]; do sleep 0.05; done\n"
                "echo done-$RANK\n")
        agent = f"env -i PATH=/usr/bin:/bin PE_TEST_MARKER={self.env['PE_TEST_MARKER']} PE_NODE={{host}}"
        self.p = start([*flags, "-H", "a:1,b:1", "--launch-agent", agent, script(body)], env=self.env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)

    def workers_up(self):
        return wait_until(lambda: all(os.path.exists(f"{self.d}/up-{r}") for r in (0, 1)), 30)

    def run(self, attack, port=None):
        """`port`: finds the control port (default: from -v's line)."""
        p = self.p
        try:
            attack(port(p) if port else control_port(p)[0])
            open(f"{self.d}/go", "w").close()
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        check(p.returncode == 0 and sorted(out.split()) == ["done-0", "done-1"],
              f"exit {p.returncode}: {out} {err[-2000:]}")
        return err


def few_descriptors():
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


def test_control_plane_backs_off_when_out_of_descriptors():
    # Item 5: accept4 failing with EMFILE made the level-triggered listener spin at 100% CPU.
    job = TwoNodeJob(preexec_fn=few_descriptors)

    def attack(port):
        check(job.workers_up(), "no workers")
        conns = [connect(port) for _ in range(80)]
        time.sleep(0.5)
        c0 = cpu_seconds(job.p.pid)
        time.sleep(2)
        used = cpu_seconds(job.p.pid) - c0
        observe(job.p.pid)
        check(used < 0.5, f"the front end used {used:.2f} s of CPU in 2 s while out of descriptors")
        for c in conns:
            c.close()

    job.run(attack)


CONTROL_PROTOCOL = control_protocol()


def test_node_names_are_escaped_and_warnings_limited():
    # Item 7: a hello's node name reached the terminal raw, one warning per dropped connection.
    name = b"evil\x1b[2J\nforged line"

    def attack(port):
        for _ in range(50):
            s = connect(port)
            s.recv(4096)
            payload = struct.pack("<I", CONTROL_PROTOCOL) + struct.pack("<I", len(name)) + name \
                + struct.pack("<I", 32) + os.urandom(32) \
                + struct.pack("<I", 32) + os.urandom(32) + struct.pack("<ii", -1, -1)
            send(s, b"PEX1" + struct.pack("<HHI", 2, 0, len(payload)) + payload)
            closed_soon(s)
            s.close()

    err = TwoNodeJob().run(attack)
    check("\x1b" not in err and "\nforged line" not in err, f"raw node name on stderr: {err[-1000:]!r}")
    check("evil\\x1b[2J\\x0aforged line" in err, f"no escaped name: {err[-1000:]!r}")
    n = err.count("authentication failed")
    check(n <= 10 and "suppressing the rest" in err, f"{n} warnings for 50 drops")


def listening_ports(pid):
    """The TCP ports process `pid` listens on (its sockets in /proc/net/tcp and tcp6)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.readlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def test_quiet_leaves_out_warnings():
    """mpirun's -q: the control plane's warnings about connections that are not a node's (here
    4 bytes of garbage on every port the front end listens on) are not printed; without -q the
    same job prints them.  The job runs as before."""
    def garbage(ports):
        for port in ports:
            s = connect(port)
            try:
                send(s, b"\x01\x02\x03\x04" * 8)
                closed_soon(s)
            except OSError:
                pass
            s.close()

    errs = {}
    for flags in (["-q"], []):
        job = TwoNodeJob(flags=flags)

        def ports(p):
            check(job.workers_up(), "the workers did not start")
            found = listening_ports(p.pid)
            check(found, "pytorch_exec listens on no port")
            return found

        errs[bool(flags)] = job.run(garbage, port=ports)
    check("control plane" in errs[False], f"no warning without -q: {errs[False][-1000:]!r}")
    check("control plane" not in errs[True] and "warn" not in errs[True],
          f"warnings with -q: {errs[True][-1000:]!r}")


def test_store_handshake_replay_is_refused():
    # Item 2: a proof recorded from one connection does not open another (fresh nonce).
    port = free_port(2)  # the store listens on port + 1
    r0 = dc_rank(0, 2, port)
    s = connect(port + 1, target=r0)
    nonce_s = recv_exact(s, 32)
    nonce_c = os.urandom(32)
    recorded = nonce_c + proof(TOKEN.encode(), b"pdc-store-client", nonce_s, nonce_c, b"")
    send(s, recorded)
    check(len(recv_exact(s, 32)) == 32, "the legitimate proof was refused")
    r = connect(port + 1, target=r0)
    recv_exact(r, 32)
    send(r, recorded)
    check(closed_soon(r) and r.recv(1) == b"", "a replayed proof was accepted")
    finish_ranks([r0, dc_rank(1, 2, port)], 2)


def test_control_port_during_collectives():
    # Hundreds of idle connections, garbage and slow partial frames against the launcher's
    # control port while a DataChannel job runs its conformance checks across two nodes.
    env = marker_env()
    agent = f"env -i PATH=/usr/bin:/bin PE_TEST_MARKER={env['PE_TEST_MARKER']} PE_NODE={{host}}"
    p = start(["-v", "-H", "a:2,b:2", "--launch-agent", agent, DC_CHECK, "conformance", "7"], env=env,
              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    conns, peak = [], 0
    try:
        port, _ = control_port(p)
        for i in range(300):
            try:
                c = connect(port)
            except OSError:
                continue
            conns.append(c)
            if i % 10 == 0:
                send(c, os.urandom(100))
            elif i % 10 == 1:
                send(c, b"PEX1"[: i % 4 + 1])  # a partial frame header, never finished
            if p.poll() is None:
                peak = max(peak, observe(p.pid)[1])
        out, err = p.communicate(timeout=240)
    finally:
        hang_up(conns, p)
    check(p.returncode == 0 and out.startswith("ok"), f"exit {p.returncode}: {out} {err[-2000:]}")
    check(peak < 150, f"the front end held {peak} descriptors for 300 connections")


def daemons(marker):
    """The daemons of the job: not a daemon's own child just forked (its orphan guard or a
    worker before it renames itself or execs, which is "pytorch_execd" for a moment)."""
    out = []
    for pid in processes_with_marker(marker):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if comm(pid) == "pytorch_execd" and comm(ppid) != "pytorch_execd":
            out.append(pid)
    return out


def unread_output_job(args, body, seconds):
    """Runs pytorch_exec ARGS on launch-agent nodes with the script BODY, its stdout not read for
    SECONDS, then read to the end.  Returns (process, stdout, stderr, {daemon pid: peak RSS kB})."""
    env = marker_env()
    marker = env["PE_TEST_MARKER"]
    agent = f"env -i PATH=/usr/bin:/bin PE_TEST_MARKER={marker} PE_NODE={{host}}"
    p = start(args + ["--launch-agent", agent, script(body)], env=env, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE)
    peak = {}
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for pid in daemons(marker):
                try:
                    peak[pid] = max(peak.get(pid, 0), status_kb(pid, "VmRSS"))
                except OSError:
                    pass
            time.sleep(0.1)
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    FIGURES["peak_rss_kb"] = max([FIGURES["peak_rss_kb"]] + list(peak.values()))
    return p, out, err, peak


def test_daemon_output_is_bounded_while_the_front_end_is_not_read():
    # Item 6: a rank writing 200 MB while pytorch_exec's stdout was not read grew its daemon to
    # 214 MB.  Now the daemon stops reading the rank's pipe while its queue is full.
    body = "#!/bin/sh\n[ $RANK = 1 ] && yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c 100000000\nexit 0\n"
    p, out, err, peaks = unread_output_job(["-H", "a:1,b:1"], body, 8)
    peak = max(peaks.values(), default=0)
    check(p.returncode == 0 and len(out) in (100000000, 100000001), f"exit {p.returncode}, {len(out)} bytes: {err[-1000:]}")
    print(f"daemon peak RSS {peak} kB", flush=True)
    check(peak < 64 << 10, f"a daemon grew to {peak} kB while its output was not read")


def test_relay_output_is_bounded_while_the_front_end_is_not_read():
    # Issue 13: with --tree-radix 1, the output of a rank on node c reaches the front end through
    # the daemons of a and b, which kept reading their child's connection and queued its output
    # without limit (node a's daemon grew to 125 MB).  Now a relay stops reading its children
    # while its own queue is full, and the pause reaches the rank's pipe.
    count = 14000000  # 106 MB of numbered lines: in order and intact, or the hash differs
    want = hashlib.sha256(subprocess.run(["seq", "1", str(count)], stdout=subprocess.PIPE, check=True).stdout)
    body = f"#!/bin/sh\n[ $RANK = 2 ] && seq 1 {count}\nexit 0\n"
    p, out, err, peaks = unread_output_job(["--tree-radix", "1", "-H", "a:1,b:1,c:1"], body, 10)
    top = max(peaks.values(), default=0)
    print(f"daemons' peak RSS (kB): {sorted(peaks.values())}", flush=True)
    check(len(peaks) == 3, f"saw {len(peaks)} daemons")
    check(p.returncode == 0, f"exit {p.returncode}: {err[-1000:]}")
    check(hashlib.sha256(out).digest() == want.digest(), f"{len(out)} bytes of output, not the {count} lines in order")
    check(top < 64 << 10, f"a daemon grew to {top} kB while the output of its subtree was not read")


# A rank of a torch job that talks torch's store protocol itself (no torch needed): once the
# file argv[1] exists, every rank adds 1 to a counter and waits until all have.
TORCH_STORE_RANK = script("""#!/usr/bin/env python3
import os, socket, struct, sys, time
port, rank, world = int(os.environ["MASTER_PORT"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if rank == 0:
    print(f"port {port}", flush=True)
deadline = time.time() + 120
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.05)
s = socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=30)
def key(k): return struct.pack("=Q", len(k)) + k
def read(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b)); assert c, "closed"; b += c
    return b
s.sendall(b"\\x00" + struct.pack("=I", 0x3C85F7CE) + b"\\x04" + key(b"/n") + struct.pack("=q", 1))
read(8)
while time.time() < deadline:
    s.sendall(b"\\x03" + key(b"/n"))
    if read(struct.unpack("=Q", read(8))[0]) == str(world).encode():
        print(f"rank {rank} store ok", flush=True)
        break
    time.sleep(0.05)
""", ".py")


def test_torch_store_on_master_port():
    # The torch store pytorch_exec hosts on MASTER_PORT gets hundreds of connections: idle ones,
    # garbage, no VALIDATE, huge and wrapped lengths, too many keys, slow partial requests.  The
    # front end's memory and descriptors stay bounded and the ranks then use the store.
    go = os.path.join(tmpdir(), "go")
    p = start(["-n", "2", TORCH_STORE_RANK, go], env=marker_env(), stdout=subprocess.PIPE,
              stderr=subprocess.PIPE, text=True)
    conns, peak_fds, peak_rss = [], 0, 0
    magic = b"\x00" + struct.pack("=I", 0x3C85F7CE)
    attacks = [lambda i: os.urandom(100), lambda i: b"\x01" + struct.pack("=Q", 2),
               lambda i: magic + b"\x01" + struct.pack("=Q", 1 << 63),
               lambda i: magic + b"\x01" + struct.pack("=Q", 3) + b"/k" + struct.pack("=Q", -1 & (2**64 - 1)),
               lambda i: magic + b"\x06" + struct.pack("=Q", 1 << 40),
               lambda i: magic + b"\x01" + struct.pack("=Q", 4) + b"/sl",  # never finished
               lambda i: b"", lambda i: magic + b"\xee"]
    try:
        line = p.stdout.readline()
        check(line.startswith("port "), f"first line {line!r}: {p.stderr.read()[-2000:] if p.poll() is not None else ''}")
        port = int(line.split()[1])
        for i in range(300):
            try:
                c = connect(port, target=p)
            except OSError:
                continue
            conns.append(c)
            data = attacks[i % len(attacks)](i)
            if data:
                try:
                    send(c, data)
                except OSError:
                    pass
            if p.poll() is None:
                rss, n = observe(p.pid)
                peak_fds, peak_rss = max(peak_fds, n), max(peak_rss, rss)
        with open(go, "w"):
            pass
        out, err = p.communicate(timeout=120)
    finally:
        hang_up(conns, p)
    check(p.returncode == 0, f"exit {p.returncode}: {out} {err[-2000:]}")
    for r in range(2):
        check(f"rank {r} store ok" in out, out)
    print(f"torch store: front end peak {peak_fds} descriptors, {peak_rss} kB", flush=True)
    check(peak_fds < 400, f"the front end held {peak_fds} descriptors for 300 connections")
    check(peak_rss < 256 << 10, f"the front end grew to {peak_rss} kB")
    warnings = err.count("torch store on port")
    check(0 < warnings <= 12, f"{warnings} warnings about dropped clients: {err[-2000:]}")


def frame(kind, payload):
    return b"PEX1" + struct.pack("<HHI", kind, 0, len(payload)) + payload


def read_frame(s):
    kind, _, n = struct.unpack("<HHI", recv_exact(s, 12)[4:])
    return kind, recv_exact(s, n)


def test_other_control_protocols_are_named():
    """A node and a front end of builds whose control messages differ: each says which protocol
    the other speaks, in one line, rather than failing to decode.  Both sides against a peer
    made here: a front end that speaks another protocol, and a node (another protocol, then one
    from before the version field) that knocks on a real join-mode host."""
    other = (CONTROL_PROTOCOL & 0xffff) + 7
    # A join-mode node whose rendezvous host speaks another protocol.
    port = free_port()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(4)
    env = dict(os.environ, PYTORCH_EXEC_RDZV_SECRET="protocols")
    node = subprocess.Popen([EXEC, "--rdzv-endpoint", f"127.0.0.1:{port}", "--nnodes", "2",
                             "--nproc-per-node", "1", "--join-timeout", "30", "true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    srv.settimeout(20)
    conn, _ = srv.accept()
    send(conn, frame(1, struct.pack("<II", 0x50430000 | other, 32) + os.urandom(32)))
    (rc, out, err), = finish([node], 30)
    # Before it gave up, the node said its own version (a hello of that field alone), so that a
    # real host names it too.
    conn.settimeout(5)
    kind, payload = read_frame(conn)
    check(kind == 2 and payload == struct.pack("<I", CONTROL_PROTOCOL), f"hello {kind} {payload!r}")
    conn.close()
    srv.close()
    check(rc != 0 and len(err.splitlines()) == 1 and
          f"the front end at 127.0.0.1 speaks control protocol {other} and this pytorch_exec "
          f"control protocol {CONTROL_PROTOCOL & 0xffff}" in err and
          "use the same pytorch_exec version on every node" in err, f"exit {rc}: {err!r}")
    # A real host, and nodes that speak another protocol or none.
    port = free_port()
    host = subprocess.Popen([EXEC, "--rdzv-endpoint", f"127.0.0.1:{port}", "--nnodes", "2",
                             "--nproc-per-node", "1", "--join-timeout", "30", "true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for hello, theirs in [(struct.pack("<II", 0x50430000 | other, 1) + b"n", f"control protocol {other}"),
                              (struct.pack("<I", 1) + b"n" + struct.pack("<I", 32) + os.urandom(32),
                               "an older control protocol, without a version (control protocol 1)")]:
            s = None
            deadline = time.monotonic() + 20
            while s is None:
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=5)
                except OSError:
                    check(time.monotonic() < deadline, "the host does not listen")
                    time.sleep(0.1)
            kind, payload = read_frame(s)
            check(kind == 1 and struct.unpack("<I", payload[:4])[0] == CONTROL_PROTOCOL,
                  f"challenge {kind} {payload[:4]!r}")
            send(s, frame(2, hello))
            kind, payload = read_frame(s)
            why = payload[4:4 + struct.unpack("<I", payload[:4])[0]].decode()
            check(kind == 70 and f"the node speaks {theirs} and this host speaks control protocol" in why
                  and "use the same pytorch_exec version on every node" in why, f"{kind} {why!r}")
            s.close()
    finally:
        host.terminate()
        (rc, out, err), = finish([host], 30)
    check(f"speaks control protocol {other}" in err, err[-2000:])


def test_figures():
    print(f"hostile suite: {FIGURES['connections']} connections, {FIGURES['bytes']} bytes sent, "
          f"peak RSS {FIGURES['peak_rss_kb']} kB, peak descriptors {FIGURES['peak_fds']}", flush=True)


if __name__ == "__main__":
    if not os.path.exists(DC_CHECK):
        skip(f"{DC_CHECK} is not built")
    main([test_store_wrapped_length_does_not_kill_rank0, test_store_lengths_and_memory_are_bounded,
          test_bootstrap_rejects_a_record_without_colon, test_token_keeps_strangers_out,
          test_idle_and_forged_hellos_do_not_stall_set_up, test_store_handshake_replay_is_refused,
          test_control_port_during_collectives, test_control_plane_backs_off_when_out_of_descriptors,
          test_node_names_are_escaped_and_warnings_limited,
          test_quiet_leaves_out_warnings,
          test_daemon_output_is_bounded_while_the_front_end_is_not_read,
          test_relay_output_is_bounded_while_the_front_end_is_not_read,
          test_torch_store_on_master_port, test_other_control_protocols_are_named, test_figures])
