"""Progress folders (esgrpo.progress): the writer lock against real other processes, whole checkpoints,
fresh starts and the run fingerprint. The trainers' own lock tests are in tests/es/test_loop.py and
tests/grpo/test_trainer.py."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from esgrpo.progress import LOCK_NAME, ProgressFolder, ProgressFolderLocked, WriterLock, fingerprint

SRC = Path(__file__).resolve().parents[1] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC)}
HOLD = ("import sys, time\nfrom esgrpo.progress import WriterLock\n"
        "with WriterLock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)\n")


def holder_process(folder: Path) -> subprocess.Popen:
    """Another process that takes the lock of `folder` and keeps it (until killed)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def stop(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> int:
    proc.send_signal(sig)
    code = proc.wait(timeout=30)
    proc.stdout.close()
    return code


def test_a_live_holder_is_refused_by_name_and_a_dead_one_is_taken_over(tmp_path):
    holder = holder_process(tmp_path)
    try:
        with pytest.raises(ProgressFolderLocked) as error:
            WriterLock(tmp_path).acquire()
        message = str(error.value)
        assert str(tmp_path) in message and f"pid {holder.pid} on host {socket.gethostname()}" in message
    finally:
        stop(holder)  # SIGKILL: no cleanup, its lock stays behind
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == holder.pid
    with WriterLock(tmp_path) as lock:  # same host, dead pid: stale, taken over
        assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == lock.me["token"]
        with WriterLock(tmp_path):  # one process is one writer: a stage and its trainer may both take it
            pass
        assert (tmp_path / LOCK_NAME).exists()  # the inner exit does not give it back
        second = subprocess.run([sys.executable, "-c", "import sys\nfrom esgrpo.progress import WriterLock\n"
                                 "WriterLock(sys.argv[1]).acquire()", str(tmp_path)], env=ENV, capture_output=True,
                                text=True)
        assert second.returncode == 1 and f"pid {os.getpid()} on host" in second.stderr
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_reused_pid_is_not_taken_for_the_holder(tmp_path):
    """The holder died and its pid went to another process (here: this one): its start time differs."""
    me = WriterLock(tmp_path).me
    (tmp_path / LOCK_NAME).write_text(json.dumps({**me, "started": "1", "token": "old"}))
    with WriterLock(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] != "old"


def test_other_hosts_hold_unless_it_is_this_slurm_job_requeued(tmp_path, monkeypatch):
    elsewhere = {"host": "node-elsewhere", "pid": 4242, "slurm_job_id": "777", "token": "theirs"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(elsewhere))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-squeue"))  # SLURM cannot be asked: a live job, for all we know
    with pytest.raises(ProgressFolderLocked, match="pid 4242 on host node-elsewhere, SLURM job 777"):
        WriterLock(tmp_path).acquire()
    monkeypatch.setenv("SLURM_JOB_ID", "777")  # the same job, requeued onto another node: its old run is gone
    with WriterLock(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["slurm_job_id"] == "777"


def test_a_slurm_job_squeue_no_longer_knows_is_stale(tmp_path, monkeypatch):
    squeue = tmp_path / "bin" / "squeue"
    squeue.parent.mkdir()
    squeue.write_text("#!/bin/sh\n[ \"$3\" = 777 ] && { echo 'slurm_load_jobs error: Invalid job id specified' >&2;"
                      " exit 1; }\necho RUNNING\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{squeue.parent}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    running = {"host": "node-elsewhere", "pid": 1, "slurm_job_id": "778", "token": "a"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(running))
    with pytest.raises(ProgressFolderLocked, match="SLURM job 778"):
        WriterLock(tmp_path).acquire()
    (tmp_path / LOCK_NAME).write_text(json.dumps({**running, "slurm_job_id": "777"}))
    with WriterLock(tmp_path):
        pass


def test_of_processes_racing_for_one_stale_lock_exactly_one_wins(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = {"host": socket.gethostname(), "pid": int(gone.stdout), "started": "1", "token": "stale"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(stale))
    go = tmp_path / "go"
    racer = ("import sys, time, pathlib\nfrom esgrpo.progress import WriterLock, ProgressFolderLocked\n"
             "lock = WriterLock(sys.argv[1])\n"
             "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.001)\n"
             "try:\n    lock.acquire()\nexcept ProgressFolderLocked:\n    print('lost', flush=True)\n"
             "else:\n    print('won', flush=True)\n    time.sleep(3)\n    lock.release()\n")
    racers = [subprocess.Popen([sys.executable, "-c", racer, str(tmp_path), str(go)], env=ENV,
                               stdout=subprocess.PIPE, text=True) for _ in range(6)]
    time.sleep(1.5)  # all started and spinning
    go.touch()
    results = [r.communicate(timeout=60)[0].strip() for r in racers]
    assert sorted(results) == ["lost"] * 5 + ["won"], results
    assert not (tmp_path / LOCK_NAME).exists()


def test_sigterm_leaves_through_the_cleanup_and_gives_the_lock_back(tmp_path):
    holder = holder_process(tmp_path)
    assert (tmp_path / LOCK_NAME).exists()
    assert stop(holder, signal.SIGTERM) == 128 + signal.SIGTERM  # scancel, a SLURM time limit
    assert not (tmp_path / LOCK_NAME).exists()


def test_checkpoints_appear_whole_and_a_fresh_start_clears_another_runs(tmp_path):
    (tmp_path / ".tmp-debris").mkdir(parents=True)  # a kill mid-checkpoint left it
    with ProgressFolder(tmp_path, "step-") as progress:
        assert not (tmp_path / ".tmp-debris").exists()
        progress.start_fresh("run-a")
        assert progress.holds("run-a") and not progress.holds("run-b")
        for step in (2, 4):
            progress.write_checkpoint(step, lambda folder, step=step: (folder / "theta.bin").write_text(str(step)),
                                      {"done": step})
        assert [s for s, _ in progress.checkpoints()] == [4]  # only the newest is kept
        assert ProgressFolder.read_state(tmp_path / "step-00000004") == {"done": 4}
        assert (tmp_path / "step-00000004" / "theta.bin").read_text() == "4"
        (tmp_path / "metrics.jsonl").write_text("{}\n")
        progress.start_fresh("run-b", also=("metrics.jsonl",))
        assert progress.checkpoints() == [] and not (tmp_path / "metrics.jsonl").exists()
        assert progress.holds("run-b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_fingerprint_covers_description_and_start_weights_bytes():
    weights = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    description = {"settings": {"lr": 0.1}, "rows": [{"id": "a"}]}
    expected = hashlib.blake2b(digest_size=16)
    expected.update(json.dumps(description, sort_keys=True).encode())
    expected.update(b"w")
    expected.update(weights["w"].numpy().tobytes())
    assert fingerprint(description, weights) == expected.hexdigest()
    nudged = {"w": weights["w"].clone()}
    nudged["w"][1, 2] = torch.nextafter(nudged["w"][1, 2], torch.tensor(10.0))  # one ulp
    assert fingerprint(description, nudged) != fingerprint(description, weights)
    assert fingerprint(description, {"w": weights["w"].bfloat16()}) != fingerprint(description, weights)
    assert fingerprint(description) != fingerprint({**description, "rows": []})


# --------------------------------------------------------------------------- streamed safetensors (esgrpo.models.tensor_files)


def test_write_shards_keeps_one_shard_on_the_host_and_transformers_loads_the_folder(tmp_path, monkeypatch):
    """A model written shard by shard: no save call holds more than a shard, the index is the one
    transformers reads, and the tensors come back bit for bit (views of a bigger tensor included)."""
    import safetensors.torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from esgrpo.models.tensor_files import TensorFiles, write_shards

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    largest = max(v.numel() * 4 for v in state.values())
    calls, real_save = [], safetensors.torch.save_file
    consumed = []

    def recording_save(tensors, path, metadata=None):
        calls.append((sum(t.numel() * t.element_size() for t in tensors.values()), len(consumed)))
        return real_save(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", recording_save)

    def items():
        for name, value in state.items():
            consumed.append(name)
            yield name, value

    names = write_shards(items(), tmp_path / "model", max_shard_bytes=largest, metadata={"format": "pt"})
    assert names == list(state)
    assert len(calls) > 2 and all(size <= largest for size, _ in calls)
    assert calls[0][1] < len(state)  # the first shard went out before the last tensor was even asked for
    files = sorted(p.name for p in (tmp_path / "model").glob("*.safetensors"))
    assert files[0] == f"model-00001-of-{len(calls):05d}.safetensors" and len(files) == len(calls)
    index = json.loads((tmp_path / "model" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(state) and set(index["weight_map"].values()) == set(files)
    config.save_pretrained(tmp_path / "model")
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "model")
    for name, value in reloaded.state_dict().items():
        assert torch.equal(value, state[name]), name
    read = TensorFiles(tmp_path / "model")
    assert set(read.keys()) == set(state) and torch.equal(read.get("model.norm.weight"), state["model.norm.weight"])

    # A small model is one file, as save_file would write it; slices of one tensor get their own storage.
    fused = torch.arange(12.0).reshape(6, 2)
    write_shards([("a", fused[:2]), ("b", fused[2:])], tmp_path / "small")
    assert sorted(p.name for p in (tmp_path / "small").iterdir()) == ["model.safetensors"]
    back = safetensors.torch.load_file(str(tmp_path / "small" / "model.safetensors"))
    assert torch.equal(back["a"], fused[:2]) and torch.equal(back["b"], fused[2:])
    with pytest.raises(ValueError, match="twice"):
        write_shards([("a", fused), ("a", fused)], tmp_path / "twice")
    with pytest.raises(FileNotFoundError):
        TensorFiles(tmp_path / "nothing-here")
