"""vLLM's own offline `LLM.generate`, one prompt at a time (the batch the server sees), as a
subprocess of the parity test: stdin {"model", "engine", "prompts", "max_tokens"} ->
stdout one JSON line {"texts", "token_ids"} after a marker line."""

from __future__ import annotations

import json
import os
import sys

MARKER = "OFFLINE-RESULT "


def main() -> None:
    job = json.load(sys.stdin)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, os.sched_getaffinity(0))))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=job["model"], **job["engine"])
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])
    texts, token_ids = [], []
    for prompt in job["prompts"]:
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        texts.append(out.outputs[0].text)
        token_ids.append(list(out.outputs[0].token_ids))
    print(MARKER + json.dumps({"texts": texts, "token_ids": token_ids}), flush=True)


if __name__ == "__main__":
    main()
