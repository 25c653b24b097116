"""`import llama_cpp` with llama-cpp-kinetic installed: Kinetic's Llama (kinetic.llama_cpp), for code
written for llama-cpp-python. The low-level bindings (llama_cpp.llama_cpp) are not provided."""

from kinetic.llama_cpp import LLAMA_DEFAULT_SEED, Llama

__all__ = ["LLAMA_DEFAULT_SEED", "Llama"]
__version__ = "0.3.16+kinetic"
