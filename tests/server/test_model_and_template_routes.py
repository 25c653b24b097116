"""GET /v1/models/{id} (OpenAI's model object, 404 model_not_found for another id, through the openai
package) and llama-server's POST /apply-template (the prompt the chat route runs)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.live import openai_client_fixture, url_fixture

MODEL = "SmolLM2-135M-Instruct.Q4_1"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


url = url_fixture()
client = openai_client_fixture()


def test_model_by_id(client):
    """models.retrieve(the served name) is the entry /v1/models lists; another id raises
    NotFoundError with OpenAI's code model_not_found."""
    found = client.models.retrieve(MODEL)
    assert found.model_dump() == client.models.list().data[0].model_dump() and found.id == MODEL
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found" and missing.value.param == "model"


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["plain", "tools"])
def test_apply_template_is_the_chat_prompt(url, tools):
    """/apply-template answers the prompt /v1/chat/completions runs for the same body: its tokens
    are the chat's prompt_tokens (the tools' generic fallback included), the user's text is in it."""
    body = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    if tools:
        body["tools"] = tools
    prompt = httpx.post(url + "/apply-template", json=body, timeout=60).json()["prompt"]
    tokens = httpx.post(url + "/tokenize", json={"content": prompt, "add_special": True}, timeout=60).json()["tokens"]
    chat = httpx.post(url + "/v1/chat/completions", json={**body, "max_tokens": 1}, timeout=120).json()
    assert "What is the weather in Paris?" in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert len(tokens) == chat["usage"]["prompt_tokens"]
    assert ("get_weather" in prompt) == bool(tools)


def test_apply_template_errors_in_llama_servers_shape(url):
    """A body without messages is a 400 in llama-server's error shape (code, message, type)."""
    answer = httpx.post(url + "/apply-template", json={"prompt": "x"}, timeout=60)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == 400
