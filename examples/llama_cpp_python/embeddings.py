"""Embeddings with llama-cpp-python's Llama (runs unchanged with llama-cpp-python or Kinetic's).

    python embeddings.py [EMBEDDING_MODEL.gguf]   (or MODEL_PATH=...; default ./models/embedding.gguf)
"""

import math
import os
import sys

from llama_cpp import Llama

model_path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MODEL_PATH", "./models/embedding.gguf")
llm = Llama(model_path=model_path, embedding=True, verbose=False)
vector = llm.embed("a cat sat on the mat")
print(len(vector), vector[:4])
response = llm.create_embedding(["a cat", "a dog"])
a, b = (item["embedding"] for item in response["data"])
dot = sum(x * y for x, y in zip(a, b, strict=True))
cosine = dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))
print(f"cosine(a cat, a dog) = {cosine:.3f}; usage {response['usage']}")
assert response["object"] == "list" and len(response["data"]) == 2
