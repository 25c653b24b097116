"""The frontend: from a GGUF file to a graph, a tokenizer and a chat template, every value checked.

Owns: reading GGUF files (gguf_file.py, gguf_metadata.py: header, metadata and tensor table checked
on load, tensor data memory-mapped), the facts `kinetic info` prints (model_info.py), the hyperparameters a family
reads (hparams.py: typed and range-checked), the family descriptors (families/) and the shared
builders they assemble layers from (blocks.py), lowering a file to a verified graph (lower.py),
the tokenizer (tokenizer/), chat templates rendered in budgeted renderer processes (chat.py,
template_pool.py, template_worker.py, template_sandbox.py) and reading a model's reply
(output_parsing.py). Does not own passes (kinetic/passes), the one compile step
(kinetic/compiler.py), kernels or the runtime.

    gguf_file.py        GGUFFile: the checked header, memory-mapped tensors
    gguf_metadata.py    Metadata: the checked key/value entries, arrays decoded on first use
    model_info.py       ModelInfo: what a file holds, from its header only (`kinetic info`)
    hparams.py          `key(...)`, `rope(...)`: hyperparameters read through their checked entries
    blocks.py           Blocks: embed, rms_norm, linear, attention, ffn, head (keyword builders)
    layers.py           decoder(...): the llama-like embed/layers/head loop most families are
    families/           one descriptor per architecture (llama, gemma3, qwen2, qwen3, ...) and the registry
    lower.py            lower(gguf): family -> verified Graph, every tensor placed
    tokenizer/          llama.cpp's tokenizers read from the file (BPE, SentencePiece, WordPiece)
    chat.py             ChatTemplate: messages -> prompt text, rendered within a budget
    template_pool.py    warm renderer processes, one render each at a time, killed on overrun
    template_worker.py  the renderer process itself, under limits set on itself
    template_sandbox.py the Jinja environment a template runs in
    output_parsing.py   reasoning and tool calls read from a reply (Qwen, Hermes, Llama 3, ... formats)
"""
