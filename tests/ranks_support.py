"""The ranks of one torch.distributed job as real processes: `python ARGS...` once per rank,
rendezvous through env:// on a free local port, one intra-op thread each."""
from __future__ import annotations

import os
import socket
import subprocess
from typing import List, Sequence, Tuple


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(argv: Sequence[str], world: int, cwd: str, timeout: float
                 ) -> List[Tuple[int, str, str]]:
    """Run `argv` as `world` ranks and wait for all: (exit code, stdout, stderr) per rank. A
    rank still running after `timeout` seconds is killed, and so are the others."""
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                   LOCAL_RANK=str(rank), WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
                   PYTHONFAULTHANDLER="1")
        procs.append(subprocess.Popen(list(argv), env=env, cwd=cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outputs: List[Tuple[str, str]] = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs)]
