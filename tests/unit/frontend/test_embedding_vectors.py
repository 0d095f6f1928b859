"""Pure parts of embeddings at the edge: vectors cut and renormalised, float and base64 as
OpenAI writes them; which `dimensions` a model allows; the 400 for the wrong task."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from armature.frontend.embedding_vectors import encode_vector
from armature.frontend.tasks import wrong_task
from armature.protocols.embedding import EmbeddingShape, Pooling, WorkerTask

VECTOR = np.array([0.6, 0.0, 0.8, 0.0], dtype="<f4")


def test_float_and_base64_carry_the_same_float32_values() -> None:
    floats = encode_vector(VECTOR.tobytes(), "float")
    assert floats == [float(np.float32(0.6)), 0.0, float(np.float32(0.8)), 0.0]
    text = encode_vector(VECTOR.tobytes(), "base64")
    assert isinstance(text, str)
    decoded = np.frombuffer(base64.b64decode(text), dtype="<f4")
    assert decoded.tolist() == floats


def test_cutting_keeps_the_first_values_renormalised() -> None:
    cut = encode_vector(np.array([0.6, 0.8, 0.0, 0.0], dtype="<f4").tobytes(), "float", 1)
    assert cut == [1.0]
    cut = encode_vector(VECTOR.tobytes(), "float", 3)
    assert cut == pytest.approx([0.6, 0.0, 0.8], abs=1e-7)
    assert encode_vector(VECTOR.tobytes(), "float", 4) == encode_vector(VECTOR.tobytes(), "float")
    zero = encode_vector(np.array([0.0, 1.0], dtype="<f4").tobytes(), "float", 1)
    assert zero == [0.0]  # nothing to renormalise


def test_dimensions_need_a_declared_matryoshka_model() -> None:
    plain = EmbeddingShape(num_dimensions=8, pooling=Pooling.MEAN)
    assert "does not support `dimensions`" in (plain.check_dimensions(8) or "")
    any_size = EmbeddingShape(num_dimensions=8, pooling=Pooling.MEAN, matryoshka_dimensions=())
    assert any_size.check_dimensions(1) is None and any_size.check_dimensions(8) is None
    assert any_size.check_dimensions(9) == "dimensions must be 1..8, got 9"
    listed = EmbeddingShape(num_dimensions=8, pooling=Pooling.MEAN, matryoshka_dimensions=(2, 4, 8))
    assert listed.check_dimensions(4) is None
    assert listed.check_dimensions(3) == (
        "this model's vectors can be cut to 2, 4, 8 dimensions, not 3"
    )


def test_the_wrong_task_names_the_model_and_the_task_it_is_served_for() -> None:
    error = wrong_task("m", WorkerTask.EMBED, has_generate=True, has_embed=False)
    assert error is not None
    assert (error.status_code, error.param, error.code) == (400, "model", "wrong_task")
    assert error.message.startswith("model 'm' is served for task generate only; /v1/embeddings")
    error = wrong_task("m", WorkerTask.GENERATE, has_generate=False, has_embed=True)
    assert error is not None and "served for task embed only; text generation" in error.message
    assert wrong_task("m", WorkerTask.EMBED, has_generate=True, has_embed=True) is None
    assert wrong_task("m", WorkerTask.EMBED, has_generate=False, has_embed=False) is None
