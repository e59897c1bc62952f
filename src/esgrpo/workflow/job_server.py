"""A warm interpreter for local jobs: import torch, transformers and TRL once, fork each job from it.

Every Snakemake `script:` job is a fresh Python process. On the embedded default's 2-core CPU a job
spends ~4-5 s importing torch, transformers and the stage module before a few seconds of work, and
the default grid has a few hundred jobs (docs/references.md, "Job start-up"). Local runs therefore
start one server per Snakemake invocation (the Snakefile's `onstart`) that imports those once; a job's
workflow script then sends its stage call here and this server forks a child that runs it. The
child is the job: it runs `esgrpo.workflow.bridge.StageCall.run` as the script would have, in the job's
working directory and environment, writing the same log, and its exit status becomes the script's.

What it changes: only where the imports happen. What it keeps:
- results: a forked child computes what a fresh process computes (the same modules, seeds set by
  each stage; `tests/workflow/test_job_server.py` checks outputs byte for byte against an in-process run);
- killing: a client that dies (Snakemake cancelling the job) gets its child killed; the server dies
  with its Snakemake process (it polls its parent) and its children with it (PR_SET_PDEATHSIG), so
  `kill -9` of Snakemake leaves nothing running, and a rerun resumes from the runs' progress folders;
- fork safety: the server is single-threaded and never runs a torch operation, so no OpenMP or
  tokenizers thread pool exists when it forks.

Only local, CPU-only runs use it (the Snakefile decides; SLURM jobs and GPU configs run their stage
in-process as before). ``ESGRPO_NO_JOB_SERVER=1`` turns it off.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import pickle
import random
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVER_ENV = "ESGRPO_JOB_SERVER"  # JSON {host, python, socket}, set for the jobs of one Snakemake run
DISABLE_ENV = "ESGRPO_NO_JOB_SERVER"

# What jobs import: the stage modules (they import torch, pandas and the esgrpo core) and the
# libraries they import lazily inside functions (transformers' model and tokenizer classes, TRL).
PRELOAD_MODULES = (
    "esgrpo.workflow.stages.data", "esgrpo.workflow.stages.models", "esgrpo.workflow.stages.training",
    "esgrpo.workflow.stages.evaluation", "esgrpo.workflow.stages.analysis", "esgrpo.workflow.stages.theory",
    "esgrpo.report.paper_a", "esgrpo.report.paper_b", "esgrpo.report.figures", "esgrpo.report.claims_stability",
    "esgrpo.report.base_table", "esgrpo.es.loop", "esgrpo.es.hf_backend", "esgrpo.grpo.trainer",
    "esgrpo.models.warmup", "esgrpo.engines.local", "matplotlib.pyplot",
)
PRELOAD_ATTRIBUTES = {  # lazy modules: an attribute access is what imports the real module
    "transformers": ("AutoConfig", "AutoTokenizer", "AutoModelForCausalLM", "LlamaConfig",
                     "LlamaForCausalLM", "PreTrainedTokenizerFast", "GenerationConfig"),
    "trl": ("GRPOConfig", "GRPOTrainer"),
}
_HEADER = struct.Struct("!I")
_PR_SET_PDEATHSIG = 1


def enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "") in ("", "0")


# --- messages: a 4-byte length, then a pickle ----------------------------------------------------


def _send(conn: socket.socket, obj: object) -> None:
    data = pickle.dumps(obj)
    conn.sendall(_HEADER.pack(len(data)) + data)


def _recv(conn: socket.socket) -> object:
    def exactly(n: int) -> bytes:
        chunks = b""
        while len(chunks) < n:
            chunk = conn.recv(n - len(chunks))
            if not chunk:
                raise ConnectionError("job server connection closed")
            chunks += chunk
        return chunks

    (size,) = _HEADER.unpack(exactly(_HEADER.size))
    return pickle.loads(exactly(size))


# --- the client side: a job's workflow script ----------------------------------------------------


def _this_interpreter() -> dict:
    return {"host": socket.gethostname(), "python": os.path.realpath(sys.executable)}


def server_address() -> str | None:
    """The server socket of the current Snakemake run when it runs on this host with this job's
    interpreter (not a SLURM node's, not a conda env's); else None: run the stage in-process."""
    try:
        server = json.loads(os.environ.get(SERVER_ENV) or "{}")
    except ValueError:
        return None
    path = server.pop("socket", None)
    if not enabled() or not path or server != _this_interpreter() or not os.path.exists(path):
        return None
    return path


def submit(call: object, address: str) -> int | None:
    """Run `call` (an esgrpo.workflow.bridge.StageCall) in a child of the server; its exit status, or None
    when the server cannot be reached (the caller then runs the call itself)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(address)
    except OSError:
        conn.close()
        return None
    with conn:
        _send(conn, {"call": call, "cwd": os.getcwd(), "env": dict(os.environ)})
        return int(_recv(conn))  # blocks until the child exits; our death closes the socket


# --- the server ------------------------------------------------------------------------------------


def preload() -> None:
    """Import what jobs import, without running any torch operation (see the module docstring)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    for name in PRELOAD_MODULES:
        importlib.import_module(name)
    for module, attributes in PRELOAD_ATTRIBUTES.items():
        imported = importlib.import_module(module)
        for attribute in attributes:
            getattr(imported, attribute)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that forked it exits (the server)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the server's own parent polling still applies
        pass


def _child(request: dict, closing: list[socket.socket]) -> None:
    """The forked job: the client's directory and environment, then the stage; never returns."""
    code = 1
    try:
        _die_with_parent()
        for s in closing:
            s.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # A fresh interpreter seeds these from the OS; a fork would share the server's state.
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        request["call"].run()
        code = 0
        _log_usage(request["call"].log_path)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # the stage printed its traceback to its log (StageCall.run)
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _log_usage(log_path: str | None) -> None:
    """The child's own CPU seconds and peak memory at the end of the job's log: Snakemake's `benchmark:`
    file measures the waiting client script, whose wall seconds are the job's but whose CPU and memory
    are not."""
    if not log_path:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        with open(log_path, "a") as log:
            log.write(f"job server child: cpu {usage.ru_utime + usage.ru_stime:.1f} s, "
                      f"max rss {usage.ru_maxrss / 1024:.0f} MiB (the server's shared pages included)\n")
    except OSError:
        pass


def serve(address: str, parent_pid: int) -> None:
    """Accept stage calls on `address` until the parent process (Snakemake) exits or SIGTERM."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(256)  # clients that connect during preload wait in the backlog
    preload()
    children: dict[int, socket.socket] = {}  # child pid -> its client's connection
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        while not stopping and os.getppid() == parent_pid:
            readable, _, _ = select.select([listener, *children.values()], [], [], 0.2)
            for r in readable:
                if r is listener:
                    conn, _ = listener.accept()
                    conn.settimeout(30)
                    request = _recv(conn)
                    pid = os.fork()
                    if pid == 0:
                        _child(request, [listener, conn, *children.values()])
                    children[pid] = conn
                else:  # a client's socket is readable only when it closed: the job was cancelled
                    pid = next(p for p, c in children.items() if c is r)
                    os.kill(pid, signal.SIGKILL)
            _reap(children)
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        listener.close()
        os.unlink(address)


def _reap(children: dict[int, socket.socket]) -> None:
    """Tell each finished child's client its exit status."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        try:
            _send(conn, code if code >= 0 else 128 - code)
        except OSError:
            pass
        conn.close()


class Server:
    """The server process of one Snakemake run (started by `start`, stopped by `stop`)."""

    def __init__(self, process: subprocess.Popen, address: str):
        self.process, self.address = process, address

    def stop(self) -> None:
        if SERVER_ENV in os.environ and self.address in os.environ[SERVER_ENV]:
            del os.environ[SERVER_ENV]
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        folder = Path(self.address).parent
        if folder.exists() and not any(folder.iterdir()):
            folder.rmdir()


def start(log_path: str | os.PathLike) -> Server:
    """Start a server for this process's jobs and point them at it (os.environ[SERVER_ENV])."""
    folder = tempfile.mkdtemp(prefix="esgrpo-jobs-")  # short: a socket path has ~100 characters
    address = os.path.join(folder, "server.sock")
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "esgrpo.workflow.job_server", address, str(os.getpid())],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not os.path.exists(address):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the job server did not start; see {log_path}")
        time.sleep(0.02)
    os.environ[SERVER_ENV] = json.dumps({**_this_interpreter(), "socket": address})
    return Server(process, address)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
