"""A real `kinetic serve` on SmolLM2, driven by the official openai package, plain HTTP (httpx) for
llama-server's routes, and Ollama's NDJSON; one server process for the whole module."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest

from tests.conftest import model_path
from tests.server.conftest import wait_until

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
RAW = "The capital of France is"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def greedy_chat(client):
    reply = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=8, temperature=0)
    return reply


def test_models_lists_the_served_model(client):
    """/v1/models lists one model, named after the file, with the server's context."""
    models = client.models.list().data
    assert [m.id for m in models] == [model_path("smollm2-135m").stem]
    assert models[0].model_extra["context_length"] == 512


def test_greedy_chat_equals_model_generate_and_kinetic_run(greedy_chat, model):
    """A greedy chat answer is token for token Model.generate's and `kinetic run`'s for the same prompt."""
    prompt = model.apply_chat_template(QUESTION, add_generation_prompt=True)
    expected = model.generate(prompt, max_tokens=8)
    assert greedy_chat.choices[0].message.content == expected
    run = subprocess.run([sys.executable, "-m", "kinetic.cli.main", "run", str(model_path("smollm2-135m")),
                          QUESTION[0]["content"], "--temp", "0", "-n", "8", "-c", "512", "-t", "2"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == expected + "\n"
    plain = subprocess.run(run.args + ["--off", "rad1"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and plain.stdout == run.stdout, plain.stderr
    assert greedy_chat.choices[0].finish_reason == "length"
    usage = greedy_chat.usage
    assert usage.completion_tokens == 8 and usage.prompt_tokens == len(model.tokenize(prompt, parse_special=True))
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_streamed_chat_equals_whole_chat_with_usage_last(client, greedy_chat):
    """Streamed deltas add up to the whole answer; include_usage adds a last chunk with the counts."""
    chunks = list(client.chat.completions.create(model="any", messages=QUESTION, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy_chat.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == greedy_chat.usage.total_tokens


def test_logprobs_are_those_of_the_raw_logits_streamed_or_not(client, greedy_chat):
    """logprobs with top_logprobs 2: each greedy token is its own top alternative, the same streamed or not."""
    whole = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=4, temperature=0,
                                           logprobs=True, top_logprobs=2)
    entries = whole.choices[0].logprobs.content
    assert len(entries) == 4
    for e in entries:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token
        assert e.logprob == e.top_logprobs[0].logprob <= 0 and e.top_logprobs[1].logprob <= e.logprob
    assert "".join(e.token for e in entries) == whole.choices[0].message.content
    stream = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=4, temperature=0,
                                            logprobs=True, top_logprobs=2, stream=True)
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]


REPEAT = [{"role": "user", "content": "Repeat this line twice: the quick brown fox jumps over the lazy dog."}]


def test_drafted_logprobs_are_the_plain_logits(client, model):
    """With RAD-1 drafting (the second request drafts from the first's answer), each token's logprob is
    log_softmax of the logits plain decoding computes for it: entries belong to the accepted tokens."""
    import numpy as np

    from kinetic.runtime.sampling import log_softmax

    for _ in range(2):
        reply = client.chat.completions.create(model="any", messages=REPEAT, max_tokens=32, temperature=0,
                                               logprobs=True, top_logprobs=1)
    entries = reply.choices[0].logprobs.content
    ids = model.tokenize(model.apply_chat_template(REPEAT, add_generation_prompt=True), parse_special=True)
    seq = model.engine.new_sequence()
    logits = model.engine.prefill(seq, ids)
    for e in entries:
        token = int(np.argmax(logits))
        assert e.token == model.detokenize([token]) or e.token == model.tokenizer.piece(token).decode(errors="replace")
        assert e.logprob == pytest.approx(float(log_softmax(logits)[token]), abs=1e-5)
        logits = model.engine.decode(seq, token)
    assert "".join(e.token for e in entries) == reply.choices[0].message.content


def test_stop_string_ends_the_answer_and_is_not_returned(client, greedy_chat):
    """A stop string found in the greedy answer cuts it there, with finish_reason stop."""
    full = greedy_chat.choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 2]
    reply = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=8, temperature=0, stop=[stop])
    assert reply.choices[0].message.content == full[:full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_same_seed_same_answer(client):
    """Sampling at temperature 1 with a seed gives the same answer every time."""
    answers = {client.chat.completions.create(model="any", messages=QUESTION, max_tokens=10, temperature=1.0,
                                              seed=1234).choices[0].message.content for _ in range(2)}
    assert len(answers) == 1


def test_refusals_are_400s_naming_the_field(client):
    """n other than 1, out-of-range fields and unknown response_format types are refused with a 400 naming them."""
    for kwargs, field in (({"n": 2}, "n"), ({"temperature": 101}, "temperature"), ({"top_logprobs": 21,
                          "logprobs": True}, "top_logprobs"), ({"response_format": {"type": "xml"}},
                                                               "response_format")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="any", messages=QUESTION, max_tokens=2, **kwargs)
        assert err.value.status_code == 400 and field in err.value.message
    with pytest.raises(openai.BadRequestError, match="not an embedding"):
        client.embeddings.create(model="any", input="hello")


def test_completions_greedy_equals_model_generate(client, model):
    """/v1/completions continues the raw prompt as Model.generate does, with legacy log-probabilities."""
    reply = client.completions.create(model="any", prompt=RAW, max_tokens=4, temperature=0, logprobs=2)
    assert reply.choices[0].text == model.generate(RAW, max_tokens=4)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert lp.text_offset[0] == 0 and all(len(t) == 2 for t in lp.top_logprobs)


def test_llama_server_completion(http, model):
    """/completion: greedy content equals Model.generate; streamed pieces add up to it; return_tokens,
    n_probs and stop_type as llama-server writes them."""
    body = {"prompt": RAW, "n_predict": 4, "temperature": 0, "return_tokens": True, "n_probs": 2}
    whole = http.post("/completion", json=body).json()
    assert whole["content"] == model.generate(RAW, max_tokens=4)
    assert whole["tokens"] == model.generate(RAW, max_tokens=4, return_tokens=True)
    assert whole["stop"] is True and whole["stop_type"] == "limit" and whole["tokens_predicted"] == 4
    assert [p["id"] for p in whole["completion_probabilities"]] == whole["tokens"]
    with http.stream("POST", "/completion", content=json.dumps({**body, "stream": True})) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["stop"] is True and all(not e["stop"] for e in events[:-1])
    ids = http.post("/completion", json={"prompt": whole["tokens"][:2], "n_predict": 1, "temperature": 0}).json()
    assert ids["tokens_evaluated"] == 2


def test_llama_server_tokenize_detokenize_props_slots_metrics(http, model):
    """/tokenize (llama-server's defaults), /detokenize, /props, /slots, /health and /metrics."""
    tokens = http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert tokens == model.tokenize("Hello world", add_special=False, parse_special=True)
    pieces = http.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens and "".join(p["piece"] for p in pieces) == "Hello world"
    assert http.post("/detokenize", json={"tokens": tokens}).json() == {"content": "Hello world"}
    props = http.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 4  # serve's --parallel
    slot = http.get("/slots").json()[0]
    assert slot["id"] == 0 and slot["n_ctx"] == 512 and "is_processing" in slot
    assert http.get("/health").json() == {"status": "ok"}
    metrics = http.get("/metrics").text
    for name in ("requests_total", "prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total",
                 "tokens_predicted_total", "tokens_predicted_seconds_total", "n_tokens_max", "prompt_tokens_seconds",
                 "predicted_tokens_seconds", "requests_processing", "requests_deferred"):
        assert f"\nllamacpp:{name} " in "\n" + metrics


def test_metrics_count_engine_passes(model):
    """n_decode_total is the engine's passes (prompt chunks, decode steps, drafted verifications), as
    llama-server counts its llama_decode calls, not the tokens."""
    from litestar.testing import TestClient

    from kinetic.server import ServerOptions, create_app

    def passes(c) -> int:
        line = next(x for x in c.get("/metrics").text.splitlines() if x.startswith("llamacpp:n_decode_total "))
        return int(float(line.split()[1]))

    with TestClient(create_app(model, ServerOptions()), base_url="http://127.0.0.1:8080") as c:
        before, engine_before = passes(c), model.engine.passes
        body = {"prompt": "a b c a b c a b c a b c a b", "n_predict": 12, "temperature": 0}
        assert c.post("/completion", json=body).json()["tokens_predicted"] == 12
        assert passes(c) - before == model.engine.passes - engine_before >= 2


def test_ollama_chat_streamed_and_whole(http, greedy_chat):
    """/api/chat answers as the OpenAI route does, whole or as NDJSON lines ending with done."""
    body = {"model": "any", "messages": QUESTION, "options": {"temperature": 0, "num_predict": 8}}
    whole = http.post("/api/chat", json={**body, "stream": False}).json()
    assert whole["message"]["content"] == greedy_chat.choices[0].message.content
    assert whole["done"] is True and whole["done_reason"] == "length" and whole["eval_count"] == 8
    with http.stream("POST", "/api/chat", json=body) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert "".join(line["message"]["content"] for line in lines) == whole["message"]["content"]
    assert lines[-1]["done"] is True and not any(line["done"] for line in lines[:-1])
    assert http.get("/api/version").json()["version"]
    assert http.get("/api/tags").json()["models"][0]["name"] == model_path("smollm2-135m").stem
    refused = http.post("/api/generate", json={"model": "any", "prompt": "hi", "context": [1, 2]})
    assert refused.status_code == 400 and "context" in refused.json()["error"]


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
ASK_A = [{"role": "user", "content": "Give me a JSON object with an integer a."}]
ASK_JSON = "Reply in JSON: what is the capital of France?"
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def test_json_schema_response_format_parses_and_validates(client):
    """response_format json_schema holds the answer to the schema: it parses, validates, and the grammar ends it."""
    reply = client.chat.completions.create(model="any", messages=ASK_A, max_tokens=24, temperature=0,
                                           response_format=_schema_format(SCHEMA))
    value = json.loads(reply.choices[0].message.content)
    assert set(value) == {"a"} and isinstance(value["a"], int)
    assert reply.choices[0].finish_reason == "stop"


def test_same_seed_same_answer_with_a_grammar(client):
    """Sampling at temperature 1 under a schema with a seed gives the same answer every time."""
    answers = {client.chat.completions.create(model="any", messages=ASK_A, max_tokens=24, temperature=1.0, seed=7,
                                              response_format=_schema_format(SCHEMA)).choices[0].message.content
               for _ in range(2)}
    assert len(answers) == 1


def test_json_object_response_format_and_ollama_format_json(client, http):
    """response_format json_object and Ollama's format "json" give JSON that parses (an object for Ollama)."""
    reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": ASK_JSON}],
                                           max_tokens=40, temperature=0, response_format={"type": "json_object"})
    json.loads(reply.choices[0].message.content)
    assert reply.choices[0].finish_reason == "stop"
    body = {"model": "any", "prompt": ASK_JSON, "format": "json", "stream": False,
            "options": {"temperature": 0, "num_predict": 40}}
    answer = http.post("/api/generate", json=body).json()
    assert isinstance(json.loads(answer["response"]), dict) and answer["done_reason"] == "stop"
    with http.stream("POST", "/api/chat", json={"model": "any", "messages": ASK_A, "format": SCHEMA,
                                                "options": {"temperature": 0, "num_predict": 24}}) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert isinstance(json.loads("".join(line["message"]["content"] for line in lines))["a"], int)


def test_gbnf_grammar_on_llama_server_completion(http):
    """/completion's grammar holds the answer to one of its strings, ended by the grammar (stop_type eos)."""
    body = {"prompt": "Is Paris in France? Answer:", "grammar": 'root ::= " yes" | " no"', "n_predict": 8,
            "temperature": 0}
    reply = http.post("/completion", json=body).json()
    assert reply["content"] in (" yes", " no") and reply["stop_type"] == "eos"
    schema = http.post("/completion", json={"prompt": "x", "json_schema": SCHEMA, "n_predict": 24,
                                            "temperature": 0}).json()
    assert isinstance(json.loads(schema["content"])["a"], int)


def test_invalid_grammars_and_schemas_are_400s_naming_the_problem(client, http):
    """A schema, grammar or format kinetic.grammar cannot compile is a 400 naming the field and the problem."""
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="any", messages=ASK_A, max_tokens=2,
                                       response_format=_schema_format({"type": "object", "properties": {
                                           "a": {"type": "integer", "multipleOf": 3}}}))
    assert "response_format" in err.value.message and "multipleOf" in err.value.message
    bad = http.post("/completion", json={"prompt": "x", "grammar": "root ::= nope"})
    assert bad.status_code == 400 and "grammar" in bad.json()["error"]["message"]
    assert "nope" in bad.json()["error"]["message"]
    bad = http.post("/api/chat", json={"model": "any", "messages": ASK_A, "format": {"type": "foo"}})
    assert bad.status_code == 400 and "format" in bad.json()["error"] and "foo" in bad.json()["error"]


def test_forced_tool_call_round_trip(client):
    """tool_choice required holds the reply to one call (SmolLM2's template has no call format: Llama 3's
    bare JSON), returned as tool_calls with arguments that parse, the same streamed; the result goes back."""
    reply = client.chat.completions.create(model="any", messages=WEATHER, tools=TOOLS, tool_choice="required",
                                           max_tokens=48, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    chunks = list(client.chat.completions.create(
        model="any", messages=WEATHER, tools=TOOLS, max_tokens=48, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    streamed = [c for chunk in chunks for c in chunk.choices[0].delta.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in streamed] == [("get_weather", call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    result = [{"role": "assistant", "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]
    after = client.chat.completions.create(model="any", messages=WEATHER + result, tools=TOOLS, max_tokens=4,
                                           temperature=0)
    assert after.choices[0].message.content


def test_grammar_with_a_forced_tool_call_is_400(client):
    """A forced tool call cannot be combined with response_format or grammar; a named function must be a tool."""
    for extra in ({"response_format": {"type": "json_object"}}, {"extra_body": {"grammar": 'root ::= "x"'}}):
        with pytest.raises(openai.BadRequestError, match="cannot be combined"):
            client.chat.completions.create(model="any", messages=WEATHER, tools=TOOLS, tool_choice="required",
                                           max_tokens=2, **extra)
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        client.chat.completions.create(model="any", messages=WEATHER, tools=TOOLS, max_tokens=2,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})


def test_client_disconnect_cancels_generation(http, server):
    """A client that leaves mid-stream frees the engine at its next token, long before its 400 tokens."""
    body = {"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as other, other.stream("POST", "/completion", json=body) as r:
        next(r.iter_lines())
    assert wait_until(lambda: not http.get("/slots").json()[0]["is_processing"], 10)
    assert http.get("/slots").json()[0]["next_token"][0]["n_decoded"] < 400


def test_abuse_script_short(server):
    """scripts/server_abuse.py --short passes against this server, which keeps answering after it."""
    proc = subprocess.run([sys.executable, "scripts/server_abuse.py", "--short", "--url", server.url],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_api_key_origin_and_host_checks(model):
    """With --api-key every route but /health needs the key (Bearer or X-Api-Key); pages from other sites
    and Host names other than this computer are refused; the engine thread stops with the app."""
    from litestar.testing import TestClient

    from kinetic.server import ServerOptions, create_app

    app = create_app(model, ServerOptions(api_key="sekrit"))
    with TestClient(app, base_url="http://127.0.0.1:8080") as c:
        assert c.get("/health").status_code == 200
        refused = c.get("/v1/models")
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer sekrit"}).status_code == 200
        assert c.get("/slots", headers={"X-Api-Key": "sekrit"}).status_code == 200
        key = {"X-Api-Key": "sekrit"}
        assert c.get("/v1/models", headers={**key, "Origin": "https://example.com"}).status_code == 403
        assert c.get("/v1/models", headers={**key, "Origin": "http://localhost:3000"}).status_code == 200
        assert c.get("/v1/models", headers={**key, "Host": "rebound.example.com"}).status_code == 403
        worker = app.state.kinetic.worker
        assert worker.running
    assert not worker.running
