"""PackedSession's host side (runtime/packed.py): CUDA is needed only to run.
"""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from bertfuse.ops.packing_layout import choose_shape, pack_into, packed_shapes  # noqa: E402
from bertfuse.runtime.request_checks import ConfigError  # noqa: E402
from support.runtime_common import POSITIONS  # noqa: E402
from unit.passes.test_packing import _mask  # noqa: E402


def test_packed_session_arguments_are_checked_before_cuda(ckpt_erf, convert_cached):
    """PackedSession runs on CUDA only, but its arguments are refused on any machine,
    before a session is made."""
    from bertfuse.runtime.packed import PackedSession

    conv = convert_cached(ckpt_erf, "--packed")
    assert conv.exit_code == 0, conv.report
    for kw, message in (({"max_batch": 0}, "max_batch must be at least 1"),
                        ({"max_seq": POSITIONS + 1}, "position table has 128 rows"),
                        ({"token_steps": 0}, "token_steps must be at least 1"),
                        ({"pinned": None}, "pinned must be True or False")):
        with pytest.raises(ConfigError, match=message):
            PackedSession(conv.onnx_path, **kw)


def test_packed_session_stages_a_request_into_its_bucket(rng):
    """PackedSession's host side (CUDA is needed only to run): a smaller request lands in
    the bucket's staging views zero-padded, with the packing of its mask."""
    from bertfuse.ops.packing_layout import capture_mask as _capture_mask
    from bertfuse.runtime.packed import PackedSession

    mask = _mask(rng, 3, 12, "mixed")
    ids = rng.integers(1, 100, (3, 12)).astype(np.int32)
    segs = np.ones((3, 12), np.int32)
    shape = choose_shape(packed_shapes(4, 16), 3, int(mask.sum()))
    views = {"input_ids": np.full((4, 16), 7, np.int32),
             "segment_ids": np.full((4, 16), 7, np.int32),
             "token_index": np.empty(shape.tokens, np.int32),
             "token_offset": np.empty((shape.rows, 16), np.int32),
             "cumulative_sequence_length": np.empty(shape.rows + 1, np.int32)}
    PackedSession._stage(views, {"input_ids": ids, "input_mask": mask, "segment_ids": segs},
                         shape)
    assert (views["input_ids"][:3, :12] == ids).all() and views["input_ids"][3:].sum() == 0
    assert views["input_ids"][:, 12:].sum() == 0 and views["segment_ids"][:, 12:].sum() == 0
    assert (views["segment_ids"][:3, :12] == 1).all()
    for name, value in pack_into(mask, shape).items():
        assert (views[name] == value).all(), name
    # Every token bucket can be captured with the runtime's capture mask.
    for b, s in ((1, 32), (20, 64), (32, 128), (32, 32), (8, 512)):
        for sh in packed_shapes(b, s):
            p = pack_into(_capture_mask(sh), sh)
            assert p["cumulative_sequence_length"][-1] == sh.tokens


def test_device_packed_staging_copies_the_padded_request(rng):
    """The device-packed form (token_bucket input): ids, segments and mask go zero-padded into
    one buffer; nothing is packed on the host and token_bucket has no place in the buffer."""
    from bertfuse.ops.packing_layout import choose_device_shape, device_shapes
    from bertfuse.runtime.packed import PackedSession, input_layout, is_device_packed

    inputs = ["input_ids", "segment_ids", "input_mask", "token_bucket"]
    assert is_device_packed(inputs) and not is_device_packed(["input_ids", "token_index"])
    mask = _mask(rng, 3, 12, "mixed")
    shape = choose_device_shape(device_shapes(4, 16), int(mask.sum()))
    assert shape.rows == 4 and shape.tokens >= mask.sum()
    layout = input_layout(inputs, shape)
    assert list(layout) == inputs[:3] and all(d == (4, 16) for _, d in layout.values())
    assert [at for at, _ in layout.values()] == [0, 64, 128]  # 64-byte aligned, no overlap
    views = {n: np.full(d, 7, np.int32) for n, (_, d) in layout.items()}
    ids = rng.integers(1, 100, (3, 12)).astype(np.int32)
    PackedSession._stage(views, {"input_ids": ids, "input_mask": mask}, shape)
    assert (views["input_ids"][:3, :12] == ids).all() and views["input_ids"][3:].sum() == 0
    assert (views["input_mask"][:3, :12] == mask).all()
    assert views["input_mask"][3:].sum() == 0 and views["input_mask"][:, 12:].sum() == 0
    assert not views["segment_ids"].any()  # none given: zeros


def test_device_packed_model_is_taken_as_packed(ckpt_erf, convert_cached):
    """`--packed --ops bertfuse` models are packed models: refused on the CPU for that
    reason (CUDA only), never as 'not a packed model'."""
    from bertfuse.runtime.packed import PackedSession

    conv = convert_cached(ckpt_erf, "--packed", "--ops", "bertfuse", "--precision", "fp16")
    assert conv.exit_code == 0, conv.report
    with pytest.raises(Exception, match="CUDA only"):
        PackedSession(conv.onnx_path, device="cpu")
    with pytest.raises(Exception, match="not a packed model"):
        PackedSession(convert_cached(ckpt_erf, "--precision", "fp16", "--ops",
                                     "bertfuse").onnx_path, device="cpu")
