"""The devices `--device` names, and what status lines call them (run, serve, bench, receipts).

Kept apart from the runtime so the command line can name devices without importing it.
"""

DEVICE_NAMES = {
    "cpu": "the CPU",
    "reference": "the CPU (reference interpreter)",
    "vulkan": "the Vulkan device",
    "cuda": "the CUDA GPU",
}


def resolve_device(name: str, say=None) -> str:
    """The device `--device name` runs on: `name` itself, except `auto`, which tries CUDA, then a
    Vulkan GPU (a CPU-type Vulkan device such as lavapipe is skipped: slower than the CPU path), then
    the CPU. Each device skipped is one line through `say` (default: stderr) saying why."""
    if name != "auto":
        return name
    if say is None:
        import sys

        def say(line: str) -> None:
            print(line, file=sys.stderr)

    from kinetic.codegen.cuda.device import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        return "cuda"
    say(f"auto: skipping CUDA: {reason}")
    try:
        from kinetic.codegen.vulkan.device import VulkanUnavailable, physical_devices, preferred_device
    except ImportError as e:  # numpy/gguf are always there; this is the package itself missing
        say(f"auto: skipping Vulkan: {e}")
        return "cpu"
    try:
        choice = preferred_device(physical_devices())
    except VulkanUnavailable as e:
        say(f"auto: skipping Vulkan: {e}")
        return "cpu"
    if choice is None:
        say("auto: skipping Vulkan: no device with Vulkan 1.2 or newer")
    elif choice.is_cpu:
        say(f"auto: skipping Vulkan device {choice.name}: a CPU-type device (lavapipe; --device cpu is faster)")
    else:
        return "vulkan"
    return "cpu"
