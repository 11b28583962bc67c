"""The Session users build: the padded session, plus the packed form of the same model for
requests that are mostly padding.

    request ─► checked ─► fill (kept tokens / batch x seq) < pack_below_fill and every row
                          keeps a token? ─► PackedSession (packed.py)
                                         └► else the padded buckets (padded.py)

Measured (docs/journal/packed.md): packing pays below ~70% fill at 3 layers b20 s64 and below
~85% at BERT-base b32 s128; full batches lose 9-11% packed.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx

from bertfuse.runtime.options import SessionOptions, session_options
from bertfuse.runtime.packed import PackedSession
from bertfuse.checks import check_flag
from bertfuse.runtime.request_checks import ConfigError, check_ranges
from bertfuse.runtime.padded import PaddedSession


class Session(PaddedSession):
    """`Session(model, max_batch=32, max_seq=128, device="cuda").run(ids, mask, segments)`;
    with `packed_model=` (CUDA only) low-fill requests go to the packed form."""

    def __init__(self, model: str | onnx.ModelProto, options: SessionOptions | None = None,
                 *, packed_model: str | onnx.ModelProto | None = None,
                 **overrides: Any) -> None:
        opts = session_options(options, overrides)
        super().__init__(model, opts)
        self.pack_below_fill = opts.pack_below_fill
        self.packed: PackedSession | None = None
        if packed_model is not None:
            try:
                self.packed = PackedSession(packed_model, opts)
            except BaseException:
                self.close()
                raise

    def warmup(self, buckets: Sequence[tuple[int, int]] | None = None, packed: bool = False,
               progress: Any = None) -> list[tuple[int, int]]:
        """PaddedSession.warmup; with packed=True also the packed model's token buckets for
        them (8 graphs per bucket, so by default they are captured on first use instead)."""
        check_flag("packed", packed, error=ConfigError)
        keys = super().warmup(buckets, progress)
        if packed and self.packed is not None:
            self.packed.warmup(keys, progress)
        return keys

    def _serve(self, arrays: dict[str, Any], names: list[str], to_host: bool) -> dict[str, Any]:
        if self.packed is not None:
            tokens = tokens_to_pack(arrays.get("input_mask"), self.pack_below_fill)
            if tokens is not None and all(isinstance(a, np.ndarray) for a in arrays.values()):
                if self.validate:  # the packed path stages them otherwise: check them now
                    check_ranges(arrays, self.facts, staged=True)
                batch, seq = arrays["input_ids"].shape
                out = self.packed.run_checked(arrays, to_host=to_host, outputs=names,
                                              tokens=tokens)
                return out if to_host else {"batch": batch, "seq": seq, **out}
        return super()._serve(arrays, names, to_host)

    def close(self) -> None:
        """PaddedSession.close, and the packed session's."""
        super().close()
        if getattr(self, "packed", None) is not None:
            self.packed.close()


def tokens_to_pack(mask: Any, below_fill: float) -> int | None:
    """The request's kept-token count when it should be packed: its fill (kept tokens / all
    positions) is under `below_fill` and every row keeps a token. None otherwise, and for
    device-resident masks, which stay on the padded path. Full batches are turned away
    after one count."""
    if not isinstance(mask, np.ndarray):
        return None
    tokens = int(np.count_nonzero(mask))
    if tokens >= below_fill * mask.size or not mask.any(axis=1).all():
        return None
    return tokens
