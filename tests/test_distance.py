"""esgrpo.distance: the one weight-space distance that ES, GRPO and the analyses all report."""

import math

import pytest
import torch

from esgrpo.analysis.drift import delta, drift_table, l2, relative_l2
from esgrpo.distance import NORM_CHUNK_ELEMENTS, distance, squared_norm
from esgrpo.grpo.distributed import norm_to


def test_chunked_norms_equal_the_whole_tensor_sums_up_to_one_chunk():
    """The float64 norms go a chunk at a time (issue 21): a tensor of at most one chunk (every tensor of
    the offline default) gives exactly the whole-tensor sum, bit for bit; a larger one a sum of chunk
    sums, equal to ~1e-15."""
    torch.manual_seed(0)
    for shape in [(384, 64), (64,), (1, 3), (0,), (NORM_CHUNK_ELEMENTS,)]:
        a, b = torch.randn(shape) * 1e-3, torch.randn(shape)
        assert squared_norm(a) == float(a.double().pow(2).sum()), shape
        assert squared_norm(a, b) == float((a.double() - b.double()).pow(2).sum()), shape
    big, other = torch.randn(2 * NORM_CHUNK_ELEMENTS + 7), torch.randn(2 * NORM_CHUNK_ELEMENTS + 7)
    assert squared_norm(big) == pytest.approx(float(big.double().pow(2).sum()), rel=1e-14)
    assert squared_norm(big, other) == pytest.approx(float((big.double() - other.double()).pow(2).sum()), rel=1e-14)
    assert squared_norm(big, other, chunk=1000) == pytest.approx(squared_norm(big, other), rel=1e-14)
    # a sum of chunk sums, each chunk's exactly as a fresh float64 copy gives it (the reused chunk buffer)
    for chunk in (1000, NORM_CHUNK_ELEMENTS):
        pieces = range(0, big.numel(), chunk)
        assert squared_norm(big, chunk=chunk) == sum(float(big[s:s + chunk].double().pow(2).sum()) for s in pieces)
        assert squared_norm(big, other, chunk=chunk) == sum(
            float((big[s:s + chunk].double() - other[s:s + chunk].double()).pow(2).sum()) for s in pieces)
    with pytest.raises(ValueError, match="shape mismatch"):
        squared_norm(torch.zeros(3), torch.zeros(4))


def test_difference_is_taken_in_float64_not_in_the_weights_dtype():
    """fp32 subtraction is exact for weights within a factor of two of their start (Sterbenz), not for a
    weight that crosses zero: -1e-8 - 1 rounds to -1 in fp32; in float64 it keeps its 1e-8."""
    theta0, theta = torch.full((1000,), 1.0), torch.full((1000,), -1e-8)
    exact = math.sqrt(1000) * (1.0 - float(theta[0]))
    assert distance({"w": theta}, {"w": theta0}) == pytest.approx(exact, rel=1e-15)
    assert float((theta - theta0).double().norm()) == pytest.approx(math.sqrt(1000), rel=1e-15)  # fp32 first


def test_es_grpo_and_the_drift_analysis_report_the_same_distance():
    """GRPO's distance (`norm_to`, over a module's parameters), ES's (`distance` over its fp32 master) and the
    drift analysis's (`l2` of the float64 delta, `drift_table`) are one number to the last bit."""
    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8))
    reference = {n: p.detach().clone() for n, p in module.named_parameters()}
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 1e-4)
    theta = {n: p.detach() for n, p in module.named_parameters()}
    es = distance(theta, reference)
    assert es > 0
    assert norm_to(module, reference) == es
    assert l2(delta(theta, reference)) == es
    assert math.sqrt((drift_table(theta, reference)["l2"] ** 2).sum()) == pytest.approx(es, rel=1e-15)
    assert relative_l2(theta, reference) == es / distance(reference, {n: 0 * t for n, t in reference.items()})
    assert math.isnan(norm_to(module, None))
