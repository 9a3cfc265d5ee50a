"""Hosts of a test's own on this machine: one network namespace per node, each with one
address on a private subnet, joined by veth pairs to a bridge in the root namespace (where
the test and the platform's processes run). `cut(i)` takes node i's link to the bridge
down, so it reaches neither the other nodes nor any client, and sees no reset either:
a network partition, not a crash. Needs root and iproute2; a failure to build it fails
the test.

Names begin with `lgc<pid>`, the pid of the test process, so a run can tell the leftovers
of a killed earlier run (its pid gone) from those of one still running.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess

FAMILY = "lgc"
SUBNET = "10.213.0"  # /24, ours alone: the bridge is .1, node i is .(10 + i)
_OWNED = re.compile(rf"^{FAMILY}(\d+)-")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise AssertionError(f"`ip {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]


def _links() -> list[str]:
    # "7: lgc123-br: <...>" or "8: lgc123-h1@if9: <...>"
    return [line.split(":")[1].strip().split("@")[0] for line in ip("-o", "link", "show").stdout.splitlines()]


def remove_leftovers() -> None:
    """Deletes the namespaces, links and broker processes of earlier runs that were killed
    before they could clean up; fails if a run that is still alive holds the subnet."""
    for name in _namespaces() + _links():
        owned = _OWNED.match(name)
        if not owned:
            continue
        pid = int(owned.group(1))
        if pid == os.getpid():
            continue
        if _alive(pid):
            raise AssertionError(f"{name} belongs to a live run (pid {pid}), which holds {SUBNET}.0/24")
        if name in _namespaces():
            for stray in ip("netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(stray), signal.SIGKILL)  # a broker of that run, left in its namespace
                except ProcessLookupError:
                    pass
            ip("netns", "delete", name, check=False)
        else:
            ip("link", "delete", name, check=False)


class BrokerNetwork:
    def __init__(self, nodes: int):
        self.prefix = f"{FAMILY}{os.getpid()}"
        self.nodes = list(range(1, nodes + 1))
        self.bridge = f"{self.prefix}-br"

    def namespace(self, node: int) -> str:
        return f"{self.prefix}-{node}"

    def address(self, node: int) -> str:
        return f"{SUBNET}.{10 + node}"

    def _host_side(self, node: int) -> str:
        return f"{self.prefix}-h{node}"

    def up(self) -> "BrokerNetwork":
        remove_leftovers()
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{SUBNET}.1/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for node in self.nodes:
                ns, host, inside = self.namespace(node), self._host_side(node), f"{self.prefix}-n{node}"
                ip("netns", "add", ns)
                ip("link", "add", host, "type", "veth", "peer", "name", inside)
                ip("link", "set", inside, "netns", ns)
                ip("link", "set", host, "master", self.bridge)
                ip("link", "set", host, "up")
                ip("-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", inside)
                ip("-n", ns, "link", "set", inside, "up")
                ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.down()
            raise
        return self

    def run_in(self, node: int) -> list[str]:
        """The prefix that runs a command inside node's namespace."""
        return ["ip", "netns", "exec", self.namespace(node)]

    def cut(self, node: int) -> None:
        ip("link", "set", self._host_side(node), "down")

    def reconnect(self, node: int) -> None:
        ip("link", "set", self._host_side(node), "up")

    def down(self) -> None:
        """Deletes every namespace (its veth pair goes with it) and the bridge; what is
        already gone is skipped, so this is safe after a half-built `up`."""
        namespaces = set(_namespaces())
        for node in self.nodes:
            if self.namespace(node) in namespaces:
                ip("netns", "delete", self.namespace(node), check=False)
        links = set(_links())
        for name in [self._host_side(n) for n in self.nodes] + [self.bridge]:
            if name in links:
                ip("link", "delete", name, check=False)
        left = [n for n in _namespaces() + _links() if n.startswith(self.prefix + "-")]
        assert not left, f"left behind after teardown: {left}"
