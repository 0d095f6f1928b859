"""What reaches the chat template from a request: the variables `chat_template_kwargs` and
`reasoning_effort` on chat, `reasoning.effort` on /v1/responses, and developer messages,
through the whole frontend with the official openai client (a scripted engine records the
prompt the template rendered). Bad names and values are 400s naming the field; a template
that fails on a variable's value is a 400."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from frontend_fakes import ScriptedEngine, one_engine_frontend, openai_client

from armature.frontend.chat_setup import chatml_tools_template
from armature.frontend.parsing import OutputParsers
from armature.frontend.preprocess import Preprocessor
from armature.frontend.protocol import RESERVED_TEMPLATE_KWARGS

pytestmark = pytest.mark.slow  # loads the default model's tokenizer

MODEL = "m"
# a template that prints the variables a request may set (and fails on a bad `depth`)
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}[effort={{ reasoning_effort | default('unset') }} "
    "thinking={{ enable_thinking | default('unset') }}"
    "{% if depth is defined %} depth={{ depth + 1 }}{% endif %}]\n"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ASK: Any = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def preprocessor(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir, TEMPLATE)


def serve(preprocessor: Preprocessor) -> tuple[ScriptedEngine, openai.AsyncOpenAI]:
    engine = ScriptedEngine(preprocessor)
    return engine, openai_client(one_engine_frontend(engine, OutputParsers.named(None, "qwen3")))


def rendered_line(preprocessor: Preprocessor, prompt: list[int]) -> str:
    """The template's line of variables in the prompt the engine was given."""
    text = preprocessor.decode(prompt, skip_special_tokens=False)
    return text[text.index("[") : text.index("]") + 1]


async def test_chat_variables_reach_the_template(preprocessor: Preprocessor) -> None:
    engine, client = serve(preprocessor)
    engine.outputs = ["Hello."] * 4

    await client.chat.completions.create(model=MODEL, messages=ASK)
    await client.chat.completions.create(model=MODEL, messages=ASK, reasoning_effort="low")
    await client.chat.completions.create(
        model=MODEL, messages=ASK, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    # the request's reasoning_effort over a template variable of the same name
    await client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        reasoning_effort="high",
        extra_body={"chat_template_kwargs": {"reasoning_effort": "low", "depth": 2}},
    )

    assert [rendered_line(preprocessor, p) for p in engine.prompts] == [
        "[effort=unset thinking=unset]",
        "[effort=low thinking=unset]",
        "[effort=unset thinking=False]",
        "[effort=high thinking=unset depth=3]",
    ]


async def test_responses_reasoning_effort_reaches_the_template_and_is_echoed(
    preprocessor: Preprocessor,
) -> None:
    engine, client = serve(preprocessor)
    engine.outputs = ["Hello.", "Hello."]

    plain = await client.responses.create(model=MODEL, input="Hi")
    asked = await client.responses.create(
        model=MODEL, input="Hi", reasoning={"effort": "minimal", "summary": "auto"}
    )

    assert [rendered_line(preprocessor, p) for p in engine.prompts] == [
        "[effort=unset thinking=unset]",
        "[effort=minimal thinking=unset]",
    ]
    assert plain.reasoning is not None and asked.reasoning is not None
    assert (plain.reasoning.effort, plain.reasoning.summary) == (None, None)
    assert (asked.reasoning.effort, asked.reasoning.summary) == ("minimal", "auto")
    assert asked.output_text == "Hello."


async def test_bad_variables_are_400s_naming_the_field(preprocessor: Preprocessor) -> None:
    engine, client = serve(preprocessor)
    chat, kw = "chat/completions", "chat_template_kwargs"
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        (chat, {"reasoning_effort": "extreme"}, "reasoning_effort", "Input should"),
        (chat, {kw: {"tools": []}}, kw, "renderer's own"),
        (chat, {kw: {"a b": 1}}, kw, "variable names"),
        (chat, {kw: [1]}, kw, "dictionary"),
        (chat, {kw: {f"k{i}": i for i in range(65)}}, kw, "at most 64"),
        # the template adds 1 to `depth`: a string fails while rendering
        (chat, {kw: {"depth": "two"}}, "messages", "messages with the variables depth:"),
        ("responses", {"reasoning": {"effort": "max"}}, "reasoning.effort", "Input should"),
        ("responses", {"reasoning": {"summary": "long"}}, "reasoning.summary", "Input should"),
    ]
    for path, extra, param, message in cases:
        body = {"model": MODEL, **extra}
        body.update({"messages": ASK} if path == chat else {"input": "Hi"})
        with pytest.raises(openai.BadRequestError) as caught:
            await client.post(f"/{path}", body=body, cast_to=httpx.Response)
        error = caught.value.body
        assert isinstance(error, dict), (path, extra)
        assert error["param"] == param, (path, extra, error)
        assert message in error["message"], (path, extra, error)
    assert engine.prompts == []  # nothing reached the engine


async def test_a_developer_message_is_a_system_message_unless_the_template_knows_it(
    default_model_dir: Path,
) -> None:
    """OpenAI's developer role replaces system: a template that never names it (the default
    model's) renders it as a system message, on chat and on /v1/responses; one that names
    it gets it as it came."""
    prompts = {}
    for name, template in [
        ("own", None),
        ("knows", "{% for m in messages %}{{ m.role == 'developer' }}:{{ m.role }} {% endfor %}"),
    ]:
        engine, client = serve(Preprocessor(default_model_dir, template))
        engine.outputs = ["Hello."] * 3
        for role in ("system", "developer"):
            ask = [{"role": role, "content": "Answer in French."}, *ASK]
            await client.chat.completions.create(model=MODEL, messages=ask)  # type: ignore[arg-type]
        await client.responses.create(
            model=MODEL, input=[{"role": "developer", "content": "Answer in French."}, *ASK]
        )
        prompts[name] = [engine.preprocessor.decode(p, False) for p in engine.prompts]
    system, developer, responses = prompts["own"]
    assert developer == system == responses
    assert "<|im_start|>system\nAnswer in French.<|im_end|>" in system
    assert prompts["knows"] == ["False:system False:user ", *["True:developer False:user "] * 2]


def test_whichever_template_renders_decides_the_developer_role(default_model_dir: Path) -> None:
    """A chat template that names the developer role beside a tools template that does not
    (the bundled ChatML one): chats without tools keep the role, chats with tools render it
    as system."""
    knows = "{% for m in messages %}{{ m.role }}{{ '!' if m.role == 'developer' }} {% endfor %}"
    preprocessor = Preprocessor(default_model_dir, knows).with_tools_template(
        chatml_tools_template()
    )
    messages = [{"role": "developer", "content": "Be brief."}, *ASK]
    assert preprocessor.render_chat(messages) == "developer! user "
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with_tools = preprocessor.render_chat(messages, [tool])
    assert with_tools.startswith("<|im_start|>system\nBe brief.")
    assert "developer" not in with_tools


async def test_an_assistants_refusal_in_the_history_renders_as_what_it_said(
    default_model_dir: Path,
) -> None:
    engine, client = serve(Preprocessor(default_model_dir))
    engine.outputs = ["Hello."] * 5
    said = "I cannot help with that."
    refused = [{"type": "refusal", "refusal": said}]
    then = {"role": "user", "content": "Ok"}
    assistants: list[dict[str, Any]] = [
        {"role": "assistant", "content": said},
        {"role": "assistant", "content": refused},
        # the message as OpenAI returned it: no content, the refusal beside it
        {"role": "assistant", "content": None, "refusal": said},
    ]
    for assistant in assistants:
        await client.chat.completions.create(model=MODEL, messages=[*ASK, assistant, then])
    for content in ([{"type": "output_text", "text": said}], refused):
        history = [*ASK, {"role": "assistant", "content": content}, then]
        await client.responses.create(model=MODEL, input=history)  # type: ignore[arg-type]
    assert len(set(map(tuple, engine.prompts))) == 1  # all five the same prompt
    assert said in engine.preprocessor.decode(engine.prompts[0])

    # only an assistant refuses
    refusal = [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]
    with pytest.raises(openai.BadRequestError, match="'refusal' is not supported"):
        await client.chat.completions.create(model=MODEL, messages=refusal)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="only an assistant message may hold"):
        await client.responses.create(model=MODEL, input=refusal)  # type: ignore[arg-type]
    user_refusal: Any = [{"role": "user", "content": "hi", "refusal": "no"}]
    with pytest.raises(openai.BadRequestError, match="only an assistant message holds a ref"):
        await client.chat.completions.create(model=MODEL, messages=user_refusal)
    assert len(engine.prompts) == 5


def test_the_renderers_own_arguments_are_refused_as_variables() -> None:
    """Every argument transformers' renderer takes itself is a reserved name (a new one in a
    later transformers would reach the renderer, not the template)."""
    from transformers import PreTrainedTokenizerBase
    from transformers.utils.chat_template_utils import render_jinja_template

    taken = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)
    taken |= set(inspect.signature(render_jinja_template).parameters)
    assert taken - {"self", "kwargs"} <= RESERVED_TEMPLATE_KWARGS


async def test_variables_the_template_does_not_read_are_logged(
    preprocessor: Preprocessor, caplog: pytest.LogCaptureFixture
) -> None:
    engine, client = serve(preprocessor)
    engine.outputs = ["Hello."] * 2
    caplog.set_level(logging.INFO, logger="armature.frontend.jobs")
    read: Any = {"chat_template_kwargs": {"enable_thinking": False}}
    await client.chat.completions.create(model=MODEL, messages=ASK, extra_body=read)
    assert "reads no" not in caplog.text
    unread: Any = {"chat_template_kwargs": {"thinking_budget": 5, "enable_thinking": True}}
    await client.chat.completions.create(model=MODEL, messages=ASK, extra_body=unread)
    assert "chat: the chat template reads no thinking_budget; ignoring them" in caplog.text
