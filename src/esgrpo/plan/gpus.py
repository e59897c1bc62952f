"""GPU types the plan knows: memory a job can use, the device total vLLM's share is a fraction
of, and the speeds the runtime model divides by.

`memory_gib` is what a process can allocate, not the marketing figure: the driver reserves a
little (an H200 sold as 141 GB shows ~139 GiB usable, docs/references.md). `total_gib` is the
device total CUDA reports (`cudaMemGetInfo`, torch's `mem_get_info()[1]` and device properties'
`total_memory`): vLLM's engine takes `ceil(gpu_memory_utilization x total)` (vllm/v1/worker/utils.py
`request_memory`, `MemorySnapshot.total_memory` from `torch.cuda.mem_get_info`, vLLM 0.31), so the
plan's fractions are of this, not of `memory_gib`. Speeds are dense bf16 matmul and device-memory
bandwidth as PyTorch reaches them: measured on the H200 (docs/references.md: ~790 TFLOP/s,
~4.3 TB/s); for the others, NVIDIA's datasheet figures scaled by the same measured/datasheet
ratios as the H200 (790/989 and 4.3/4.8), so every type is costed the same way. A type not
listed here is an error naming the known ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from esgrpo.plan.architecture import PlanError

GIB = 2**30

# Reached / datasheet on the H200 (docs/references.md: 790 TFLOP/s of 989 dense bf16, 4.3 of 4.8 TB/s).
_MATMUL_REACHED = 790 / 989
_COPY_REACHED = 4.3 / 4.8


@dataclass(frozen=True)
class GpuType:
    name: str
    memory_gib: float  # usable by one process
    bf16_tflops: float  # dense bf16 matmul PyTorch reaches
    memory_tbps: float  # device-memory copy bandwidth PyTorch reaches
    total_mib: int  # the device total CUDA reports (MiB, as torch prints `total_memory`)
    note: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def total_bytes(self) -> int:
        """What vLLM multiplies gpu_memory_utilization by."""
        return self.total_mib * 2**20


def _datasheet(name: str, memory_gib: float, tflops: float, tbps: float, total_mib: int, note: str) -> GpuType:
    return GpuType(name, memory_gib, tflops * _MATMUL_REACHED, tbps * _COPY_REACHED, total_mib, note)


# total_mib: torch's `_CudaDeviceProperties(... total_memory=...MB)` as printed in public logs (H200
# 143,156; H100 SXM 81,082-81,090, the lowest taken; A100 40 GB 40,536; L40S 45,589), else what
# nvidia-smi lists as the total, which is a few hundred MiB above CUDA's (A100 80 GB 81,920; H100 NVL
# 95,830; A10 23,028): for those the plan's share may come out up to ~1% short of what it meant. No
# usable figure may exceed its total (tests/plan/test_plan.py); the H100's was 79.2 GiB, above its 79.18.
GPU_TYPES: dict[str, GpuType] = {
    t.name: t for t in (
        GpuType("h200", 139.0, 790.0, 4.3, 143156,
                "H200 SXM 141 GB; usable and speeds measured (docs/references.md)"),
        _datasheet("h100", 79.1, 989.0, 3.35, 81082,
                   "H100 SXM 80 GB (CUDA total 79.18 GiB; ~79.1 usable), datasheet scaled"),
        _datasheet("h100_nvl", 93.0, 835.0, 3.9, 95830, "H100 NVL 94 GB, datasheet scaled"),
        _datasheet("a100_80", 79.2, 312.0, 2.04, 81920, "A100 SXM 80 GB, datasheet scaled"),
        _datasheet("a100_40", 39.4, 312.0, 1.56, 40536,
                   "A100 SXM 40 GB (40 GiB; ~39.4 usable), datasheet scaled"),
        _datasheet("l40s", 44.4, 362.0, 0.864, 45589,
                   "L40S 48 GB GDDR6 (45 GiB; ~44.4 usable), datasheet scaled"),
        _datasheet("a10", 22.0, 125.0, 0.6, 23028, "A10 24 GB (22.5 GiB; ~22 usable), datasheet scaled"),
    )
}

# The SLURM GRES names sites use for these (`sinfo -o "%P %G"`), mapped to the keys above.
ALIASES = {"h200_141gb": "h200", "h100_80gb": "h100", "h100-sxm": "h100", "a100": "a100_80",
           "a100-80gb": "a100_80", "a100_80gb": "a100_80", "a100-40gb": "a100_40", "a100_40gb": "a100_40",
           "l40": "l40s"}


def gpu_type(name: str) -> GpuType:
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key not in GPU_TYPES:
        raise PlanError(f"GPU type {name!r} is not in the plan's table; known: {sorted(GPU_TYPES)} "
                        f"(and aliases {sorted(ALIASES)}), or cpu for vLLM's CPU build on this host; add it to esgrpo/plan/gpus.py")
    return GPU_TYPES[key]
