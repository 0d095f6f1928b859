"""`armature bench` given bad input: one line on stderr and exit code 2, found before the
first request (nothing to lose), never a traceback; and the server check it runs first
(reachable, serving --model) against fake transports."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fixed_server import FixedServer

from armature.bench.server import (
    ModelListError,
    ServerCheckError,
    ServerUnreachableError,
    choose_model,
    get_served_models,
)
from armature.cli.main import main


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A loopback port bound but not listening: every connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error `armature <argv>` exits 2 with (checked to be one line)."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits directly
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("armature: error: ") and err.count("\n") == 1, err
    return err


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


TRACE_LINE = '{"timestamp": %s, "input_length": 16, "output_length": 2, "hash_ids": [0]}\n'


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--url", "http://256.1.1.1:80"], "--url: not a valid URL: 'http://256.1.1.1:80'"),
        (["--url", "http://h:99999"], "--url: not a valid URL"),
        (["--url", "http://h/?x=1"], "without a query or fragment"),
        (["--len-spread", "nan"], "--len-spread: expected a fraction of the mean in [0, 1)"),
        (["--len-spread", "inf"], "--len-spread: expected a fraction"),
        (["--len-spread", "-1"], "got '-1'"),
        (["--len-spread", "5"], "got '5'"),
        (["--prefix-ratio", "nan"], "--prefix-ratio: expected a number in 0..1"),
        (["--warmup", "99999999999"], "--warmup: must be 0..10000"),
        (["--warmup", "-1"], "--warmup: must be 0..10000"),
        (["--num-requests", "999999999999"], "--num-requests: must be 1..1000000"),
        (["--input-len", "999999999"], "--input-len: must be 1..1048576"),
        (["--output-len", "999999999"], "--output-len: must be 1..1048576"),
        (["--concurrency", "10000000"], "--concurrency: must be 1..100000"),
        (["--multi-turn", "100000"], "--multi-turn: must be 1..1000"),
        (
            ["--sweep-concurrency", "0,1"],
            "--sweep-concurrency: expected comma-separated integers in 1..100000, got '0,1'",
        ),
        (["--sweep-concurrency", ","], "expected comma-separated integers in 1..100000, got ','"),
        (["--sweep-concurrency", "1,4,"], "got '1,4,'"),
        (["--sweep-rate", "1,nan"], "--sweep-rate: expected comma-separated positive numbers"),
    ],
)
def test_bad_flags_are_refused_when_parsed(
    flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--url", "http://127.0.0.1:1", *flags]
    assert fragment in one_line_error(argv, capsys)


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--num-requests", "1000000"], "256,000,512 prompt tokens to synthesize"),
        (["--rate", "1e-300"], "--rate 1e-300 spreads the requests over ~9.9e+301 s"),
        (["--sweep-rate", "4,1e-9"], "--rate 1e-09 spreads"),
        (["--sweep-concurrency", "1,2", "--trace", "t.jsonl"], "--trace brings its own schedule"),
        (["--prompts", "p.jsonl", "--multi-turn", "2"], "--prompts brings its own prompts"),
        (["--time-scale", "0.5"], "--time-scale is for --trace"),
        (["--trace", "t.jsonl", "--multi-turn", "2"], "--trace brings its own prompts"),
        (["--multi-turn", "2", "--prefix-groups", "2"], "give one of --multi-turn and --prefix"),
        (["--prefix-ratio", "0.9"], "--prefix-ratio is for --prefix-groups"),
        (["--prefix-groups", "2", "--len-spread", "0.5"], "--len-spread is for synthetic"),
        (["--trace", "t.jsonl", "--input-len", "64"], "--input-len is for synthetic prompts"),
        (["--trace", "t.jsonl", "--output-len", "64"], "--output-len is for prompts without"),
        # given at their defaults, still where they do nothing
        (["--trace", "t.jsonl", "--input-len", "256"], "--input-len is for synthetic prompts"),
        (["--trace", "t.jsonl", "--output-len", "128"], "--output-len is for prompts without"),
        (["--prefix-ratio", "0.5"], "--prefix-ratio is for --prefix-groups"),
        (["--time-scale", "1"], "--time-scale is for --trace"),
    ],
)
def test_workloads_out_of_bounds_are_refused_before_the_server_is_asked(
    flags: list[str], fragment: str, dead_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = one_line_error(["bench", "--url", dead_url, *flags], capsys)
    assert fragment in err and "cannot reach" not in err


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda d: write(d / "p.jsonl", b"\xff\xfe\x00garbage\n"), "is not UTF-8 text (byte 0xff"),
        (lambda d: d, "Is a directory"),
        (lambda d: d / "missing.jsonl", "No such file or directory"),
        (lambda d: write(d / "p.jsonl", "\n  \n"), "holds no prompts"),
        (lambda d: write(d / "p.jsonl", '{"prompt": "a", "max_tokens": Infinity}\n'), ":1: exp"),
        (lambda d: write(d / "p.jsonl", "[" * 100_000 + "\n"), ":1: expected"),
    ],
)
def test_a_bad_prompts_file_is_one_line(
    make: Callable[[Path], Path],
    fragment: str,
    tmp_path: Path,
    dead_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = make(tmp_path)
    err = one_line_error(["bench", "--url", dead_url, "--prompts", str(path)], capsys)
    assert fragment in err


@pytest.mark.parametrize(
    ("lines", "flags", "fragment"),
    [
        ("", [], "has no requests"),
        (TRACE_LINE % 0, [], "has 1 requests, none left to measure after --warmup 2"),
        (TRACE_LINE % 1e308 + TRACE_LINE % 0, ["--warmup", "0"], "arrivals span 1e+305 s"),
        (TRACE_LINE % 0 + TRACE_LINE % 9, ["--warmup", "0", "--time-scale", "1e308"], "inf s"),
        # a week of arrivals, then 1 s more
        (TRACE_LINE % 0 + TRACE_LINE % 604_801_000, ["--warmup", "0"], "more than a run may"),
    ],
)
def test_a_trace_with_nothing_to_measure_or_a_span_of_ages_is_refused(
    lines: str,
    flags: list[str],
    fragment: str,
    tmp_path: Path,
    dead_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    trace = write(tmp_path / "t.jsonl", lines)
    err = one_line_error(["bench", "--url", dead_url, "--trace", str(trace), *flags], capsys)
    assert fragment in err


def test_a_week_long_trace_is_taken_with_a_duration(
    tmp_path: Path, dead_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--duration-s bounds the wait: the run goes on (to the server check, here)."""
    trace = write(tmp_path / "t.jsonl", TRACE_LINE % 0 + TRACE_LINE % 1e308)
    argv = ["bench", "--url", dead_url, "--trace", str(trace), "--warmup", "0"]
    assert "cannot reach" in one_line_error([*argv, "--duration-s", "60"], capsys)


def test_a_report_path_that_cannot_be_a_directory_is_refused_before_the_server_is_asked(
    tmp_path: Path, dead_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = write(tmp_path / "report", "keep me")
    err = one_line_error(["bench", "--url", dead_url, "--report", str(existing)], capsys)
    assert f"--report {existing} is a file; give a directory" in err
    assert existing.read_text() == "keep me"
    under_file = existing / "sub"
    err = one_line_error(["bench", "--url", dead_url, "--report", str(under_file)], capsys)
    assert f"--report {under_file}: " in err and "Not a directory" in err


def test_the_report_check_leaves_no_directory_behind(
    tmp_path: Path, dead_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "a" / "b"
    err = one_line_error(["bench", "--url", dead_url, "--report", str(report)], capsys)
    assert "cannot reach" in err  # the report check passed, then the server check failed
    assert list(tmp_path.iterdir()) == []


def test_a_report_that_cannot_be_written_after_the_run_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "report.json").mkdir()  # passes the directory check, fails the write
    with FixedServer(0.01, 0.001, 3) as url:
        argv = ["bench", "--url", url, "--num-requests", "2", "--warmup", "0"]
        assert main([*argv, "--report", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "requests ok / sent" in out and "2 / 2" in out  # printed before the report
    assert err.splitlines()[-1].startswith(f"armature: error: --report {tmp_path}: cannot write")


@pytest.mark.parametrize("model", [[], ["--model", "m"]])
def test_an_unreachable_server_is_exit_2_before_the_run(
    model: list[str], dead_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = one_line_error(["bench", "--url", dead_url, "--num-requests", "2", *model], capsys)
    assert f"cannot reach {dead_url}" in err


def test_the_tokenizer_is_loaded_before_the_server_is_asked(
    default_model_dir: Path, dead_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory of a tokenizer's own files (no model config.json) is a tokenizer: it was
    refused as "--model needs a Hugging Face model dir"; one that does not load is one line,
    before the server is asked."""
    only = tmp_path / "tokenizer-only"
    only.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (only / name).write_bytes((default_model_dir / name).read_bytes())
    argv = ["bench", "--url", dead_url, "--num-requests", "2"]
    err = one_line_error([*argv, "--tokenizer", str(only)], capsys)
    assert f"cannot reach {dead_url}" in err  # past the tokenizer
    broken = tmp_path / "broken"
    broken.mkdir()
    write(broken / "tokenizer_config.json", "{}")
    err = one_line_error([*argv, "--tokenizer", str(broken)], capsys)
    assert err.startswith(f"armature: error: --tokenizer: cannot load the tokenizer in {broken}: ")
    err = one_line_error([*argv, "--tokenizer", str(tmp_path / "none")], capsys)
    assert err == f"armature: error: --tokenizer: model path {tmp_path / 'none'} does not exist\n"


def test_a_model_the_server_does_not_serve_is_exit_2_naming_what_it_serves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FixedServer(0.01, 0.001, 3) as url:
        argv = ["bench", "--url", url, "--model", "nope", "--report", str(tmp_path / "r")]
        err = one_line_error(argv, capsys)
    assert err == f"armature: error: --model 'nope': {url} does not serve it (serves 'fixed')\n"
    assert not (tmp_path / "r").exists()


def models_client(status: int, body: object) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        return httpx.Response(status, content=json.dumps(body).encode())

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--input-len", "9000"], "--input-len 9000 + --output-len 128 is 9,128 tokens"),
        (["--input-len", "64", "--output-len", "4096", "--multi-turn", "2"], "over 2 turns"),
        (["--input-len", "2000", "--len-spread", "0.5"], "(+0.5) is 3,192 tokens"),
    ],
)
def test_requests_longer_than_the_listed_context_are_refused_before_the_run(
    flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with FixedServer(0.01, 0.001, 3, max_model_len=2048) as url:
        err = one_line_error(["bench", "--url", url, "--num-requests", "2", *flags], capsys)
    assert fragment in err and "than the 2,048-token context the server lists" in err


def test_a_trace_is_refused_when_no_request_fits_the_context_and_noted_when_some_do_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = '{"timestamp": %d, "input_length": %d, "output_length": 8, "hash_ids": %s}\n'
    long = [line % (i, 4000, list(range(8))) for i in range(3)]
    short = [line % (i, 16, [0]) for i in (1, 2)]
    longs = write(tmp_path / "long.jsonl", "".join(long))
    mixed = write(tmp_path / "mixed.jsonl", "".join([long[0], *short]))
    with FixedServer(0.01, 0.001, 3, max_model_len=2048) as url:
        argv = ["bench", "--url", url, "--warmup", "0"]
        err = one_line_error([*argv, "--trace", str(longs)], capsys)
        assert f"every request of trace {longs} is longer than the 2,048-token context" in err
        # the run goes on (this server answers every request; a real one refuses the long)
        assert main([*argv, "--trace", str(mixed)]) == 0
    err = capsys.readouterr().err
    assert "note: 1 of the trace's 3 requests are longer than the 2,048-token context" in err


async def test_served_models_are_the_listings_ids_in_order_with_their_contexts() -> None:
    data = [{"id": "b", "max_model_len": 2048}, {"id": "a", "max_model_len": True}, {"id": 7}]
    async with models_client(200, {"object": "list", "data": data}) as client:
        served = await get_served_models(client, "http://s")
    assert list(served.items()) == [("b", 2048), ("a", None), ("7", None)]


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (404, {"detail": "Not Found"}, "http://s/v1/models answered 404"),
        (200, {"data": {"id": "m"}}, "http://s/v1/models answered no model list"),
        (200, ["m"], "http://s/v1/models answered no model list"),
    ],
)
async def test_an_answer_that_is_no_listing_is_a_model_list_error(
    status: int, body: object, message: str
) -> None:
    async with models_client(status, body) as client:
        with pytest.raises(ModelListError) as caught:
            await get_served_models(client, "http://s")
    assert str(caught.value) == message


async def test_a_url_httpx_refuses_is_unreachable_not_a_traceback() -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(ServerUnreachableError, match=r"cannot reach http://256\.1\.1\.1"):
            await get_served_models(client, "http://256.1.1.1")


def test_choose_model() -> None:
    assert choose_model("http://s", ["a", "b"], None) == "a"
    assert choose_model("http://s", ["a", "b"], "b") == "b"
    with pytest.raises(ServerCheckError, match=r"^http://s/v1/models lists no model$"):
        choose_model("http://s", [], None)
    many = [f"m{i}" for i in range(7)]
    with pytest.raises(ServerCheckError) as caught:
        choose_model("http://s", many, "x\ny")
    assert str(caught.value) == (
        "--model 'x\\ny': http://s does not serve it "
        "(serves 'm0', 'm1', 'm2', 'm3', 'm4' and 2 more)"
    )
