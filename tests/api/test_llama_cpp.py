"""kinetic.llama_cpp.Llama: llama-cpp-python's shapes and defaults on SmolLM2, streams that add up to
the whole answer, and what it does not implement refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

import kinetic
from kinetic.llama_cpp import Llama
from tests.lora.adapter_file import SMOLLM2_ADAPTER, write_adapter

BERT = Path(__file__).resolve().parents[1] / "data" / "synthetic" / "bert" / "bert.gguf"
CHAT = [{"role": "user", "content": "Name three rivers."}]


@pytest.fixture(scope="module")
def llm(smollm2_path) -> Llama:
    return Llama(model_path=str(smollm2_path), n_ctx=256, seed=42, verbose=False)


def test_completion_shape_and_stream_add_up(llm):
    """create_completion returns llama-cpp-python's text_completion; its stream's texts join to the same
    greedy text and only the last chunk carries the finish reason."""
    out = llm("The capital of France is", max_tokens=8, temperature=0)
    assert set(out) == {"id", "object", "created", "model", "choices", "usage"} and out["object"] == "text_completion"
    choice = out["choices"][0]
    assert set(choice) == {"text", "index", "logprobs", "finish_reason"} and choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 8
    chunks = list(llm.create_completion("The capital of France is", max_tokens=8, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-2:] == [None, "length"]


def test_stop_and_echo(llm):
    """A stop string ends the text before it (finish 'stop'); echo puts the prompt in front."""
    full = llm("The capital of France is", max_tokens=12, temperature=0)["choices"][0]["text"]
    cut = full[3:6]
    out = llm("The capital of France is", max_tokens=12, temperature=0, stop=[cut], echo=True)
    assert out["choices"][0]["text"] == "The capital of France is" + full[: full.index(cut)]
    assert out["choices"][0]["finish_reason"] == "stop"


def test_chat_completion_shape_and_stream(llm, smollm2_path):
    """create_chat_completion answers through the template (Model.chat's text); the stream opens with
    the assistant role, carries the content, and closes with an empty delta and the finish reason."""
    reply = llm.create_chat_completion(messages=CHAT, max_tokens=10, temperature=0)
    assert reply["object"] == "chat.completion"
    message = reply["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"] == kinetic.Model(smollm2_path, n_ctx=256).chat(CHAT, max_tokens=10, temperature=0)
    chunks = list(llm.create_chat_completion(messages=CHAT, max_tokens=10, temperature=0, stream=True))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == message["content"]


def test_seeded_sampling_repeats(llm):
    """The constructor's seed (or a call's) gives the same sampled answer each time."""
    texts = {llm("Once upon a time", max_tokens=10)["choices"][0]["text"] for _ in range(2)}
    assert len(texts) == 1


def test_tokenize_round_trip_and_accessors(llm):
    """tokenize takes bytes and detokenize gives bytes back; n_ctx, token_bos and token_eos are the model's."""
    text = "Hello, world! Ünïcödé too."
    assert llm.detokenize(llm.tokenize(text.encode(), add_bos=False)).decode() == text
    assert llm.n_ctx() == 256 and (llm.token_bos(), llm.token_eos()) == (1, 2)
    with pytest.raises(TypeError, match="bytes"):
        llm.tokenize(text)


@pytest.mark.parametrize(("call", "name"), [
    (lambda m: m.create_chat_completion(messages=CHAT, tools=[{"type": "function"}]), "tools"),
    (lambda m: m.create_chat_completion(messages=CHAT, response_format={"type": "json_object"}), "response_format"),
    (lambda m: m.create_completion("x", logprobs=2), "logprobs"),
    (lambda m: m.create_completion("x", grammar="root ::= \"a\""), "grammar"),
    (lambda m: m.create_completion("x", mirostat_mode=2), "mirostat_mode"),
])
def test_what_it_does_not_implement_is_refused_by_name(llm, call, name):
    """Arguments that would change the answer and are not implemented raise NotImplementedError naming them."""
    with pytest.raises(NotImplementedError, match=name):
        call(llm)


def test_embeddings_need_embedding_true_and_have_openais_shape():
    """embed() on a Llama made without embedding=True is llama-cpp-python's RuntimeError; with it,
    create_embedding gives one vector per input in OpenAI's list shape, the Model's own vectors."""
    plain = Llama(model_path=str(BERT), verbose=False)
    with pytest.raises(RuntimeError, match="embedding=True"):
        plain.embed("a cat")
    llm = Llama(model_path=str(BERT), embedding=True, verbose=False)
    response = llm.create_embedding(["a cat", "a dog"])
    assert response["object"] == "list" and [d["index"] for d in response["data"]] == [0, 1]
    want = kinetic.Model(BERT).embed(["a cat", "a dog"], normalize=False)
    assert [d["embedding"] for d in response["data"]] == [[float(x) for x in v] for v in want]


def test_lora_path_merges_the_adapter(smollm2_path, tmp_path):
    """lora_path and lora_scale give Model(lora=[(path, scale)])'s answer."""
    adapter = write_adapter(smollm2_path, tmp_path / "a.gguf", SMOLLM2_ADAPTER)
    llm = Llama(model_path=str(smollm2_path), n_ctx=128, lora_path=str(adapter), lora_scale=0.5, verbose=False)
    want = kinetic.Model(smollm2_path, n_ctx=128, lora=[(adapter, 0.5)]).generate("The capital of France is",
                                                                                  max_tokens=8, temperature=0)
    assert llm("The capital of France is", max_tokens=8, temperature=0)["choices"][0]["text"] == want
