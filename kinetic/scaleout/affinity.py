"""A request's affinity key: the bytes that stay the same across the turns of one conversation.

Owns: reading the key from a raw request body, for every API the server has, without tokenizing
(the ingress has no model). Does not own the ring (routing.py).

A chat's key is its messages up to and including the first user message (the system prompt and the
opening question): turn 2 and 3 resend them first, so they hash like turn 1 and go to the replica
that holds turn 1's prompt state. Including the first user message spreads conversations that share
a system prompt over the replicas. A completion's key is the first PREFIX_BYTES of its prompt.
A request with neither (GET routes, token-id prompts, a body that is not JSON) has no key: it goes
to the least-loaded replica.
"""

from __future__ import annotations

import json

PREFIX_BYTES = 1024  # of a text prompt; past Warm Start's first grid points, short of most answers
CHAT_FIELDS = ("messages", "input")  # OpenAI/Ollama/Anthropic chats; the Responses API's input
PROMPT_FIELDS = ("prompt", "content")  # /v1/completions, /api/generate; llama-server's /completion


def affinity_key(body: bytes) -> bytes | None:
    """The key of a request body (None: no affinity)."""
    if not body:
        return None
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(request, dict):
        return None
    for name in CHAT_FIELDS:
        messages = request.get(name)
        if isinstance(messages, list) and messages:
            return _canonical([request.get("system"), _opening(messages)])
        if isinstance(messages, str) and messages:
            return _prefix(messages)
    for name in PROMPT_FIELDS:
        prompt = request.get(name)
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return _prefix(prompt)
    return None


def _opening(messages: list) -> list:
    """The messages up to and including the first user message."""
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return messages[: i + 1]
    return messages[:1]


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()[: 4 * PREFIX_BYTES]


def _prefix(text: str) -> bytes:
    return text.encode()[:PREFIX_BYTES]
