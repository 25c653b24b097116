"""Tokenize and detokenize with llama-cpp-python's Llama (runs unchanged with llama-cpp-python or Kinetic's).

    python tokenize_roundtrip.py [MODEL.gguf]  (or MODEL_PATH=...; default ./models/model.gguf)
"""

import os
import sys

from llama_cpp import Llama

model_path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MODEL_PATH", "./models/model.gguf")
llm = Llama(model_path=model_path, verbose=False)
text = "Hello, world! Tokenizers split text into pieces."
tokens = llm.tokenize(text.encode("utf-8"), add_bos=False)
back = llm.detokenize(tokens).decode("utf-8")
print(len(tokens), tokens[:8], repr(back))
print("context", llm.n_ctx(), "bos", llm.token_bos(), "eos", llm.token_eos())
assert back == text
