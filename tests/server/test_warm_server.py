"""Warm Start through the server: a 5-turn conversation sent as whole histories gets bit for bit the
answers a server without Warm Start gives (greedy and seeded), with the reused prompt tokens
reported in every API's usage and in /metrics; /v1/prefill runs the conversation ahead without
changing the answer; a restarted server resumes from the states its predecessor wrote to disk."""

from __future__ import annotations

import httpx
import pytest

from kinetic.server.options import ServerOptions
from tests.conftest import model_path
from tests.runtime.test_warm import QUESTIONS, SYSTEM
from tests.server.conftest import ServeProcess
from tests.server.live import serving

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def warm_url():
    from kinetic.model import Model

    model = Model(model_path("smollm2-135m"), n_ctx=512, threads=2)
    with serving(model, ServerOptions(parallel=2)) as url:
        yield url


@pytest.fixture(scope="module")
def cold_url():
    from kinetic.model import Model

    model = Model(model_path("smollm2-135m"), n_ctx=512, threads=2, warm_start=False)
    with serving(model, ServerOptions(parallel=2)) as url:
        yield url


def _chat(url: str, messages: list[dict], sampling: dict, path: str = "/v1/chat/completions") -> dict:
    body = {"messages": messages, "max_tokens": MAX_TOKENS, **sampling}
    reply = httpx.post(url + path, json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _turns(url: str, sampling, turns: int = 5):
    """The conversation's replies, each turn sent as the whole history so far."""
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[turn]})
        reply = _chat(url, messages, sampling(turn))
        yield reply
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_conversation_through_the_server_warm_equals_cold(kind, warm_url, cold_url):
    """Each turn's answer equals the cold server's; turns 2-5 report cached prompt tokens (usage and
    timings agree), the cold server none."""
    def sampling(turn):
        return {"temperature": 0} if kind == "greedy" else {"temperature": 0.8, "top_k": 40, "seed": 50 + turn}

    for turn, (warm, cold) in enumerate(zip(_turns(warm_url, sampling), _turns(cold_url, sampling), strict=True)):
        assert warm["choices"][0]["message"] == cold["choices"][0]["message"], f"turn {turn + 1}"
        cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert warm["timings"]["cache_n"] == cached
        assert warm["timings"]["prompt_n"] == warm["usage"]["prompt_tokens"] - cached
        if turn:
            assert cached > 0, f"turn {turn + 1} reused nothing"


def test_other_apis_report_the_reused_tokens(warm_url):
    """A repeated prompt reports its reused tokens: /completion's timings.cache_n, Ollama's
    prompt_eval_count counting only what ran, /v1/completions' usage, and /metrics'
    prompt_tokens_cached_total."""
    prompt = SYSTEM + " Question: how deep is the harbour?"
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0}
    first = httpx.post(warm_url + "/completion", json=body, timeout=300).json()
    again = httpx.post(warm_url + "/completion", json=body, timeout=300).json()
    assert again["content"] == first["content"]
    assert again["timings"]["cache_n"] > 0 and again["timings"]["prompt_n"] == first["tokens_evaluated"] - \
        again["timings"]["cache_n"]
    ollama = httpx.post(warm_url + "/api/generate", json={"prompt": prompt, "raw": True, "stream": False,
                                                          "options": {"num_predict": 4, "temperature": 0}},
                        timeout=300).json()
    assert ollama["response"] == first["content"]
    assert 0 < ollama["prompt_eval_count"] < first["tokens_evaluated"]
    completion = httpx.post(warm_url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4,
                                                                "temperature": 0}, timeout=300).json()
    assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    metrics = httpx.get(warm_url + "/metrics", timeout=30).text
    line = next(x for x in metrics.splitlines() if x.startswith("llamacpp:prompt_tokens_cached_total "))
    assert int(float(line.split()[1])) > 0


def test_prefill_runs_ahead_and_the_answer_is_unchanged(warm_url, cold_url):
    """/v1/prefill of a conversation whose last message is still being written answers
    {"object": "prefill", "cached_tokens": N > 0}; the request that follows with the finished
    message reuses at least N tokens and gives the cold server's answer."""
    messages = [{"role": "system", "content": SYSTEM + " Answer in one sentence."},
                {"role": "user", "content": "Please tell me about the harbour fees for a small sailing boat"}]
    typed = [*messages[:1], {"role": "user", "content": messages[1]["content"][:-10]}]
    ahead = httpx.post(warm_url + "/v1/prefill", json={"messages": typed}, timeout=300)
    assert ahead.status_code == 200, ahead.text
    assert ahead.json()["object"] == "prefill" and ahead.json()["cached_tokens"] > 0
    warm = _chat(warm_url, messages, {"temperature": 0})
    cold = _chat(cold_url, messages, {"temperature": 0})
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= ahead.json()["cached_tokens"]


def test_restarted_server_resumes_from_disk(tmp_path, cold_url):
    """A server started on the cache directory an earlier server wrote resumes the conversation from
    its states (cached_tokens > 0 on its first request) and answers as the cold server does."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    first = ServeProcess("--cache-dir", str(tmp_path))
    try:
        reply = _chat(first.url, messages, {"temperature": 0})
    finally:
        first.stop()
    assert list(tmp_path.glob("*.kwarm")), "the first server wrote no state"
    messages += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                 {"role": "user", "content": QUESTIONS[1]}]
    second = ServeProcess("--cache-dir", str(tmp_path))
    try:
        warm = _chat(second.url, messages, {"temperature": 0})
    finally:
        second.stop()
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert warm["choices"][0]["message"] == _chat(cold_url, messages, {"temperature": 0})["choices"][0]["message"]


def test_prefill_cuts_the_prompt_before_the_last_word():
    """The prefill's text ends just before the last word of the last message (which may still grow);
    a message the template changed beyond recognition gives no prefill."""
    from kinetic.server.prefill_api import prefix_before_last_word

    text = "<|im_start|>user\nWhat does the second sec<|im_end|>\n<|im_start|>assistant\n"
    assert prefix_before_last_word(text, "What does the second sec") == "<|im_start|>user\nWhat does the second "
    assert prefix_before_last_word(text, "What does the second sec  ") == "<|im_start|>user\nWhat does the second "
    assert prefix_before_last_word(text, "single") is None
