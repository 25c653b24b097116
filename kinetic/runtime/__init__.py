"""The runtime: token ids in, token ids out, on a compiled graph and a device's runner.

Owns: forward passes of rows over sequences' KV caches, prompt chunks, rollback (engine.py,
kv_cache.py); RAD-1's speculative decoding (drafting.py, speculative.py); sampling
(sampling/); the one generation loop every caller uses (generation.py) and the queue of answers
waiting for the engine (scheduler.py). Does not own text (the tokenizer and chat templates are the
frontend's), kernels (kinetic/codegen, reached through the Runner contract and the device registry),
HTTP (kinetic/server) or command lines (kinetic/cli); it imports neither of the last two
(tests/test_imports.py). docs/runtime.md describes it; docs/architecture.md places it.

    engine.py        Engine: passes of rows (token, sequence, position, parent) on a runner
    kv_cache.py      KVCache: one sequence's preallocated cache, committed and rolled back by length
    weights.py       GGUFWeights: the weights a runner reads, straight from the memory-mapped file
    generation.py    Generator / Generation: prefill, sampler and grammar, stops, log-probabilities
    scheduler.py     Scheduler: admission, slots, cancellation, the engine thread, counters
    convoy.py        which running answers' rows share the next pass (continuous batching)
    drafting.py      RAD-1's drafters and how many guessed tokens to verify
    speculative.py   SpeculativeDecoder: drafted decoding that yields plain decoding's tokens
    stop_strings.py  HoldBack: streamed text held back only where a stop string may still begin
    conformance.py   greedy tokens against llama.cpp's golden data, up to near-ties
    warm.py          WarmStore: Warm Start's prefix states in memory, resume and keep on the grid
    warm_costs.py    RestoreCosts: measured speeds, whether restoring beats recomputing
    warm_disk.py     DiskTier: Warm Start's states as checked files under the cache folder
    sampling/        llama.cpp's sampler chain: settings, filters, DRY, Mirostat, the Sampler
"""
