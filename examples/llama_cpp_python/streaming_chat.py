"""A streamed chat answer with llama-cpp-python's Llama (runs unchanged with llama-cpp-python or Kinetic's).

    python streaming_chat.py [MODEL.gguf]    (or MODEL_PATH=...; default ./models/model.gguf)
"""

import os
import sys

from llama_cpp import Llama

model_path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MODEL_PATH", "./models/model.gguf")
llm = Llama(model_path=model_path, n_ctx=2048, n_gpu_layers=-1, seed=42, verbose=False)
messages = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name three rivers in Europe."}]
text = ""
for chunk in llm.create_chat_completion(messages=messages, stream=True, max_tokens=48):
    delta = chunk["choices"][0]["delta"]
    if "content" in delta:
        text += delta["content"]
        print(delta["content"], end="", flush=True)
print()
reply = llm.create_chat_completion(messages=messages, max_tokens=48, temperature=0)
print(reply["choices"][0]["message"]["content"])
assert reply["choices"][0]["message"]["role"] == "assistant" and text
