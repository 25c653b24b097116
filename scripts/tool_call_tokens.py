"""Tokens per tool call on a model, greedy: forced calls (tool_choice "required") and the generic
fallback (tool_choice "auto" on a template without a call format), through an in-process server.

    python scripts/tool_call_tokens.py --model smollm2-135m
    python scripts/tool_call_tokens.py --model smollm2-135m --llama-whitespace   # llama.cpp's `space`

--llama-whitespace puts back llama.cpp's whole JSON whitespace rule (newlines and indentation) to
measure what the compact rule saves (docs/server.md, "Constrained output").
"""

from __future__ import annotations

import argparse
import json
import logging

QUESTIONS = ["What's the weather in Paris?", "Add 2 and 40.", "Is it raining in Tokyo right now?",
             "What is 17 plus 25?", "Tell me the temperature in Berlin in fahrenheit."]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
             "required": ["a", "b"]}}}]
# An earlier call in the conversation: a small model then calls in the generic format.
HISTORY = [{"role": "user", "content": "What is the weather in Berlin?"},
           {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
               "name": "get_weather", "arguments": '{"city": "Berlin"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "12 C, cloudy"},
           {"role": "assistant", "content": "It is 12 C and cloudy in Berlin."}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--llama-whitespace", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.INFO)
    if args.llama_whitespace:
        from kinetic.grammar import json_text

        json_text.PRIMITIVES["space"] = json_text.PRIMITIVES["markup-space"]
    from litestar.testing import TestClient

    from kinetic.hub import resolve_model
    from kinetic.model import Model
    from kinetic.server import create_app

    model = Model(resolve_model(args.model), n_ctx=1024)
    with TestClient(create_app(model), base_url="http://127.0.0.1:8080") as client:
        for mode, history, choice in (("forced", [], "required"), ("generic", HISTORY, "auto")):
            counts = []
            for question in QUESTIONS:
                body = {"messages": history + [{"role": "user", "content": question}], "tools": TOOLS,
                        "tool_choice": choice, "temperature": 0, "max_tokens": 200}
                answer = client.post("/v1/chat/completions", json=body).json()
                calls = answer["choices"][0]["message"].get("tool_calls") or []
                counts.append(answer["usage"]["completion_tokens"])
                print(mode, counts[-1], json.dumps([c["function"] for c in calls]) if calls else "no call")
            print(f"{mode}: {sum(counts) / len(counts):.1f} tokens per answer over {len(counts)} questions")


if __name__ == "__main__":
    main()
