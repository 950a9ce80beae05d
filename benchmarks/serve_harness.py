"""Shared by benchmarks/soak.py and benchmarks/stream.py: fresh keys and trust stores, a
``cbcl serve`` subprocess (its log in a file, so a chatty server never blocks on a pipe),
and its memory read from /proc."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import resource
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import installed

#: The serve options of the transport limits (names fixed by the issue); which of them
#: this checkout's ``cbcl serve`` has is read from its ``--help``.
LIMIT_OPTIONS = ("--handshake-timeout", "--frame-timeout", "--idle-timeout",
                 "--max-connections", "--max-connections-per-peer", "--max-sessions",
                 "--slot-timeout", "--max-conversations", "--max-learned-per-peer",
                 "--compile-workers", "--compile-queue")


def raise_nofile() -> int:
    """Raise this process's open-file soft limit to the hard limit (children inherit it);
    returns the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z")}


def code_state(root: Path) -> dict[str, str]:
    """The checkout's commit and whether the library has uncommitted changes (other
    engineers edit it while benchmarks run)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return "?"
    dirty = [line[3:] for line in git("status", "--porcelain", "--", "cbcl").splitlines()
             if len(line) > 3]
    return {"commit": git("log", "-1", "--format=%h %ci %s").strip()[:110],
            "uncommitted_library_files": ", ".join(dirty) or "none"}


@dataclass
class Keys:
    """A's key (object and file), B's key file, B's trust dir (holds A's key) and A's trust
    dir (holds B's key)."""

    client_key: Any
    client_key_file: Path
    server_key_file: Path
    server_trust: Path
    client_trust: Path


def make_keys(root: Path) -> Keys:
    """Fresh Ed25519 keys for both sides, as ``cbcl negotiate --demo`` makes them."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from cbcl.protocol._trust import private_key_pem, public_key_pem

    keys_dir = root / "keys"
    keys_dir.mkdir(mode=0o700)
    made = {}
    for name, trusted_by in (("bench", "server-trust"), ("server", "client-trust")):
        key = made[name] = Ed25519PrivateKey.generate()
        (root / trusted_by).mkdir(mode=0o700)
        handle = os.open(keys_dir / f"{name}.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(handle, "wb") as file:
            file.write(private_key_pem(key))
        (root / trusted_by / f"{name}.pub").write_bytes(public_key_pem(key.public_key()))
    return Keys(made["bench"], keys_dir / "bench.key", keys_dir / "server.key",
                root / "server-trust", root / "client-trust")


def serve_help() -> str:
    done = subprocess.run([*installed.PYTHON, "-m", "cbcl", "serve", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    return done.stdout + done.stderr


def available_options(help_text: str) -> dict[str, str | None]:
    """Each of :data:`LIMIT_OPTIONS` -> its default as ``--help`` states it ("?" when the
    help does not say), or ``None`` when this ``cbcl serve`` lacks the option."""
    entries: dict[str, str] = {}
    current = None
    for line in help_text.split("options:", 1)[-1].splitlines():
        match = re.match(r"\s{2}(-[-\w]+)", line)
        if match and not line.startswith(" " * 6):
            current = match.group(1)
            entries[current] = line
        elif current is not None:
            entries[current] += " " + line.strip()
    out: dict[str, str | None] = {}
    for option in LIMIT_OPTIONS:
        if option not in entries:
            out[option] = None
            continue
        match = re.search(r"\(default:? ([^)]*)\)", entries[option])
        out[option] = match.group(1) if match else "?"
    return out


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in bytes (empty when it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    name, value = line.split(":", 1)
                    out[name] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    kids = [int(x) for x in handle.read().split()]
            except OSError:
                continue
            found += kids
            stack += kids
    return found


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU seconds of ``pid`` so far (0 when it is gone); with ``children``,
    also those of its children that have ended and been waited for."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        if children:
            ticks += int(fields[13]) + int(fields[14])
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid``, its ended children and its live descendants."""
    return cpu_seconds(pid, children=True) + sum(cpu_seconds(child, children=True)
                                                 for child in descendants(pid))


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat: the
    share of busy time not ours is other people's load on the same cores."""
    try:
        with open("/proc/stat") as handle:
            values = [int(v) for v in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0, 0.0
    user, nice, system, idle, iowait, irq, softirq, steal = values
    busy = user + nice + system + irq + softirq + steal
    hz = os.sysconf("SC_CLK_TCK")
    return busy / hz, (busy + idle + iowait) / hz


def load_average() -> str:
    try:
        with open("/proc/loadavg") as handle:
            return " ".join(handle.read().split()[:3])
    except OSError:
        return "?"


@dataclass
class RSSSampler:
    """Samples the server's VmRSS (and with its descendants, the compile workers)."""

    pid: int
    samples: list[tuple[float, int, int]] = field(default_factory=list)

    def sample(self) -> None:
        own = proc_status(self.pid).get("VmRSS", 0)
        total = own + sum(proc_status(child).get("VmRSS", 0)
                          for child in descendants(self.pid))
        self.samples.append((time.monotonic(), own, total))

    def summary(self) -> dict[str, Any]:
        hwm = proc_status(self.pid).get("VmHWM", 0)
        return {"peak_rss_bytes": hwm, "peak_rss_mb": hwm / 2**20,
                "sampled_max_rss_mb": max((s[1] for s in self.samples), default=0) / 2**20,
                "sampled_max_rss_with_workers_mb":
                    max((s[2] for s in self.samples), default=0) / 2**20,
                "samples": len(self.samples)}


class ServeProcess:
    """``python -m cbcl serve --listen 127.0.0.1:0 …`` with stdout and stderr in files."""

    def __init__(self, root: Path, keys: Keys, extra: list[str], *, name: str = "serve",
                 env: dict[str, str] | None = None) -> None:
        self.root = root
        (root / f"{name}-state").mkdir(mode=0o700, exist_ok=True)
        self.command = [*installed.PYTHON, "-m", "cbcl", "serve", "--listen", "127.0.0.1:0",
                        "--trust", str(keys.server_trust), "--state",
                        str(root / f"{name}-state"), "--key", str(keys.server_key_file),
                        *extra]
        self.env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
        self.env.setdefault("XDG_CACHE_HOME", str(root / f"{name}-cache"))
        self.stdout_path = root / f"{name}.stdout"
        self.stderr_path = root / f"{name}.stderr"
        self.process: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.first_line = ""
        self.cpu_at_stop = 0.0
        #: Seconds from SIGTERM to exit, and whether it had to be killed after 5 s.
        self.stop_s: float | None = None
        self.killed = False

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 60.0) -> str:
        """Start it and wait for ``serve: listening on HOST:PORT as URI``; returns
        HOST:PORT. Raises ``RuntimeError`` with its stderr when it does not start."""
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=out, stderr=err,
                                            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.stdout_path.read_text(errors="replace")
            if "\n" in text:
                self.first_line = text.split("\n", 1)[0]
                match = re.search(r" on (\S+) as ", self.first_line)
                if not match:
                    break
                self.address = match.group(1)
                return self.address
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("cbcl serve did not start: "
                           + (self.stderr_path.read_text(errors="replace").strip()[-2000:]
                              or self.stdout_path.read_text(errors="replace")[:500]
                              or "no output"))

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, wait 5 s, SIGKILL. Returns the exit status."""
        if self.process is None:
            return None
        self.cpu_at_stop = cpu_seconds(self.process.pid) or self.cpu_at_stop
        if self.process.poll() is None:
            began = time.monotonic()
            self.process.terminate()
            try:
                self.process.wait(5.0)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.process.kill()
                self.process.wait()
            self.stop_s = time.monotonic() - began
        return self.process.returncode

    def log(self) -> dict[str, Any]:
        """What the server wrote: line counts, tracebacks and error-looking lines of
        stderr, and a tally of its stdout events by their text after the tag."""
        out = self.stdout_path.read_text(errors="replace").splitlines() \
            if self.stdout_path.exists() else []
        err = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        kinds: dict[str, int] = {}
        for line in out[1:]:
            what = line.split(": ", 1)[-1]
            key = re.sub(r'"[^"]*"|\d+(\.\d+)?|sha256:\S+', "#", what)[:70]
            kinds[key] = kinds.get(key, 0) + 1
        top = sorted(kinds.items(), key=lambda item: -item[1])[:25]
        return {"stdout_lines": len(out), "stderr_bytes": len(err),
                "tracebacks": err.count("Traceback (most recent call last)"),
                "stderr_tail": err.strip()[-1500:],
                "events": dict(top),
                "returncode": None if self.process is None else self.process.returncode,
                "stop_after_sigterm_s": self.stop_s, "killed_after_5s": self.killed}


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) by nearest rank; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]


def verdict(holds: bool | None) -> str:
    return "n/a" if holds is None else ("PASS" if holds else "FAIL")
