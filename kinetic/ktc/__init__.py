""".ktc files: one file holding a compiled model, every byte of it hashed (docs/FORMAT.md).

Owns: the byte layout (layout.py), reading with every check (reader.py), writing all or nothing
(writer.py), the GGUF model as weights, tokenizer and chat template sections (gguf_sections.py),
the profile (profile.py), Ed25519 key files (keys.py), making a file from a compiled model
(build.py) and loading one to run (load.py). Does not own lowering, passes or running a model.
"""

from kinetic.ktc.layout import ALIGN, MAGIC, VERSION, Kind
from kinetic.ktc.reader import KtcError, KtcFile, is_ktc

__all__ = ["ALIGN", "MAGIC", "VERSION", "Kind", "KtcError", "KtcFile", "is_ktc"]
