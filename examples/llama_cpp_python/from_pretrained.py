"""Download a model from the Hugging Face Hub and run it, with llama-cpp-python's Llama.from_pretrained
(runs unchanged with llama-cpp-python or Kinetic's; HF_ENDPOINT points it at another hub).

    python from_pretrained.py [REPO_ID] [FILENAME_GLOB]
"""

import sys

from llama_cpp import Llama

repo_id = sys.argv[1] if len(sys.argv) > 1 else "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
filename = sys.argv[2] if len(sys.argv) > 2 else "*q4_1.gguf"
llm = Llama.from_pretrained(repo_id=repo_id, filename=filename, verbose=False)
out = llm("The capital of France is", max_tokens=8, temperature=0)
print(out["choices"][0]["text"])
