"""The devices `--device` names, and what status lines call them (run, serve, bench, receipts).

Kept apart from the runtime so the command line can name devices without importing it.
"""

DEVICE_NAMES = {
    "cpu": "the CPU",
    "reference": "the CPU (reference interpreter)",
    "vulkan": "the Vulkan device",
    "cuda": "the CUDA GPU",
}
