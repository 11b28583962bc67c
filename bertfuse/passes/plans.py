"""Every pass plan: which passes run, in which order, for each form bertfuse writes.

    fusion_plan(precision, gelu_approximation)
                              the TF export -> the ORT-contrib encoder (convert, optimize, bench)
    lowering_plan()           the contrib encoder -> ai.bertfuse ops (`--ops bertfuse`)
    fp8_plan(x_amax)          the bertfuse dense ops -> FP8 weights (`--fp8`)
    packing_plan(on_kernels)  the padded model -> the packed form (`--packed`)

Callers run a plan with manager.run_passes; a later plan's report joins the first one's
(PipelineReport.join). Each plan is a fresh list of fresh passes: passes keep per-run state.
"""

from __future__ import annotations

from bertfuse.passes.base import Pass
from bertfuse.passes.cleanup import Cleanup
from bertfuse.passes.attention import AttentionFusion
from bertfuse.passes.bert_embed_layernorm import BertEmbedLayerNormFusion
from bertfuse.passes.bert_pooler import BertPoolerFusion
from bertfuse.passes.bertfuse_encoder import BertfuseKernels
from bertfuse.passes.choices import FlattenChoices, RestoreChoices
from bertfuse.passes.dense_fp32_output import DenseFp32Output
from bertfuse.passes.dense_gemm import DenseGemmFusion, GemmToMatMul
from bertfuse.passes.device_packing import PackingKernelsPass
from bertfuse.passes.einsum_matmul import EinsumToMatMul
from bertfuse.passes.embed_layernorm import EmbedLayerNormFusion
from bertfuse.passes.fast_gelu import FastGeluApproximation
from bertfuse.passes.fp16 import Fp16Pass
from bertfuse.passes.fp8_handoff import Fp8Handoff
from bertfuse.passes.fp8_weights import Fp8Weights
from bertfuse.passes.gelu import GeluFusion
from bertfuse.passes.hidden_3d import Hidden3DPass
from bertfuse.passes.layernorm import LayerNormFusion
from bertfuse.passes.packing import PackingPass
from bertfuse.passes.shape_from_inputs import ShapeFromInputs
from bertfuse.passes.shared_weights import SharedWeights
from bertfuse.passes.skip_layernorm import SkipLayerNormFusion
from bertfuse.passes.softmax_from_exp import SoftmaxFromExp
from bertfuse.passes.tied_weights import TiedWeights


def fusion_plan(precision: str, gelu_approximation: bool = False) -> list[Pass]:
    """The fusions, in the order they must run (later fusions match on earlier ones' output);
    fp16 converts the fused graph last. gelu_approximation: exact GELUs become FastGelu
    (passes/fast_gelu.py), right after the GELU fusion."""
    # The hand-written LayerNorm and softmax become ops first: the embedding, attention and
    # skip fusions match on LayerNormalization and Softmax.
    passes: list[Pass] = [FlattenChoices(), Cleanup(), EinsumToMatMul(), GemmToMatMul(),
                          LayerNormFusion(),
                          SoftmaxFromExp(), EmbedLayerNormFusion(), GeluFusion(),
                          *([FastGeluApproximation()] if gelu_approximation else []),
                          AttentionFusion(), SkipLayerNormFusion(), Cleanup(), ShapeFromInputs(),
                          Cleanup(), Hidden3DPass(), TiedWeights(), DenseGemmFusion(),
                          RestoreChoices(), Cleanup(), SharedWeights()]
    if precision == "fp16":
        passes += [Fp16Pass(), Cleanup(), SharedWeights()]
    return passes


def lowering_plan() -> list[Pass]:
    """The fused fp16 contrib encoder rewritten into ai.bertfuse ops."""
    return [BertfuseKernels(), BertEmbedLayerNormFusion(), BertPoolerFusion(), DenseFp32Output(),
            Cleanup()]


def fp8_plan(x_amax: dict[str, float], places: tuple[str, ...] | None = None) -> list[Pass]:
    """The bertfuse dense ops' weights in FP8 (at `places` only, passes/fp8_weights.PLACES;
    None: all); x_amax: max |X| per dense input (calibrated). Then each FP8 op's input in
    e4m3 from the op before (a dense op or the attention; at some places only, from an FP8
    op or the attention)."""
    return [Fp8Weights(x_amax, places), Fp8Handoff(from_fp16_dense=places is None), Cleanup()]


def packing_plan(on_kernels: bool) -> list[Pass]:
    """The packed form: packed on the device for a model on bertfuse kernels (BertAttention),
    else the contrib form's PackedAttention, packed by the runtime."""
    if on_kernels:
        return [PackingKernelsPass(), Cleanup()]

    return [PackingPass(), Cleanup()]
