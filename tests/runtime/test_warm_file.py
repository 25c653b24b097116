"""Warm Start's state file format (kinetic/runtime/warm_file.py): an image decodes to the arrays
encoded, and an image whose header does not fit its bytes is refused. The disk tier's tests
(test_warm_disk.py) cover damaged files as the tier reads them."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kinetic.runtime import warm_file
from kinetic.runtime.warm_file import BadStateFile, decode, encode
from tests.runtime.test_warm_disk import same_bits, sample_state


def test_an_image_decodes_to_the_arrays_encoded():
    """decode(encode(arrays)) has the same names, dtypes, shapes and bits, as read-only arrays."""
    state = sample_state(3)
    back = decode("ab12", encode("ab12", state))
    assert back.keys() == state.keys()
    assert all(same_bits(back[name], array) and not back[name].flags.writeable for name, array in state.items())


def test_decode_refuses_an_array_outside_the_file():
    """A header whose array runs past the end of the file is refused, not read out of bounds."""
    image = encode("ab12", {"k": np.zeros(4, np.float32)})
    header_length = struct.unpack_from("<I", image, 12)[0]
    start = warm_file._PREFIX.size
    header = bytes(image[start:start + header_length]).replace(b'"shape":[4]', b'"shape":[9]')
    image[start:start + header_length] = header
    image[warm_file._DIGEST_AT:start] = warm_file._digest(image)
    with pytest.raises(BadStateFile):
        decode("ab12", image)
