"""CUDA code generation and runtime: kernels rendered as header-free CUDA C, compiled with NVRTC,
launched with CuPy, a whole model's passes recorded once and replayed as CUDA graphs.

Modules: `prelude` (the lockstep macro language every kernel is written in, for CUDA and for the
host), `kernel` (a kernel and a program's text), `quantize` (activation quantizers), `gemv`
(quantized GEMVs and row-tiled GEMMs), `pointwise` (RMS norm, elementwise ops, rotary), `attention`
(f16-cache attention), `gather` (embedding lookups, row gathers, KV cache stores), `renderer` (the
op -> kernels table `KERNELS`, the fused forms CUDA declares to the device phase, `FUSIONS`, and
its capability record, `CAPABILITIES`), `caps` (architectures and budgets as data), `nvrtc`
(compiling and the cache), `emulator` (running the same text on the host), `device` (is CUDA
usable; launching on a GPU), `backends` (the device calls the runtime makes, on a GPU or on the
emulation), `model` (the runtime: weights and the KV cache on the device, layer splits,
`unsupported`; `--device cuda` and `--device cuda-emulated`), `launch_order` (where each launch
runs, shared by every pass shape), `plan` (one pass shape's launches and buffers), `bench` (GEMV
and GEMM bandwidth on a GPU). Every kernel sums in the IR reference's order, so it agrees with
the reference interpreter bit for bit (RMS norm within one ulp). See docs/devices.md, "CUDA".
"""
