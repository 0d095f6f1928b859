"""Structured output in the engine core, with random logits over the default model's
vocabulary (no model): guided requests share batches with free ones, each guided output is
valid for its guide and ends (STOP) when its grammar is complete, free ones are untouched,
each step's masks are computed on the grammar's thread, a resumed request continues its
grammar, and an engine without a grammar (the mocker) refuses guides naming the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from armature.engines.api import InvalidRequestError
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.engines.native.grammar import GrammarMasks
from armature.engines.native.scheduler import ScheduledChunk
from armature.grammar.tokenizer import load_grammar_tokenizer
from armature.protocols.engine import EngineOutput, EngineRequest, FinishReason, SamplingParams
from armature.protocols.guide import ChoiceGuide, JsonSchemaGuide, RegexGuide
from armature.sim.mocker import build_mocker_core, modeled_layout, simulated_arch
from armature.sim.timing import PolynomialTiming
from armature.transfer.blocks import KvBlockStore, ModeledKvStore

VOCAB = 49152
EOS = 2  # <|im_end|>
SCHEMA = {
    "type": "object",
    "properties": {
        "size": {"enum": ["S", "M", "L"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["size", "count", "ok"],
    "additionalProperties": False,
}
PARAM = "response_format.json_schema.schema"


class RandomLogitsRunner:
    """Seeded random logits for every sequence a step completes; counts the steps."""

    def __init__(self) -> None:
        self.arch = simulated_arch(vocab_size=VOCAB, max_model_len=2048, eos_token_ids=(EOS,))
        self.kv_store: KvBlockStore = ModeledKvStore(modeled_layout(self.arch, 16), 1e12)
        self.generator = torch.Generator().manual_seed(0)
        self.num_steps = 0

    def execute(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        self.num_steps += 1
        num = sum(c.completes_sequence for c in chunks)
        return torch.randn((num, VOCAB), generator=self.generator) * 3


@pytest.fixture(scope="module")
def hf_tokenizer(default_model_dir: Path) -> object:
    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture
def core(default_model_dir: Path) -> EngineCore:
    grammar = GrammarMasks(lambda: load_grammar_tokenizer(default_model_dir, VOCAB, (EOS,)), VOCAB)
    config = NativeEngineConfig(model_dir=default_model_dir, num_kv_blocks=256)
    core = EngineCore(config, RandomLogitsRunner(), num_blocks=256, grammar=grammar)
    yield core
    core.close()


def add(core: EngineCore, rid: str, max_tokens: int, **sampling: object) -> None:
    fields: dict[str, object] = {"temperature": 1.0, "seed": 7, **sampling}
    params = SamplingParams(max_tokens=max_tokens, **fields)  # type: ignore[arg-type]
    core.add_request(EngineRequest(request_id=rid, prompt_token_ids=[1, 2, 3], sampling=params))


def run(core: EngineCore) -> dict[str, tuple[list[int], FinishReason | None, str | None]]:
    out: dict[str, tuple[list[int], FinishReason | None, str | None]] = {}
    while core.has_work():
        for o in core.step():
            tokens = out.get(o.request_id, ([], None, None))[0] + o.new_token_ids
            out[o.request_id] = (tokens, o.finish_reason, o.error)
    return out


def last_outputs(core: EngineCore) -> dict[str, EngineOutput]:
    """Each request's last output, the core run until it has no work."""
    last: dict[str, EngineOutput] = {}
    while core.has_work():
        for o in core.step():
            last[o.request_id] = o
    return last


def test_guided_and_free_requests_share_batches(core: EngineCore, hf_tokenizer: object) -> None:
    schema = JsonSchemaGuide(schema_json=json.dumps(SCHEMA), param=PARAM)
    for i in range(3):
        add(core, f"json-{i}", 200, guide=schema, seed=i)
    add(core, "regex", 200, guide=RegexGuide(pattern="[0-9]{4}", param="guided_regex"))
    add(core, "choice", 200, guide=ChoiceGuide(choices=("alpha", "beta"), param="guided_choice"))
    add(core, "free", 12, ignore_eos=True)
    out = run(core)
    decode = hf_tokenizer.decode  # type: ignore[attr-defined]
    for i in range(3):
        tokens, reason, error = out[f"json-{i}"]
        assert (reason, error) == (FinishReason.STOP, None)
        text = decode([t for t in tokens if t != EOS])
        jsonschema.validate(json.loads(text), SCHEMA)
    assert re.fullmatch("[0-9]{4}", decode(out["regex"][0])), out["regex"]
    assert decode(out["choice"][0]) in ("alpha", "beta")
    # the free request's random tokens are untouched: it runs to max_tokens
    assert (len(out["free"][0]), out["free"][1]) == (12, FinishReason.LENGTH)
    times = core.grammar.times  # type: ignore[union-attr]
    num_guided_tokens = sum(len(out[r][0]) for r in out if r != "free")
    assert times.num_masks == num_guided_tokens  # one mask per guided token, none for free
    assert times.num_steps == core.runner.num_steps  # type: ignore[attr-defined]
    assert times.compute_s > 0


def test_a_resumed_request_continues_its_grammar(core: EngineCore, hf_tokenizer: object) -> None:
    schema = JsonSchemaGuide(schema_json=json.dumps(SCHEMA), param=PARAM)
    carried = hf_tokenizer.encode('{"size": "M", "count": 4', add_special_tokens=False)  # type: ignore[attr-defined]
    params = SamplingParams(max_tokens=100, temperature=1.0, seed=1, guide=schema)
    core.add_request(
        EngineRequest(
            request_id="resumed", prompt_token_ids=[1, 2], sampling=params, output_token_ids=carried
        )
    )
    tokens, reason, _ = run(core)["resumed"]
    text = hf_tokenizer.decode(carried + [t for t in tokens if t != EOS])  # type: ignore[attr-defined]
    assert reason is FinishReason.STOP
    value = json.loads(text)
    jsonschema.validate(value, SCHEMA)
    assert (value["size"], str(value["count"]).startswith("4")) == ("M", True)

    bad = EngineRequest(
        request_id="off", prompt_token_ids=[1], sampling=params, output_token_ids=[EOS, EOS]
    )
    with pytest.raises(InvalidRequestError) as caught:
        core.add_request(bad)
    assert caught.value.param == PARAM


def test_a_guide_past_the_librarys_limits_fails_naming_its_field(core: EngineCore) -> None:
    """A regex that validates but whose lexer grows past llguidance's limits once it reads a
    token: the request ends with an error naming its field (the frontend's 400), the one
    beside it is untouched."""
    guide = RegexGuide(pattern="((a{100}){100}){100}", param="guided_regex")
    add(core, "huge", 20, guide=guide)
    add(core, "free", 5, ignore_eos=True)
    last = last_outputs(core)
    huge = last["huge"]
    assert (huge.finish_reason, huge.error_param) == (FinishReason.ERROR, "guided_regex")
    assert huge.error == "structured output failed: lexer error: too many expressions constructed"
    assert (last["free"].finish_reason, last["free"].error_param) == (FinishReason.LENGTH, None)
    assert core.pool.get_num_active_blocks() == 0


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("(.{1,100}){1,100}", "lexer error: too many expressions constructed"),  # at the mask
        ("[a&&b]", ""),  # matches nothing: the mask allows EOS alone
    ],
)
def test_a_guide_that_fails_computing_its_mask_fails_not_stops(
    core: EngineCore, pattern: str, message: str
) -> None:
    """A grammar whose error arises computing a step's mask (not consuming a token): the
    matcher then allows only EOS, which read as a clean stop with empty output that matched
    nothing (a 200). It ends with the error naming its field."""
    add(core, "bad", 20, guide=RegexGuide(pattern=pattern, param="guided_regex"))
    last = last_outputs(core)
    bad = last["bad"]
    assert (bad.finish_reason, bad.error_param) == (FinishReason.ERROR, "guided_regex")
    assert bad.error is not None and message in bad.error
    assert core.pool.get_num_active_blocks() == 0


def test_the_mocker_refuses_guides_naming_the_field(default_model_dir: Path) -> None:
    config = NativeEngineConfig(model_dir=default_model_dir, num_kv_blocks=64)
    mocker = build_mocker_core(config, timing=PolynomialTiming(speedup_ratio=1000.0))
    params = SamplingParams(max_tokens=4, guide=RegexGuide(pattern="a+", param="guided_regex"))
    with pytest.raises(InvalidRequestError) as caught:
        mocker.validate(EngineRequest(request_id="r", prompt_token_ids=[1], sampling=params))
    assert caught.value.param == "guided_regex"
    assert "guided_regex needs structured output" in str(caught.value)
    assert "the mocker engine serving this model does not enforce" in str(caught.value)
