"""Launches a PyTorch DDP benchmark's ranks on localhost, for bench/torch_ddp.py and bench/torch_ddp_tokens.py:
Debian's python3-torch has no working torchrun, so the script starts itself once per rank with torch.distributed's
env:// variables (a free port on 127.0.0.1), with the thread count the caller asks for."""
import os
import socket
import subprocess
import sys
import time


def run_local_ranks(script, argv, np_ranks, timeout, name, threads=1):
    """Runs `python script argv` as ranks 0..np_ranks-1 (RANK set in their environment) and waits for them. Returns
    the worst exit code, or 1 after killing every rank when they are not all done within `timeout` seconds (gloo can
    hang when the machine is oversubscribed). threads: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS for every rank (Debian's
    torch runs its matrix products on OpenBLAS's own pool, which torch.set_num_threads does not reach); None leaves
    the environment as it is (each library's default)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(np_ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(np_ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if threads is not None:
            env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
        procs.append(subprocess.Popen([sys.executable, script] + argv, env=env))
    deadline = time.monotonic() + timeout
    try:
        codes = [proc.wait(timeout=max(1.0, deadline - time.monotonic())) for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        print(f"{name}: the ranks did not finish within {timeout:.0f} s; killed", file=sys.stderr)
        return 1
    return max(codes)


def blas_kernels():
    """What this process's matrix products run on, "OpenBLAS Cooperlake x2" (kernel family x threads), read from the
    OpenBLAS loaded into it: Debian's torch calls the system's libblas, OpenBLAS unless changed, which picks its own
    kernels by cpuid (ddplab picks by a probe, docs/ARCHITECTURE.md). "(unknown)" where no OpenBLAS is loaded."""
    import ctypes
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line})
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return f"OpenBLAS {lib.openblas_get_corename().decode()} x{lib.openblas_get_num_threads()}"
        except (OSError, AttributeError):
            continue
    return "(unknown)"
