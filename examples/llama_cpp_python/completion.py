"""A text completion with llama-cpp-python's Llama (runs unchanged with llama-cpp-python or Kinetic's).

    python completion.py [MODEL.gguf]        (or MODEL_PATH=...; default ./models/model.gguf)
"""

import os
import sys

from llama_cpp import Llama

model_path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MODEL_PATH", "./models/model.gguf")
llm = Llama(model_path=model_path, n_ctx=2048, n_threads=2, seed=42, verbose=False)
out = llm("Q: Name the planets in the solar system. A:", max_tokens=32, stop=["Q:", "\n\n"], echo=True,
          temperature=0)
print(out["choices"][0]["text"])
print(out["usage"])
assert out["object"] == "text_completion" and out["choices"][0]["finish_reason"] in ("stop", "length")
