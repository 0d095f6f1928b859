"""Which task a request needs and whether this frontend's workers serve it: a chat or
completion request needs workers of task generate, an embedding request workers of task
embed. Pure."""

from __future__ import annotations

from armature.frontend.errors import ApiError
from armature.protocols.embedding import WorkerTask

__all__ = ["wrong_task"]

_NEEDS = {
    WorkerTask.GENERATE: "text generation (chat and completions) needs workers of task generate",
    WorkerTask.EMBED: (
        "/v1/embeddings needs workers of task embed (armature worker --task embed, with any "
        "engine: torch pools the model's hidden states, vllm runs its pooling runner, the "
        "mocker serves seeded pseudo-embeddings)"
    ),
}


def wrong_task(
    model: str, wanted: WorkerTask, *, has_generate: bool, has_embed: bool
) -> ApiError | None:
    """The 400 for a request that needs `wanted` when every worker of `model` serves the other
    task (None when some serves it, or when no worker serves anything: that is a 503 later)."""
    serves = {WorkerTask.GENERATE: has_generate, WorkerTask.EMBED: has_embed}
    other = WorkerTask.EMBED if wanted is WorkerTask.GENERATE else WorkerTask.GENERATE
    if serves[wanted] or not serves[other]:
        return None
    return ApiError(
        f"model {model!r} is served for task {other} only; {_NEEDS[wanted]}",
        param="model",
        code="wrong_task",
    )
