"""The panel kernel (esgrpo.engines.panel_matmul) against torch's matmul, and where it may not run."""

from __future__ import annotations

import shutil

import pytest
import torch

from esgrpo.engines import panel_matmul


def kernel_expected() -> bool:
    """The machine can build the kernel: an AVX2 CPU and a C compiler (CI has both)."""
    return (torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
            and any(shutil.which(c) for c in ("cc", "gcc")))


def test_kernel_builds_where_the_machine_can_or_says_why():
    if kernel_expected():
        assert panel_matmul.available(), panel_matmul.unavailable_reason()
        assert panel_matmul.unavailable_reason() == ""
    else:
        assert not panel_matmul.available()
        assert "AVX2" in panel_matmul.unavailable_reason() or "compiler" in panel_matmul.unavailable_reason()
    assert not panel_matmul.available("meta")  # CPU only
    assert panel_matmul.kernel_name("meta") == "torch.bmm on meta"
    assert panel_matmul.kernel_name("cpu").startswith("panel" if kernel_expected() else "oneDNN packed (")


@pytest.mark.skipif(not kernel_expected(), reason="no AVX2 CPU or C compiler")
def test_a_fresh_cache_compiles_the_kernel_once(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a machine that never built it (CI's clean one)
    panel_matmul._library.cache_clear()
    try:
        assert panel_matmul.available(), panel_matmul.unavailable_reason()
        built = list((tmp_path / "esgrpo" / "kernels").glob("panel_matmul-*.so"))
        assert len(built) == 1 and not [p for p in built[0].parent.iterdir() if p not in built]  # no leftovers
        w, x = torch.randn(30, 16), torch.randn(5, 16)
        torch.testing.assert_close(panel_matmul.matmul(x, panel_matmul.pack(w)), x @ w.T, rtol=1e-5, atol=1e-5)
    finally:
        monkeypatch.undo()
        panel_matmul._library.cache_clear()


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("ESGRPO_PANEL_KERNEL", "0")
    panel_matmul._library.cache_clear()
    try:
        assert not panel_matmul.available() and panel_matmul.unavailable_reason() == "ESGRPO_PANEL_KERNEL=0"
    finally:
        monkeypatch.delenv("ESGRPO_PANEL_KERNEL")
        panel_matmul._library.cache_clear()


def test_a_compiler_that_fails_leaves_oneDNN_and_warns_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "false")  # a compiler that exits 1 and builds nothing
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no kernel built before
    panel_matmul._library.cache_clear()
    try:
        with pytest.warns(UserWarning, match="panel kernel is not available"):
            assert not panel_matmul.available()
        avx2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
        why = "false failed on " if avx2 else "CPU capability "
        assert panel_matmul.kernel_name().startswith(f"oneDNN packed ({why}")
        assert not list(tmp_path.rglob("*.so"))
    finally:
        monkeypatch.undo()
        panel_matmul._library.cache_clear()


needs_kernel = pytest.mark.skipif(not kernel_expected(), reason="no AVX2 CPU or C compiler")


@needs_kernel
@pytest.mark.parametrize("out,inp", [(24, 5), (7, 3), (1536, 576), (50, 77), (48, 20), (100, 1)])
@pytest.mark.parametrize("rows", [1, 3, 4, 8, 13, 70, 131])
def test_panel_matmul_is_x_times_w_transpose(out, inp, rows):
    gen = torch.Generator().manual_seed(out * 1000 + inp + rows)
    w = torch.randn(out, inp, generator=gen)
    x = torch.randn(rows, inp, generator=gen)
    panels = panel_matmul.pack(w)
    assert panels.data.shape == (-(-out // panel_matmul.PANEL), inp, panel_matmul.PANEL)
    exact = (x.double() @ w.double().T).float()
    got = panel_matmul.matmul(x, panels)
    # fp32 sums of `inp` products in another order: a few ulps of the largest partial sums
    torch.testing.assert_close(got, exact, rtol=1e-5, atol=1e-5 * inp ** 0.5)
    into = torch.full((rows, out), float("nan"))
    assert panel_matmul.matmul(x, panels, into) is into and torch.equal(into, got)


@needs_kernel
@pytest.mark.parametrize("out,inp", [(48, 20), (50, 77), (7, 3)])
def test_pack_applies_column_then_row_scales_as_torch_rounds_them(out, inp):
    w, col, row = torch.randn(out, inp), torch.rand(inp) + 0.5, torch.rand(out) + 0.5
    expect = (w * col[None, :]) * row[:, None]
    padded = torch.zeros(-(-out // panel_matmul.PANEL) * panel_matmul.PANEL, inp)
    padded[:out] = expect
    as_panels = padded.view(-1, panel_matmul.PANEL, inp).transpose(1, 2)
    assert torch.equal(panel_matmul.pack(w, col, row).data, as_panels)  # bit for bit
    padded[:out] = w * col[None, :]
    assert torch.equal(panel_matmul.pack(w, col=col).data, as_panels)
    with pytest.raises(ValueError, match=rf"row scale \({out + 1},\)"):
        panel_matmul.pack(w, row=torch.ones(out + 1))


@needs_kernel
def test_result_does_not_depend_on_the_thread_count():
    w, x = torch.randn(1000, 300), torch.randn(40, 300)  # 12M multiply-adds: split over threads
    panels = panel_matmul.pack(w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = panel_matmul.matmul(x, panels)
        torch.set_num_threads(2)
        assert torch.equal(panel_matmul.matmul(x, panels), one)
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_bad_shapes_are_refused_with_the_shapes():
    panels = panel_matmul.pack(torch.randn(10, 6))
    with pytest.raises(ValueError, match=r"\(3, 5\).*\[10, 6\]"):
        panel_matmul.matmul(torch.randn(3, 5), panels)
    with pytest.raises(ValueError, match=r"out \(3, 9\)"):
        panel_matmul.matmul(torch.randn(3, 6), panels, torch.empty(3, 9))
    with pytest.raises(ValueError, match="2-D fp32 CPU"):
        panel_matmul.pack(torch.randn(10, 6, dtype=torch.float64))


def avx512_cpu() -> bool:
    """The CPU has AVX-512 F and VL (what the 8-row tile needs), read from /proc/cpuinfo's flags."""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return "avx512f" in flags and "avx512vl" in flags


@needs_kernel
@pytest.mark.parametrize("out,inp", [(24, 5), (7, 3), (960, 576), (50, 77)])
@pytest.mark.parametrize("rows", [1, 4, 5, 8, 9, 16, 70, 131])
def test_the_wide_tile_gives_the_same_floats_and_runs_only_on_avx512(out, inp, rows):
    gen = torch.Generator().manual_seed(out * 1000 + inp + rows)
    w, x = torch.randn(out, inp, generator=gen), torch.randn(rows, inp, generator=gen)
    panels = panel_matmul.pack(w)
    try:
        assert panel_matmul.set_wide_tile(True) is avx512_cpu()
        assert panel_matmul.wide_tile() is avx512_cpu()
        wide = panel_matmul.matmul(x, panels)
        assert panel_matmul.set_wide_tile(False) is False and not panel_matmul.wide_tile()
        narrow = panel_matmul.matmul(x, panels)
    finally:
        panel_matmul.set_wide_tile(True)
    assert torch.equal(wide, narrow)  # the same fused multiply-add chain per output, bit for bit
