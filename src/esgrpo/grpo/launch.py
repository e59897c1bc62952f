"""GRPO over several GPUs: `esgrpo.grpo.trainer.train_grpo` in one process per GPU, started by `accelerate launch`.

When a model's training state does not fit one GPU (about 16 bytes per parameter: fp32 weights and
gradients, two AdamW moments; docs/references.md), the resource plan gives the run
``num_processes`` > 1 and a ``sharding`` (`esgrpo.grpo.settings.SHARDINGS`). TRL and accelerate
do the work; this module only

- writes the accelerate config for the settings (`accelerate_config`: DDP, DeepSpeed ZeRO-3 or FSDP2,
  bf16 on a GPU) and the job (model, rows, settings, folders) into a temporary folder;
- runs ``python -m accelerate.commands.launch --config_file ... -m esgrpo.grpo.launch job.json``
  (`launch_command`) over the GPUs the job was given (CUDA_VISIBLE_DEVICES), on a free port, and
  returns the summary rank 0 wrote (`launch_grpo`, called like `train_grpo`).

What each process needs inside the run (its rank, loading, the gathers) is `esgrpo.grpo.distributed`.
One process (num_processes 1) never comes here: `train_grpo` runs in the job itself.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from esgrpo.files import read_json, read_jsonl, write_json, write_jsonl
from esgrpo.grpo.distributed import rank
from esgrpo.grpo.settings import GRPOSettings
from esgrpo.grpo.trainer import train_grpo
from esgrpo.live import LiveSettings
from esgrpo.run_record import RunSummary

__all__ = ["accelerate_config", "launch_command", "launch_grpo", "main"]


# --------------------------------------------------------------------------- the launch


def accelerate_config(settings: GRPOSettings, cuda: bool = True) -> dict[str, Any]:
    """accelerate's config (the YAML `accelerate config` writes) for `settings` on one machine.

    Follows TRL's shipped trl/accelerate_configs/{multi_gpu,zero3,fsdp2}.yaml, except: the model is
    loaded whole before the trainer (ZeRO-3 without zero.Init, FSDP without rank-0-only loading), and
    under FSDP activation checkpointing is FSDP's (transformers refuses it twice).
    """
    bf16 = cuda if settings.bf16 is None else settings.bf16
    checkpointing = cuda if settings.activation_checkpointing is None else settings.activation_checkpointing
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": "MULTI_GPU",
        "downcast_bf16": "no", "machine_rank": 0, "main_training_function": "main",
        "mixed_precision": "bf16" if bf16 else "no", "num_machines": 1, "num_processes": settings.num_processes,
        "rdzv_backend": "static", "same_network": True, "use_cpu": False,
    }
    if settings.sharding == "zero3":
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = {
            "zero_stage": 3, "zero3_init_flag": False, "offload_optimizer_device": "none",
            "offload_param_device": "none", "deepspeed_multinode_launcher": "standard",
            # TRL's checkpoints keep a 16-bit model beside the partitioned fp32 state; the export gathers fp32.
            "zero3_save_16bit_model": True}
    elif settings.sharding == "fsdp":
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = {
            "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_activation_checkpointing": bool(checkpointing), "fsdp_cpu_ram_efficient_loading": False,
            "fsdp_offload_params": False, "fsdp_reshard_after_forward": True,
            # Each rank saves its shard of a checkpoint: resuming needs the same num_processes (fingerprinted).
            "fsdp_state_dict_type": "SHARDED_STATE_DICT"}
    return config


def _free_port() -> int:
    """A TCP port no process listens on now: two GRPO jobs on one node must not share a rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch_command(config_file: str | os.PathLike, job_file: str | os.PathLike, num_processes: int,
                   port: int) -> list[str]:
    """The command that runs `main(job_file)` in `num_processes` processes under accelerate."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file),
            "--num_processes", str(int(num_processes)), "--main_process_port", str(int(port)),
            "-m", "esgrpo.grpo.launch", str(job_file)]


def launch_grpo(model_dir_or_ref: str | os.PathLike, rows: Sequence[dict], verifier: str,
                settings: GRPOSettings | Mapping[str, Any], out_dir: str | os.PathLike,
                progress_dir: str | os.PathLike, log: Callable[[str], Any] = print,
                live: LiveSettings | None = None) -> RunSummary:
    """`esgrpo.grpo.trainer.train_grpo` in settings.num_processes processes (one per GPU); returns rank 0's summary
    (which rank 0 leaves in the launch's temporary folder)."""
    import yaml

    settings = settings if isinstance(settings, GRPOSettings) else GRPOSettings.from_dict(settings)
    if settings.sharding == "zero3" and importlib.util.find_spec("deepspeed") is None:
        raise ImportError("GRPOSettings.sharding zero3 needs DeepSpeed (`pip install deepspeed`), which this "
                          "environment lacks; fsdp shards the same state with torch alone")
    out_dir = Path(out_dir)
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="esgrpo-grpo-launch-") as tmp:
        folder = Path(tmp)
        write_jsonl(folder / "rows.jsonl", list(rows))
        write_json(folder / "job.json", {"model": str(model_dir_or_ref), "rows": str(folder / "rows.jsonl"),
                                         "verifier": verifier, "settings": settings.to_dict(),
                                         "out_dir": str(out_dir), "progress_dir": str(progress_dir),
                                         "summary": str(folder / "summary.json"),
                                         "live": (live or LiveSettings()).to_dict()})
        (folder / "accelerate.yaml").write_text(yaml.safe_dump(accelerate_config(settings, cuda), sort_keys=True))
        command = launch_command(folder / "accelerate.yaml", folder / "job.json", settings.num_processes,
                                 _free_port())
        log(f"grpo: {settings.num_processes} processes, sharding {settings.sharding}: {' '.join(command)}")
        # The children import esgrpo from where this process did (an editable install or a source tree).
        source = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p))
        done = subprocess.run(command, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"grpo: the {settings.num_processes}-process launch failed (exit {done.returncode}); "
                               f"each rank's traceback is in the log above")
        return RunSummary.from_dict(read_json(folder / "summary.json"))


def main(argv: Sequence[str] | None = None) -> None:
    """One process of a launch: `train_grpo` on the job file `launch_grpo` wrote (rank 0 logs)."""
    (job_file,) = list(argv if argv is not None else sys.argv[1:])
    job = read_json(job_file)
    try:
        summary = train_grpo(job["model"], read_jsonl(job["rows"]), job["verifier"],
                             GRPOSettings.from_dict(job["settings"]), job["out_dir"], job["progress_dir"],
                             log=print if rank() == 0 else (lambda message: None),
                             live=LiveSettings.from_dict(job.get("live")))
        if summary is not None:  # rank 0's, for launch_grpo to return
            write_json(job["summary"], summary.to_dict())
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
