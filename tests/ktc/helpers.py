"""Helpers of the .ktc tests: the synthetic model's chat template, copying and flipping bytes of a
file, the full check `kinetic verify` makes, and its failure as the command line reports it."""

from __future__ import annotations

import shutil
from pathlib import Path

from kinetic.cli.main import main
from kinetic.ktc import KtcFile

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<a>{% endif %}")


def copy_of(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    return dst


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def full_check(path: Path) -> None:
    """What `kinetic verify` checks: the structure on open, then every section's hash."""
    ktc = KtcFile.open(path)
    for kind in ktc.entries:
        ktc.check_hash(kind)


def assert_verify_fails(path: Path, capsys, naming: str) -> None:
    capsys.readouterr()
    assert main(["verify", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("kinetic: ") and naming in err[0], err
