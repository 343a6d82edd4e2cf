"""Run a command inside a network namespace whose loopback is shaped to a fixed rate (``tc tbf``).

Every byte between the job's servers and workers crosses that namespace's loopback, so the whole
cluster shares one link of the given rate in each direction taken together, as machines behind one
switch port would. This is how ``python -m bench.convergence --link-mbit N`` makes the network the limit on
one machine. Needs root (CAP_NET_ADMIN) and iproute2; the namespace is deleted afterwards, and every
process left in it is killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def _ip(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=20)


def run_inside(cmd: Sequence[str], mbit: float, *, cwd: str | Path | None = None,
               env: Mapping[str, str] | None = None) -> int:
    """Run ``cmd`` in a fresh namespace with its loopback shaped to ``mbit``; its exit status.
    ``cwd`` and ``env`` (applied on top of this process's environment) are the command's."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        raise SystemExit("--link-mbit needs root and iproute2 (ip, tc) to make a network namespace")
    ns = f"bosenlink{os.getpid()}"
    _ip("ip", "netns", "add", ns)
    try:
        # Ethernet-sized packets (loopback's default MTU is 64 KiB, larger than any sane bucket)
        _ip("ip", "-n", ns, "link", "set", "lo", "mtu", "1500", "up")
        # burst: about 20 packets; latency bounds the queue (what a switch port buffers)
        _ip("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", f"{mbit}mbit",
            "burst", "32kb", "latency", "200ms")
        return subprocess.run(["ip", "netns", "exec", ns, *cmd], cwd=cwd,
                              env={**os.environ, **(env or {})}).returncode
    finally:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
