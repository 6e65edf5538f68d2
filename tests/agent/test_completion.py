"""Completion runners: Ollama through the real `ollama` client against OllamaDouble, and the
transformers backend directly on a tiny random-weight LM."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ollama
import pytest
import pytest_asyncio

from minions.agents.macos.runners.base import Interrupted, PermanentError, RunnerError
from minions.agents.macos.runners.completion import CompletionParams
from minions.agents.macos.runners.ollama_completion import OllamaCompletionRunner
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.agents.macos.runners.transformers_completion import TransformersCompletionRunner, build_prompt
from tests.agent.factories import subtask
from tests.agent.local_http import free_port
from tests.agent.ollama_double import OllamaDouble

RECORDS: list[dict[str, Any]] = [
    {"id": "p1", "prompt": "Why do idle laptops make a good cloud?"},
    {"id": "m1", "messages": [{"role": "user", "content": "What is a lease token?"}]},
    {"id": 3, "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]},
]


@pytest_asyncio.fixture(scope="module")
async def double(tiny_lm_dirs: dict[str, Path]) -> AsyncIterator[OllamaDouble]:
    server = OllamaDouble(tiny_lm_dirs["plain"], models=["tiny:latest", "llama3.2:1b"], pullable=["tiny:pulled"])
    await server.start()
    yield server
    await server.stop()


async def test_ollama_runner_advertises_local_models(double: OllamaDouble) -> None:
    runner = OllamaCompletionRunner(double.url)
    assert await runner.advertised_models() == ["tiny:latest", "llama3.2:1b", "tiny"]
    out = await runner.run(subtask("completion", "tiny", {"max_tokens": 2}), RECORDS[:1])
    assert out[0]["usage"]["completion_tokens"] == 2


async def test_ollama_runner_prompt_and_chat(double: OllamaDouble) -> None:
    double.requests.clear()
    runner = OllamaCompletionRunner(double.url)
    params = {"temperature": 0.7, "max_tokens": 6, "seed": 42, "system": "You are a minion."}
    out = await runner.run(subtask("completion", "tiny:latest", params, 3), RECORDS)

    assert [o["id"] for o in out] == ["p1", "m1", 3]
    for o in out:
        assert set(o) == {"id", "text", "usage"} and isinstance(o["text"], str)
        assert o["usage"]["prompt_tokens"] > 0 and 0 < o["usage"]["completion_tokens"] <= 6
    paths = [p for p, _ in double.requests]
    assert paths == ["/api/generate", "/api/chat", "/api/chat"]
    generate, chat, chat_own_system = (b for _, b in double.requests)
    assert generate["system"] == "You are a minion." and generate["prompt"] == RECORDS[0]["prompt"]
    assert generate["stream"] is False and chat["stream"] is False
    assert generate["options"] == {"temperature": 0.7, "num_predict": 6, "seed": 42}
    assert chat["messages"][0] == {"role": "system", "content": "You are a minion."}
    assert chat_own_system["messages"][0] == {"role": "system", "content": "Be terse."}  # its own stays

    again = await runner.run(subtask("completion", "tiny:latest", params, 3), RECORDS)
    assert again == out  # seeded: the same text twice


async def test_ollama_requests_overlap_and_keep_input_order(double: OllamaDouble) -> None:
    records = [{"id": i, "prompt": f"Record {i}: why are idle laptops useful?"} for i in range(7)]
    params = {"temperature": 0, "max_tokens": 4}
    sequential = await OllamaCompletionRunner(double.url).run(subtask("completion", "tiny", params, 7), records)
    double.reset_counts()
    double.delay_s = 0.3  # every answer takes a while: requests sent together are in flight together
    try:
        parallel = await OllamaCompletionRunner(double.url, parallel=3).run(
            subtask("completion", "tiny", params, 7), records
        )
    finally:
        double.delay_s = 0.0
    assert double.max_in_flight == 3  # never more than asked, and really concurrent
    assert parallel == sequential  # same answers, in input order
    assert [o["id"] for o in parallel] == list(range(7))


async def test_cancelling_parallel_ollama_requests_is_immediate(double: OllamaDouble) -> None:
    records = [{"id": i, "prompt": f"Record {i}"} for i in range(10)]
    double.reset_counts()
    double.delay_s = 30.0  # no answer would come before the test times out
    try:
        runner = OllamaCompletionRunner(double.url, parallel=4)
        task = asyncio.create_task(runner.run(subtask("completion", "tiny", {"max_tokens": 2}, 10), records))
        for _ in range(1000):
            if double.in_flight == 4:
                break
            await asyncio.sleep(0.01)
        assert double.in_flight == 4
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        for _ in range(200):  # the server sees the connections close and drops the requests
            if double.in_flight == 0:
                break
            await asyncio.sleep(0.05)
    finally:
        double.delay_s = 0.0
    assert double.in_flight == 0 and double.answered == 0
    assert len(double.requests) == 4  # no request was sent after the cancel


async def test_parallel_requests_pull_a_missing_model_once(tiny_lm_dirs: dict[str, Path]) -> None:
    server = OllamaDouble(tiny_lm_dirs["plain"], models=[], pullable=["tiny:fresh"])
    await server.start()
    try:
        runner = OllamaCompletionRunner(server.url, allow_pull=True, parallel=3)
        out = await runner.run(subtask("completion", "tiny:fresh", {"max_tokens": 2}, 3), RECORDS)
    finally:
        await server.stop()
    assert [o["id"] for o in out] == ["p1", "m1", 3]
    assert [p for p, _ in server.requests].count("/api/pull") == 1


async def test_double_streams_like_ollama(double: OllamaDouble) -> None:
    client = ollama.AsyncClient(host=double.url)
    parts = [
        p
        async for p in await client.generate(
            model="tiny:latest", prompt="Hi", stream=True, options={"num_predict": 4, "temperature": 0}
        )
    ]
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert parts[-1].eval_count == 4


async def test_missing_model_is_permanent_unless_pull_is_allowed(double: OllamaDouble) -> None:
    no_pull = OllamaCompletionRunner(double.url)
    with pytest.raises(PermanentError, match="--allow-pull"):
        await no_pull.run(subtask("completion", "tiny:pulled"), RECORDS[:1])
    double.requests.clear()
    puller = OllamaCompletionRunner(double.url, allow_pull=True)
    out = await puller.run(subtask("completion", "tiny:pulled", {"max_tokens": 3}), RECORDS[:1])
    assert out[0]["usage"]["completion_tokens"] == 3
    assert [p for p, _ in double.requests] == ["/api/generate", "/api/pull", "/api/generate"]
    with pytest.raises(PermanentError, match="could not pull"):
        await puller.run(subtask("completion", "nope:1b"), RECORDS[:1])


async def test_ollama_down_is_retryable() -> None:
    runner = OllamaCompletionRunner(f"http://127.0.0.1:{free_port()}")
    assert await runner.advertised_models() == []
    with pytest.raises(RunnerError) as err:
        await runner.run(subtask("completion", "tiny:latest"), RECORDS[:1])
    assert err.value.retryable and "not reachable" in str(err.value)


@pytest.mark.parametrize(
    ("params", "records"),
    [
        ({"temperature": -1}, RECORDS[:1]),
        ({"max_tokens": "many"}, RECORDS[:1]),
        ({}, [{"id": 1}]),
        ({}, [{"id": 1, "messages": []}]),
        ({}, [{"id": 1, "messages": [{"role": "user"}]}]),
    ],
)
async def test_bad_params_and_records_are_permanent(
    double: OllamaDouble, params: dict[str, Any], records: list[dict[str, Any]]
) -> None:
    with pytest.raises(PermanentError):
        await OllamaCompletionRunner(double.url).run(subtask("completion", "tiny:latest", params), records)


# -- transformers backend ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm_runner() -> TransformersCompletionRunner:
    return TransformersCompletionRunner(TorchSettings(device="cpu", threads=2))


async def test_transformers_seeded_sampling_is_reproducible(
    lm_runner: TransformersCompletionRunner, tiny_lm_dirs: dict[str, Path]
) -> None:
    model = str(tiny_lm_dirs["plain"])
    params = {"temperature": 1.0, "max_tokens": 12, "seed": 7}
    first = await lm_runner.run(subtask("completion", model, params, 3), RECORDS)
    second = await lm_runner.run(subtask("completion", model, params, 3), RECORDS)
    other = await lm_runner.run(subtask("completion", model, {**params, "seed": 8}, 3), RECORDS)
    assert first == second
    assert [o["text"] for o in first] != [o["text"] for o in other]
    assert [o["id"] for o in first] == ["p1", "m1", 3]
    assert all(0 < o["usage"]["completion_tokens"] <= 12 for o in first)


async def test_transformers_usage_counts_tokens(
    lm_runner: TransformersCompletionRunner, tiny_lm_dirs: dict[str, Path]
) -> None:
    from transformers import AutoTokenizer

    model = str(tiny_lm_dirs["plain"])
    tokenizer = AutoTokenizer.from_pretrained(model)
    out = await lm_runner.run(subtask("completion", model, {"temperature": 0, "max_tokens": 5}), RECORDS[:1])
    assert out[0]["usage"]["prompt_tokens"] == len(tokenizer(RECORDS[0]["prompt"])["input_ids"])
    assert out[0]["usage"]["completion_tokens"] <= 5
    greedy = await lm_runner.run(subtask("completion", model, {"temperature": 0, "max_tokens": 5}), RECORDS[:1])
    assert greedy == out


def one_at_a_time(model_dir: Path, records: list[dict[str, Any]], max_tokens: int) -> list[str]:
    """Plain transformers, one record per `generate` call, greedy: the reference for batching."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).float().eval()
    texts = []
    with torch.inference_mode():
        for record in records:
            text, special = build_prompt(tokenizer, record, None)
            encoded = tokenizer(text, return_tensors="pt", add_special_tokens=special)
            out = model.generate(
                **encoded, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
            new = out[0, encoded["input_ids"].shape[1] :].tolist()
            eos = model.generation_config.eos_token_id
            texts.append(tokenizer.decode(new[: new.index(eos) + 1] if eos in new else new, skip_special_tokens=True))
    return texts


@pytest.mark.parametrize("batch_size", [1, 4, 64])
async def test_batched_greedy_generation_equals_one_at_a_time(tiny_lm_dirs: dict[str, Path], batch_size: int) -> None:
    # Prompts of very different lengths: batches are left-padded, some heavily.
    records: list[dict[str, Any]] = [
        {"id": i, "prompt": " ".join(["idle laptop embeds text"] * (1 + (i * 7) % 11)) + f" {i}"} for i in range(13)
    ]
    records.append({"id": "chat", "messages": [{"role": "user", "content": "What is a lease token?"}]})
    model = tiny_lm_dirs["plain"]
    runner = TransformersCompletionRunner(TorchSettings(device="cpu", threads=2, generation_batch_size=batch_size))
    try:
        out = await runner.run(subtask("completion", str(model), {"temperature": 0, "max_tokens": 12}, 14), records)
    finally:
        await runner.aclose()
    assert [o["id"] for o in out] == [r["id"] for r in records]
    assert [o["text"] for o in out] == one_at_a_time(model, records, 12)
    assert len({o["usage"]["prompt_tokens"] for o in out}) > 5  # the lengths really differ


async def test_transformers_chat_template(
    lm_runner: TransformersCompletionRunner, tiny_lm_dirs: dict[str, Path]
) -> None:
    model = str(tiny_lm_dirs["chat"])
    out = await lm_runner.run(subtask("completion", model, {"max_tokens": 4, "seed": 1}, 3), RECORDS)
    assert len(out) == 3 and all(o["usage"]["completion_tokens"] <= 4 for o in out)


def test_build_prompt_with_and_without_template(tiny_lm_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(tiny_lm_dirs["plain"])
    chat = AutoTokenizer.from_pretrained(tiny_lm_dirs["chat"])
    assert build_prompt(plain, {"prompt": "Hello"}, None) == ("Hello", True)
    assert build_prompt(plain, {"prompt": "Hello"}, "Sys") == ("Sys\n\nHello", True)
    assert build_prompt(plain, RECORDS[1], "Sys") == ("system: Sys\nuser: What is a lease token?\nassistant:", True)
    assert build_prompt(chat, RECORDS[1], None) == ("<|user|>What is a lease token?\n<|assistant|>", False)
    assert build_prompt(chat, {"prompt": "Hello"}, "Sys") == ("<|system|>Sys\n<|user|>Hello\n<|assistant|>", False)


async def test_transformers_generation_stops_when_asked(
    lm_runner: TransformersCompletionRunner, tiny_lm_dirs: dict[str, Path]
) -> None:
    model = str(tiny_lm_dirs["plain"])
    stop = threading.Event()
    stop.set()
    with pytest.raises(Interrupted):
        await asyncio.to_thread(lm_runner.generate, model, RECORDS, CompletionParams(max_tokens=4), stop)
    long = [{"id": i, "prompt": "Tell me everything."} for i in range(50)]
    task = asyncio.create_task(lm_runner.run(subtask("completion", model, {"max_tokens": 500}, 50), long))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)


async def test_transformers_unknown_model_is_permanent(lm_runner: TransformersCompletionRunner) -> None:
    with pytest.raises(PermanentError, match="unknown completion model"):
        await lm_runner.run(subtask("completion", "/no/such/model"), RECORDS[:1])
