"""session.Session's fill policy (runtime/session.py).
"""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")


def test_runtime_packs_only_low_fill_requests():
    from bertfuse.runtime.session import tokens_to_pack as use_packed

    low = np.zeros((4, 32), np.int32)
    low[:, :6] = 1
    assert use_packed(low, 0.5)
    assert not use_packed(np.ones((4, 32), np.int32), 0.5)  # full batches stay padded
    empty_row = low.copy()
    empty_row[2] = 0
    assert not use_packed(empty_row, 0.5)  # a row without tokens cannot be packed
    assert not use_packed(None, 0.5)
