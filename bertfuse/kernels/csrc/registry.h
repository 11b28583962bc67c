// How ops join the ai.bertfuse domain. ops.cc's RegisterCustomOps creates the domain and calls
// one Add*Ops function per op family; each family file (dense_ops.cc, attention_op.cc) defines
// its function and adds its ops with bf::AddStaticOp<Op>(domain).
#pragma once

#include "common.h"

namespace bf {

constexpr const char* kDomain = "ai.bertfuse";
constexpr int kDomainVersion = 1;

// Records an op's name for bf_op_names() (ops.cc); called under RegisterCustomOps' lock.
void NoteOpName(const char* name);

// Adds one op object that lives for the whole process. ORT keeps raw OrtCustomOp pointers in
// every session created with the domain, so the op must outlive all of them: it is allocated
// once and deliberately never freed (no static destructor can run while ORT still uses it,
// e.g. during interpreter shutdown).
template <typename Op>
void AddStaticOp(Ort::CustomOpDomain& domain) {
    static Op* const op = new Op();
    domain.Add(op);
    NoteOpName(op->GetName());
}

}  // namespace bf

// Defined in dense_ops.cc: DenseBias, DenseBiasGelu, DenseBiasSkipLayerNorm (+ FP8 variants).
void AddDenseOps(Ort::CustomOpDomain& domain);
// Defined in attention_op.cc: BertAttention.
void AddAttentionOps(Ort::CustomOpDomain& domain);
// Defined in packed_ops.cc: PackTokens, PackedBertAttention, UnpackTokens.
void AddPackedOps(Ort::CustomOpDomain& domain);
// Defined in pooler_op.cc: BertPooler.
void AddPoolerOps(Ort::CustomOpDomain& domain);
// Defined in embed_op.cc: BertEmbedLayerNorm.
void AddEmbedOps(Ort::CustomOpDomain& domain);
