"""The mocker's pseudo-embeddings: unit vectors of the model's dimension, a deterministic
function of the token ids (the same in every process), pooled as the pooling says, at the
timing model's prefill time for the batch."""

from __future__ import annotations

import numpy as np
import pytest

from armature.protocols.embedding import EmbeddingShape, Pooling
from armature.sim.clock import VirtualClock
from armature.sim.mock_embedding import MockEmbeddingRunner, pseudo_embedding
from armature.sim.mocker import simulated_arch
from armature.sim.timing import PolynomialTiming, StepWork

DIM = 64


@pytest.mark.parametrize("pooling", list(Pooling))
def test_unit_vectors_of_the_dimension_the_same_every_time(pooling: Pooling) -> None:
    vector = pseudo_embedding([5, 6, 7], DIM, pooling)
    assert vector.dtype == np.dtype("<f4") and vector.shape == (DIM,)
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-6
    assert vector.tobytes() == pseudo_embedding([5, 6, 7], DIM, pooling).tobytes()
    assert not np.array_equal(vector, pseudo_embedding([4, 6, 8], DIM, pooling))


def test_pooling_reads_the_tokens_it_names() -> None:
    # mean: order does not matter, counts do; one token's mean is its own vector
    mean = pseudo_embedding([1, 2, 2], DIM, Pooling.MEAN)
    assert np.allclose(mean, pseudo_embedding([2, 1, 2], DIM, Pooling.MEAN), atol=1e-6)
    assert not np.allclose(mean, pseudo_embedding([1, 2], DIM, Pooling.MEAN), atol=1e-3)
    one = pseudo_embedding([9], DIM, Pooling.MEAN)
    assert np.array_equal(one, pseudo_embedding([9], DIM, Pooling.CLS))
    # cls: the first token alone; last: the whole prompt, in order
    assert np.array_equal(
        pseudo_embedding([9, 1, 2], DIM, Pooling.CLS), pseudo_embedding([9, 3], DIM, Pooling.CLS)
    )
    last = pseudo_embedding([1, 2, 3], DIM, Pooling.LAST)
    assert not np.array_equal(last, pseudo_embedding([2, 1, 3], DIM, Pooling.LAST))
    # random directions in 64 dimensions: distinct tokens are far from parallel
    assert (
        abs(
            float(pseudo_embedding([1], DIM, Pooling.CLS) @ pseudo_embedding([2], DIM, Pooling.CLS))
        )
        < 0.6
    )


def test_a_batch_takes_the_prefill_time_of_its_tokens() -> None:
    timing = PolynomialTiming(speedup_ratio=10.0)
    clock = VirtualClock()
    shape = EmbeddingShape(num_dimensions=DIM, pooling=Pooling.MEAN)
    runner = MockEmbeddingRunner(simulated_arch(1000, 512), 512, shape, timing, clock)
    vectors = runner.embed([[1, 2, 3], [4] * 100])
    assert vectors == [
        pseudo_embedding([1, 2, 3], DIM, Pooling.MEAN).tobytes(),
        pseudo_embedding([4] * 100, DIM, Pooling.MEAN).tobytes(),
    ]
    assert clock.now_s == pytest.approx(timing.step_ms(StepWork(103, 0, 0.0)) / 1000.0)
    assert clock.now_s == pytest.approx((4.21e-7 * 103**2 + 0.01518 * 103 + 16.5) / 10 / 1000)
