"""esgrpo.randn against torch.randn: the same bits, or torch.randn itself where the kernel cannot run."""

from __future__ import annotations

import shutil

import pytest
import torch

from esgrpo import randn


def kernel_expected() -> bool:
    """The machine can build the kernel: an AVX2 CPU and a C compiler (CI has both)."""
    return (torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
            and any(shutil.which(c) for c in ("cc", "gcc")))


def torch_randn(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_kernel_runs_where_the_machine_can_or_says_why():
    if kernel_expected():
        assert randn.available(), randn.unavailable_reason()
        assert randn.kernel_name() == "esgrpo.randn"
    else:
        assert not randn.available() and randn.kernel_name().startswith("torch.randn (")


@pytest.mark.parametrize("shape", [(1,), (15,), (16,), (17,), (33,), (9984,), (9985,), (9999,), (3, 7, 11),
                                   (576, 1536), (1, 100_000)])
@pytest.mark.parametrize("seed", [0, 1, 2**31 - 1, 2**32, 2**32 + 5, 2**63 - 25, 2**64 - 1])
def test_the_same_bits_as_torch_randn(seed, shape):
    assert same_bits(randn.randn(seed, shape), torch_randn(seed, shape))


def test_the_same_bits_on_a_long_stream_and_every_tail():
    """A long draw meets most of the 2^24 possible uniforms of the radii and of the angles (2^25 values: about
    63% of each); a polynomial step that rounded differently would show here. `benchmarks/noise_draws.py
    --verify-values 4294967296` meets each about 128 times (docs/references.md)."""
    n = 2**25 + 9
    assert same_bits(randn.randn(20261207, (n,)), torch_randn(20261207, (n,)))
    for tail in range(16):
        assert same_bits(randn.randn(tail, (10_000 * 16 + tail,)), torch_randn(tail, (10_000 * 16 + tail,)))


def test_into_out_and_its_checks():
    out = torch.full((40, 3), float("nan"))
    assert randn.randn(5, (40, 3), out=out) is out and same_bits(out, torch_randn(5, (40, 3)))
    with pytest.raises(ValueError, match=r"out \(40, 2\)"):
        randn.randn(5, (40, 3), out=torch.empty(40, 2))
    with pytest.raises(ValueError, match="contiguous fp32"):
        randn.randn(5, (40, 3), out=torch.empty(3, 40).T)


def test_switched_off_it_is_torch_randn(monkeypatch):
    monkeypatch.setenv("ESGRPO_RANDN_KERNEL", "0")
    randn._library.cache_clear()
    try:
        assert randn.kernel_name() == "torch.randn (ESGRPO_RANDN_KERNEL=0)"
        assert same_bits(randn.randn(9, (100,)), torch_randn(9, (100,)))
    finally:
        monkeypatch.undo()
        randn._library.cache_clear()


@pytest.mark.skipif(not kernel_expected(), reason="no AVX2 CPU or C compiler")
def test_a_kernel_that_differs_from_torch_is_not_used(monkeypatch, tmp_path):
    """The load-time check is what makes the kernel safe on another torch: a source computing anything else
    (here the angle's 2 pi rounded one step) is refused, and torch.randn draws."""
    source = tmp_path / "randn.c"
    source.write_text(randn.SOURCE.read_text().replace("(float)(2.0 * 3.14159265358979323846)",
                                                       "(float)(2.0 * 3.14159265358979323846) * 1.0000001f"))
    monkeypatch.setattr(randn, "SOURCE", source)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    randn._library.cache_clear()
    try:
        with pytest.warns(UserWarning, match="randn kernel is not available"):
            assert not randn.available()
        assert "differ from torch" in randn.unavailable_reason()
        assert same_bits(randn.randn(9, (100,)), torch_randn(9, (100,)))
    finally:
        monkeypatch.undo()
        randn._library.cache_clear()
