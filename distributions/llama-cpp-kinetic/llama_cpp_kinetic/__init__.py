"""llama-cpp-kinetic: puts shadow/ (which holds a `llama_cpp` package re-exporting kinetic.llama_cpp)
first on sys.path, so `import llama_cpp` loads Kinetic's. Run at interpreter start by
llama_cpp_kinetic.pth; does nothing else (it imports no Kinetic module until llama_cpp is imported)."""

import sys
from pathlib import Path

SHADOW = str(Path(__file__).resolve().parent / "shadow")
if SHADOW not in sys.path:
    sys.path.insert(0, SHADOW)
