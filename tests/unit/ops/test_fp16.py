"""float16 on the CPU EP: native kernels only (the others would re-test fp32 through Casts)."""

from __future__ import annotations

import numpy as np
import pytest

from bertfuse.ops import CONTRACTS
from unit.ops.test_layernorm import fp16_layernorm
from unit.ops.test_skip_layernorm import fp16_skip_layernorm

FP16_TESTS = {"SkipLayerNormalization": fp16_skip_layernorm, "LayerNormalization": fp16_layernorm}


@pytest.mark.parametrize("op_type", sorted(CONTRACTS))
def test_fp16_cpu(op_type: str, rng: np.random.Generator, seed: int) -> None:
    c = CONTRACTS[op_type]
    if not c.cpu_kernel_types:
        pytest.skip(f"{c.qualified_name}: ORT has no CPU kernel for it in any dtype (see test_gemm_fast_gelu)")
    if "float16" not in c.cpu_kernel_types:
        pytest.skip(
            f"{c.qualified_name}: ORT CPU registers no float16 kernel (only {', '.join(c.cpu_kernel_types)}). "
            "A float16 model still runs because ORT's InsertCastTransformer wraps the node in fp16<->fp32 "
            "Casts, but that would only re-test the fp32 kernel; fp16 numerics need a GPU EP."
        )
    FP16_TESTS[op_type](rng, seed)
