"""The runtime model (esgrpo.plan.runtime) against the papers' ES anchors."""

from __future__ import annotations

import pytest

from esgrpo.plan.runtime import ANCHOR_CHECK, ANCHOR_SECONDS, anchor_check

# --------------------------------------------------------------------------- runtime anchor


def test_runtime_model_reproduces_the_es_anchors():
    model = anchor_check()
    for source, measured in ANCHOR_SECONDS.items():
        assert model[source] == pytest.approx(measured, rel=1e-6)
    source, measured = ANCHOR_CHECK  # not fitted: a check of the model's form
    assert model[source] == pytest.approx(measured, rel=0.10)
