"""`kinetic quantize`: a GGUF file's weights written in another quantization, byte for byte as
llama-quantize writes them (without an importance matrix).

mixtures.py chooses each tensor's type, encoders.py (with kquants.py and kquant_search.py) encodes
blocks as ggml's reference quantizers do, gguf_out.py lays the file out, run.py drives it.
"""
