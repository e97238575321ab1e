"""A network-namespace test bed: separate hosts on one machine.

Namespace <prefix>h0 is the front end's host; <prefix>h1 ... <prefix>hN are the nodes.  Every node
has one interface named pe0 on a private subnet, joined by a bridge that lives inside h0 (the
machine's own namespace is not touched), and its own loopback.  `ip netns exec NAME` is the
launch agent.  Needs root and iproute2.

    python3 netns.py up [N]     creates a bed, prints its prefix
    python3 netns.py down PREFIX
"""
import os
import random
import shutil
import subprocess
import sys


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def available():
    """None when a bed can be built here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "iproute2 (ip) is not installed"
    probe = f"pe{os.getpid()}probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class NetnsBed:
    def __init__(self, nodes=4):
        self.prefix = f"pe{os.getpid() % 100000}x{random.randrange(100)}"
        self.subnet = f"10.213.{random.randrange(1, 250)}"
        self.nodes = [f"{self.prefix}h{i}" for i in range(1, nodes + 1)]
        self.front = f"{self.prefix}h0"

    def addr(self, i):
        """Address of node i (1-based); the front end is .254."""
        return f"{self.subnet}.{i}"

    def up(self):
        try:
            for ns in [self.front] + self.nodes:
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.front, "link", "add", "pebr", "type", "bridge")
            _ip("-n", self.front, "addr", "add", f"{self.subnet}.254/24", "dev", "pebr")
            _ip("-n", self.front, "link", "set", "pebr", "up")
            for i, ns in enumerate(self.nodes, 1):
                a, b = f"{self.prefix}a{i}", f"{self.prefix}b{i}"
                _ip("link", "add", a[-15:], "type", "veth", "peer", "name", b[-15:])
                _ip("link", "set", a[-15:], "netns", self.front)
                _ip("link", "set", b[-15:], "netns", ns)
                _ip("-n", self.front, "link", "set", a[-15:], "master", "pebr", "up")
                _ip("-n", ns, "link", "set", b[-15:], "name", "pe0")
                _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "pe0")
                _ip("-n", ns, "link", "set", "pe0", "up")
        except Exception:
            self.down()
            raise
        return self

    def cut(self, i):
        """Takes node i's link down: a partition."""
        _ip("-n", self.nodes[i - 1], "link", "set", "pe0", "down")

    def uncut(self, i):
        """Brings node i's link up again."""
        _ip("-n", self.nodes[i - 1], "link", "set", "pe0", "up")

    def down(self):
        for ns in self.nodes + [self.front]:
            _ip("netns", "del", ns, check=False)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "up":
        bed = NetnsBed(int(sys.argv[2]) if len(sys.argv) > 2 else 4).up()
        print(bed.prefix)
    elif len(sys.argv) == 3 and sys.argv[1] == "down":
        for line in _ip("netns", "list").stdout.splitlines():
            name = line.split()[0]
            if name.startswith(sys.argv[2]):
                _ip("netns", "del", name, check=False)
    else:
        print(__doc__)
        sys.exit(2)
