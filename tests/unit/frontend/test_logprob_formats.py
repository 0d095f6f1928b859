"""The logprobs formats' token fields: a chat token's `bytes` are its own (a token holding part
of a character: its text is U+FFFD, its bytes join with its neighbours' into the text), for a
byte-level BPE tokenizer (the default model's) and a byte-fallback one (SentencePiece style);
a completion's `top_logprobs` always holds the sampled token, as OpenAI's do."""

from __future__ import annotations

from pathlib import Path

import pytest

from armature.frontend.preprocess import Preprocessor
from armature.frontend.responses import chat_logprobs, completion_logprobs
from armature.protocols.engine import TokenLogprob

EMOJI_TEXT = "🌈 hi é"


@pytest.fixture(scope="module")
def smol(default_model_dir: Path) -> Preprocessor:
    return Preprocessor(default_model_dir)


def test_byte_level_tokens_bytes_join_into_the_text(smol: Preprocessor) -> None:
    ids = smol.encode(EMOJI_TEXT, add_special_tokens=False)
    texts = [smol.token_text(i) for i in ids]
    assert "\ufffd" in texts  # the emoji is split over tokens: their texts cannot show it
    items = [TokenLogprob(i, -0.5, [(i, -0.5)]) for i in ids]
    content = chat_logprobs(items, smol.token_text, smol.token_bytes)["content"]
    assert [e["token"] for e in content] == texts
    joined = bytes(b for entry in content for b in entry["bytes"])
    assert joined.decode("utf-8") == EMOJI_TEXT
    assert [e["top_logprobs"][0]["bytes"] for e in content] == [e["bytes"] for e in content]
    assert smol.token_bytes(ids[0]) == "🌈".encode()[: len(smol.token_bytes(ids[0]))]
    special = smol.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert smol.token_bytes(special) == b"<|im_start|>"


def test_every_whole_tokens_bytes_are_its_text(smol: Preprocessor) -> None:
    vocab_size = smol.decoder.get_vocab_size()
    for token_id in range(vocab_size):
        text = smol.token_text(token_id)
        if "\ufffd" not in text:
            assert smol.token_bytes(token_id) == text.encode("utf-8"), token_id


@pytest.fixture(scope="module")
def byte_fallback_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SentencePiece-style tokenizer: BPE with byte fallback pieces <0x00>..<0xFF>, "▁" for
    a space, and a decoder that turns the byte pieces back into bytes."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab |= {f"<0x{b:02X}>": 3 + b for b in range(256)}
    vocab |= {"▁": 259, "h": 260, "i": 261, "▁h": 262, "▁hi": 263}
    model = models.BPE(vocab, [("▁", "h"), ("▁h", "i")], unk_token="<unk>", byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Split("▁", "merged_with_next")
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    directory = tmp_path_factory.mktemp("byte_fallback")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(directory)
    return directory


def test_byte_fallback_tokens_bytes_are_their_byte(byte_fallback_dir: Path) -> None:
    pre = Preprocessor(byte_fallback_dir)
    ids = pre.encode("hi é", add_special_tokens=False)
    assert [pre.decoder.id_to_token(i) for i in ids] == ["▁hi", "▁", "<0xC3>", "<0xA9>"]
    assert [pre.token_bytes(i) for i in ids[2:]] == [b"\xc3", b"\xa9"]
    assert pre.token_text(ids[2]) == "\ufffd"


def test_a_completions_top_logprobs_hold_the_sampled_token(smol: Preprocessor) -> None:
    """logprobs 1: the most likely token, and the sampled one where it is another."""
    a, b = smol.encode(" the here", add_special_tokens=False)
    items = [TokenLogprob(b, -7.0, [(a, -1.5)]), TokenLogprob(a, -1.5, [(a, -1.5)])]
    logprobs = completion_logprobs(items, smol.token_text, [0, 5])
    assert logprobs["tokens"] == [" here", " the"]
    assert logprobs["top_logprobs"] == [{" the": -1.5, " here": -7.0}, {" the": -1.5}]
    no_top = completion_logprobs([TokenLogprob(b, -7.0, [])], smol.token_text, [0])  # logprobs 0
    assert no_top["top_logprobs"] == [{" here": -7.0}]
