"""How a session serves: one small, validated options object instead of many parameters.

    Session(model, SessionOptions(max_batch=8, device="cpu"))
    Session(model, max_batch=8, device="cpu")            # the same: keywords build one

Checked on construction (a ConfigError names the first bad field); the sizes that depend on
the model (max_seq against its position table) are checked when a session reads it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from bertfuse.checks import check_int
from bertfuse.runtime.kernel_choice import check_kernels_option
from bertfuse.runtime.request_checks import (DEFAULT_BATCH_BUCKETS, DEFAULT_SEQ_BUCKETS,
                                             ConfigError)


@dataclass(frozen=True)
class SessionOptions:
    """max_seq None: the model's position table (512 where the model does not show it).

    pad_to_buckets / mask_variants 'auto': on for device='cuda' (CUDA graphs need the
    buckets' fixed shapes, and the narrow mask forms reach faster GPU kernels), off on the
    CPU, where a request runs fastest at its own shape through one ORT session.

    kernels: 'auto' (on CUDA, bertfuse's own ops where the library is here or builds, each
    layer covered and one batch on the device agrees with the contrib form; else the contrib
    form, with one line saying why), 'ort' (the model as written), 'bertfuse' (bertfuse's ops
    or an error). See runtime/kernel_choice.py.

    intra_op_threads: the threads of each ONNX Runtime session's intra-op pool (None: ORT's
    default, one per physical core); what a CPU session computes with."""

    max_batch: int = 32
    max_seq: int | None = None
    batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS
    seq_buckets: Sequence[int] = DEFAULT_SEQ_BUCKETS
    device: str = "cuda"
    cuda_graph: bool = True
    provider_options: Mapping[str, str] | None = None
    validate: bool = True
    pad_to_buckets: bool | str = "auto"
    mask_variants: bool | str = "auto"
    right_padded: str = "auto"
    variant_min_seq: int = 0
    pack_below_fill: float = 0.65
    token_steps: int = 8
    pinned: bool = True
    own_stream: bool = True
    kernels: str = "auto"
    intra_op_threads: int | None = None

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ConfigError(f"device must be 'cuda' or 'cpu', not {self.device!r}")
        check_kernels_option(self.kernels)
        if self.right_padded not in ("auto", "keylen", "keyseq"):
            raise ConfigError("right_padded must be 'auto', 'keylen' or 'keyseq', not "
                              f"{self.right_padded!r}")
        for name in ("cuda_graph", "validate", "pinned", "mask_variants", "own_stream",
                     "pad_to_buckets"):
            value, auto_ok = getattr(self, name), name in ("mask_variants", "pad_to_buckets")
            if not isinstance(value, (bool, np.bool_)) and not (auto_ok and _is_auto(value)):
                extra = ", or 'auto'" if auto_ok else ""
                raise ConfigError(f"{name} must be True or False{extra}, not {value!r}")
        if self.provider_options is not None and not isinstance(self.provider_options, Mapping):
            raise ConfigError(f"provider_options must be a mapping, not {self.provider_options!r}")
        fill = self.pack_below_fill
        if isinstance(fill, bool) or not isinstance(fill, numbers.Real) \
                or not math.isfinite(fill) or fill < 0:
            raise ConfigError("pack_below_fill must be a fraction of the batch's positions "
                              f"(0 packs nothing, above 1 everything), not {fill!r}")
        check_int("token_steps", self.token_steps, 1, error=ConfigError)
        if self.intra_op_threads is not None:
            check_int("intra_op_threads", self.intra_op_threads, 1, 1024, error=ConfigError)
        check_int("variant_min_seq", self.variant_min_seq, 0, error=ConfigError)
        if self.pad_to_buckets is False and self.device == "cuda":
            raise ConfigError("pad_to_buckets=False serves the CPU only: CUDA graphs need the "
                              "buckets' fixed shapes")

    @property
    def pad(self) -> bool:
        """Requests padded to buckets (else run at their own shape)."""
        return self.device == "cuda" if _is_auto(self.pad_to_buckets) else bool(self.pad_to_buckets)

    @property
    def variants(self) -> bool:
        """Mask-variant sessions made (they serve bucketed sessions only)."""
        wanted = self.device == "cuda" if _is_auto(self.mask_variants) else bool(self.mask_variants)
        return wanted and self.pad


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


def session_options(options: Any, overrides: Mapping[str, Any]) -> SessionOptions:
    """The options a session is built with: `options` (or the defaults) with keyword
    overrides; a ConfigError for anything else."""
    if options is None:
        return SessionOptions(**overrides)
    if not isinstance(options, SessionOptions):
        raise ConfigError(f"options must be a SessionOptions, not {options!r} (sizes and "
                          "flags go by keyword: Session(model, max_batch=8, ...))")
    return dataclasses.replace(options, **overrides) if overrides else options
