"""Stopping the real servers tests start (nats-server, spade run, cbcl serve)."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen[bytes] | subprocess.Popen[str], *,
                 timeout: float = 5.0) -> None:
    """Terminate ``process`` if it still runs, kill it if it does not end within
    ``timeout`` seconds, and close its pipes."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
