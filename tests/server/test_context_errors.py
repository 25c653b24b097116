"""A prompt longer than the context, in each API's own words: OpenAI's context_length_exceeded (which
the openai package and litellm recognise), llama-server's exceed_context_size_error, Ollama's
message; and Ollama's num_ctx (a smaller window within the server's) with truncate."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.live import openai_client_fixture, url_fixture

LONG = "hello world " * 300  # about 600 tokens: more than the 512 of the test server
PASSED_BY_BYTES = "hello world " * 20_000  # refused from its byte length, before tokenizing
# The substrings litellm (1.110, litellm_core_utils/exception_mapping_utils.py,
# is_error_str_context_window_exceeded) looks for in an error to raise ContextWindowExceededError.
LITELLM_PHRASES = ("this model's maximum context length is", "exceeds the available context size")


url = url_fixture()
client = openai_client_fixture()


@pytest.mark.parametrize("text", [LONG, PASSED_BY_BYTES], ids=["counted", "by-bytes"])
def test_openai_routes_answer_context_length_exceeded(url, client, text):
    """/v1/chat/completions refuses with HTTP 400, code context_length_exceeded, type
    invalid_request_error and OpenAI's wording, as the openai package reads it."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="any", messages=[{"role": "user", "content": text}], max_tokens=4)
    error = refused.value
    assert error.status_code == 400 and error.code == "context_length_exceeded"
    assert error.type == "invalid_request_error" and error.body["n_ctx"] == 512
    assert "This model's maximum context length is 512 tokens" in error.message
    assert LITELLM_PHRASES[0] in str(error).lower()
    assert error.param == "messages"
    completion = httpx.post(url + "/v1/completions", json={"prompt": text}, timeout=120).json()["error"]
    assert completion["code"] == "context_length_exceeded" and completion["param"] == "prompt"


def test_litellm_raises_context_window_exceeded(url):
    """litellm's OpenAI-compatible client turns the refusal into ContextWindowExceededError (skipped
    where litellm is not installed: the phrase it matches is checked by the test above)."""
    litellm = pytest.importorskip("litellm")
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(model="openai/any", api_base=url + "/v1", api_key="unused", max_tokens=4,
                           messages=[{"role": "user", "content": LONG}], num_retries=0)


def test_llama_server_and_ollama_routes_keep_their_own_shapes(url):
    """/completion answers llama-server's exceed_context_size_error with n_prompt_tokens and n_ctx;
    /api/chat Ollama's {"error": "..."} naming the context length."""
    llama = httpx.post(url + "/completion", json={"prompt": LONG}, timeout=120)
    error = llama.json()["error"]
    assert llama.status_code == 400 and error["type"] == "exceed_context_size_error" and error["code"] == 400
    assert error["n_ctx"] == 512 and error["n_prompt_tokens"] > 512
    assert any(p in error["message"] for p in LITELLM_PHRASES)
    ollama = httpx.post(url + "/api/chat", json={"messages": [{"role": "user", "content": LONG}], "stream": False},
                        timeout=120)
    assert ollama.status_code == 400 and "longer than the context length" in ollama.json()["error"]


HISTORY = [{"role": "system", "content": "Be brief."},
           {"role": "user", "content": "Tell me about rivers. " * 20},
           {"role": "assistant", "content": "Rivers flow to the sea. " * 20},
           {"role": "user", "content": "Name one."}]


def test_ollama_num_ctx_truncates_old_messages_or_refuses(url):
    """options.num_ctx 100: the oldest messages are dropped (the system message and the last one kept)
    until the prompt fits, and prompt and answer stay within 100 tokens; with truncate false, or when
    the last message alone does not fit, a 400."""
    body = {"model": "any", "messages": HISTORY, "stream": False, "options": {"num_ctx": 100, "temperature": 0}}
    answer = httpx.post(url + "/api/chat", json=body, timeout=120).json()
    assert answer["done"] is True and answer["prompt_eval_count"] < 100
    assert answer["prompt_eval_count"] + answer["eval_count"] <= 100
    whole = httpx.post(url + "/api/chat", json={**body, "options": {"temperature": 0, "num_predict": 1}},
                       timeout=120).json()
    assert whole["prompt_eval_count"] > 100  # the same conversation fits the server's 512 untruncated
    refused = httpx.post(url + "/api/chat", json={**body, "truncate": False}, timeout=120)
    assert refused.status_code == 400 and "context length" in refused.json()["error"]
    alone = {**body, "messages": [{"role": "user", "content": "Tell me about rivers. " * 40}]}
    assert httpx.post(url + "/api/chat", json=alone, timeout=120).status_code == 400


def test_ollama_truncate_keeps_the_server_context_for_long_histories(url):
    """Without num_ctx, a history longer than the server's context is truncated to fit (Ollama's
    default), not refused; with truncate false it is refused."""
    long_history = [m for _ in range(6) for m in HISTORY[1:3]] + [HISTORY[3]]
    body = {"model": "any", "messages": long_history, "stream": False, "options": {"num_predict": 2}}
    answer = httpx.post(url + "/api/chat", json=body, timeout=120)
    assert answer.status_code == 200 and answer.json()["prompt_eval_count"] < 512
    refused = httpx.post(url + "/api/chat", json={**body, "truncate": False}, timeout=120)
    assert refused.status_code == 400
    generate = httpx.post(url + "/api/generate", json={"prompt": LONG, "stream": False, "raw": True,
                                                         "options": {"num_ctx": 64}}, timeout=120)
    assert generate.status_code == 400 and json.loads(generate.text)["error"]
