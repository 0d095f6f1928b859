"""Which workers' model a frontend serves (`fleet.served_cards`): the one named with
--served-model-name, or the one model of the namespace; several and none named is an error
(the card whose key sorted first decided, so a restarted frontend could switch models)."""

from __future__ import annotations

import msgspec
import pytest

from armature.errors import ConfigError
from armature.frontend.fleet import served_cards
from armature.protocols.worker import WorkerCard, worker_key


def card(instance_id: int, model_name: str) -> WorkerCard:
    return WorkerCard(
        instance_id=instance_id,
        namespace="armature",
        model_name=model_name,
        model_path="/models/" + model_name,
        block_size=16,
        num_kv_blocks=64,
        max_model_len=512,
        vocab_size=1000,
        request_url=f"tcp://127.0.0.1:{10 + instance_id}",
        events_url=f"tcp://127.0.0.1:{20 + instance_id}",
    )


def entries(*cards: WorkerCard) -> dict[str, bytes]:
    return {worker_key("armature", c.instance_id): msgspec.msgpack.encode(c) for c in cards}


def test_the_named_model_is_served_whichever_key_sorts_first() -> None:
    found = entries(card(1, "small"), card(2, "large"), card(3, "large"))
    assert served_cards(found, "large") == [card(2, "large"), card(3, "large")]
    assert served_cards(found, "small") == [card(1, "small")]
    assert served_cards(found, "absent") == []


def test_one_model_needs_no_name_and_unreadable_cards_are_skipped() -> None:
    found = entries(card(2, "small"), card(1, "small"))
    found[worker_key("armature", 9)] = b"\xc1 not a card"
    assert served_cards(found, "") == [card(1, "small"), card(2, "small")]
    assert served_cards({}, "") == []


def test_several_models_and_none_named_is_an_error_naming_them() -> None:
    with pytest.raises(ConfigError) as caught:
        served_cards(entries(card(1, "small"), card(2, "large")), "")
    assert str(caught.value) == (
        "the workers serve 2 models (large, small): name the one this frontend serves with "
        "--served-model-name"
    )
