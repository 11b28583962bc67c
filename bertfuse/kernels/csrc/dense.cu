// The dense ops' forward (dense.h): the op's steps, the sm_90a-or-cuBLASLt choice and
// DenseBiasSkipLayerNorm's split-K form, each timed once per shape and kept in a ChoiceCache
// (gemm_tuner.h). Every path is asked whether it can run (a can_implement) before it runs.
#include "dense.h"

#include <cstdio>
#include <functional>

#include "gemm_sm90.h"
#include "layernorm.h"

namespace bertfuse {

std::atomic<int>& GemmModeFlag() {
  static std::atomic<int> flag{static_cast<int>(Config().gemm_mode)};
  return flag;
}

std::atomic<int>& GemmConfigFlag() {
  static std::atomic<int> flag{Config().gemm_config};
  return flag;
}

std::atomic<int>& Fp8OutFlag() {
  static std::atomic<int> flag{Config().fp8_gemm_out};
  return flag;
}

std::atomic<int>& SplitLnFlag() {
  static std::atomic<int> flag{Config().split_ln};
  return flag;
}

// ---- the sm_90a GEMMs against cuBLASLt, chosen per shape ---------------------------------------

namespace {

struct ChoiceKey {
  int device, act, residual, M, N, K;
  bool operator==(const ChoiceKey& o) const {
    return device == o.device && act == o.act && residual == o.residual && M == o.M && N == o.N &&
           K == o.K;
  }
};

struct GemmTiming {
  ChoiceKey key;
  int choice;                        // -1 cuBLASLt, else the sm90 configuration
  float us[1 + sm90::kNumConfigs];   // per candidate (cuBLASLt first); < 0: not run
};

ChoiceCache<ChoiceKey, GemmTiming> g_gemm_choices;

Status RunSm90(int cfg, const sm90::Problem& p, cudaStream_t stream, WorkspaceSource* ws) {
  const size_t need = sm90::WorkspaceBytes(cfg, p);
  void* w = need ? (ws ? ws->Get(need) : nullptr) : nullptr;
  if (need && !w) return Status::Error("no workspace for the sm90 GEMM");
  return sm90::Run(cfg, p, stream, w, need);
}

// Which GEMM computes `p`: -1 cuBLASLt (`cublas` enqueues its whole part), else the sm90
// configuration. The first call per shape, outside a CUDA-graph capture, times every candidate
// on the call's own buffers (the candidates only write Y, never read it, so the run that follows
// is unaffected); inside a capture an untimed shape goes to cuBLASLt.
int ChooseGemm(cudaStream_t stream, WorkspaceSource* ws, const sm90::Problem& p,
               const std::function<Status()>& cublas) {
  const int mode = GemmModeFlag().load();
  if (mode == static_cast<int>(GemmMode::kCublas) || !sm90::Available() || !sm90::Eligible(p)) return -1;
  const int pinned = GemmConfigFlag().load();
  if (mode == static_cast<int>(GemmMode::kSm90) && pinned >= 0 && pinned < sm90::kNumConfigs) return pinned;
  int device = 0;
  cudaGetDevice(&device);
  const ChoiceKey key{device, static_cast<int>(p.act), p.beta != 0.0f, p.M, p.N, p.K};
  GemmTiming kept;
  if (g_gemm_choices.Find(key, &kept))
    return mode == static_cast<int>(GemmMode::kSm90) && kept.choice < 0 ? 0 : kept.choice;
  CandidateTimer time(stream);
  if (!time.ok()) return mode == static_cast<int>(GemmMode::kSm90) ? 0 : -1;
  GemmTiming t{key, -1, {}};
  t.us[0] = mode == static_cast<int>(GemmMode::kSm90) ? -1.0f : time(cublas);
  float best = t.us[0];
  for (int c = 0; c < sm90::kNumConfigs; ++c) {
    t.us[1 + c] = time([&] { return RunSm90(c, p, stream, ws); });
    if (t.us[1 + c] >= 0.0f && (best < 0.0f || t.us[1 + c] < best)) {
      best = t.us[1 + c];
      t.choice = c;
    }
  }
  if (best < 0.0f) t.choice = -1;  // nothing ran: cuBLASLt, whose error the caller then sees
  g_gemm_choices.Add(t);
  return t.choice;
}

// can_implement of the sm90 GEMM: configuration `cfg` in this build, on this device, for this
// problem's shape and alignment (ChooseGemm picks only such a one, timed on this shape unless
// pinned by BERTFUSE_GEMM_CONFIG).
bool Sm90CanImplement(int cfg) { return cfg >= 0 && cfg < sm90::kNumConfigs && sm90::Available(); }

}  // namespace

std::string GemmChoicesJson() {
  return g_gemm_choices.Json([](const GemmTiming& t, char* buf, size_t size) {
    std::snprintf(buf, size, "{\"device\":%d,\"M\":%d,\"N\":%d,\"K\":%d,\"gelu\":%d,\"residual\":%d,\"choice\":\"%s\",\"us\":[",
                  t.key.device, t.key.M, t.key.N, t.key.K, t.key.act, t.key.residual,
                  t.choice < 0 ? "cublas" : sm90::ConfigName(t.choice));
    return std::make_pair(static_cast<const float*>(t.us), static_cast<size_t>(1 + sm90::kNumConfigs));
  });
}

// ---- DenseBiasSkipLayerNorm as split-K GEMM + reduction in the LayerNorm -----------------------
//
// Where M is small (BERT-base at b1: M = 128) cuBLASLt splits K and reduces the partials in a
// kernel of its own, then the LayerNorm reads the sum back: two kernels after the GEMM. Here the
// GEMM writes its fp32 partials (one strided-batched call) and the LayerNorm adds them with the
// bias and residual: one kernel, and the partials stay fp32 until the normalisation.

namespace {

constexpr int kSplitCandidates[] = {2, 3, 4, 6, 8};

struct SplitKey {
  int device, M, N, K, y32;
  bool operator==(const SplitKey& o) const {
    return device == o.device && M == o.M && N == o.N && K == o.K && y32 == o.y32;
  }
};
struct SplitTiming {
  SplitKey key;
  int splits;  // 0: the plain form
  float us[1 + sizeof(kSplitCandidates) / sizeof(int)];  // plain, then each candidate; < 0 not run
};
ChoiceCache<SplitKey, SplitTiming> g_split_choices;

bool SplitAllowed(const DenseArgs& a, int splits) {
  return splits >= 2 && a.K % (8 * splits) == 0 &&
         static_cast<size_t>(splits) * a.M * a.N * sizeof(float) <= DefaultWorkspaceBytes();
}

bool SplitEligible(const DenseArgs& a) {
  const auto al16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return a.kind == DenseKind::kBiasSkipLayerNorm && !a.fp8 && !a.yq && !a.no_split &&
         a.variant == DenseVariant::kProduction && a.bias && a.N % 8 == 0 && a.N <= 2048 && a.M > 0 &&
         al16(a.y) && al16(a.gamma) && al16(a.bias) && (!a.skip || al16(a.skip)) && (!a.beta || al16(a.beta)) &&
         (!a.y32 || al16(a.y32));
}

// The split-K partials' buffer: splits x [M, N] fp32 from `ws` (null where it has none that big).
float* SplitParts(WorkspaceSource* ws, const DenseArgs& a, int splits) {
  const size_t stride = static_cast<size_t>(a.M) * a.N;
  return static_cast<float*>(ws ? ws->Get(splits * stride * sizeof(float)) : nullptr);
}

Status RunSplitLn(DenseGemm& gemm, cudaStream_t stream, const DenseArgs& a, int splits, float* parts) {
  const size_t stride = static_cast<size_t>(a.M) * a.N;
  BF_RETURN_IF_ERROR(gemm.RunF16SplitK(stream, a.x, static_cast<const __half*>(a.w), parts, a.M, a.N, a.K, splits));
  const cudaError_t le = bf_layernorm_splits_f16(stream, parts, splits, stride, a.bias, a.skip, a.gamma, a.beta,
                                                 a.epsilon, a.y, a.M, a.N, a.y32, a.weights_const);
  return le == cudaSuccess ? Status::Ok() : Status::Cuda("split-K LayerNorm", le);
}

// The split count for this call (0: the plain form). Timed on the first call of a shape outside a
// CUDA-graph capture (both forms only write Y and Y32); inside a capture an untimed shape runs plain.
int ChooseSplitLn(DenseGemm& gemm, cudaStream_t stream, WorkspaceSource* ws, const DenseArgs& a) {
  const int flag = SplitLnFlag().load();
  if (flag < 0 || !SplitEligible(a)) return 0;
  if (flag >= 2) return SplitAllowed(a, flag) ? flag : 0;
  int device = 0;
  cudaGetDevice(&device);
  const SplitKey key{device, a.M, a.N, a.K, a.y32 != nullptr};
  SplitTiming kept;
  if (g_split_choices.Find(key, &kept)) return kept.splits;
  CandidateTimer time(stream);
  if (!time.ok()) return 0;
  SplitTiming t{key, 0, {}};
  DenseArgs plain = a;
  plain.no_split = true;
  t.us[0] = time([&] { return bf_dense_forward(gemm, stream, ws, plain); });
  float best = t.us[0];
  for (size_t c = 0; c < sizeof(kSplitCandidates) / sizeof(int); ++c) {
    const int n = kSplitCandidates[c];
    t.us[1 + c] = SplitAllowed(a, n) ? time([&] {
      float* parts = SplitParts(ws, a, n);
      return parts ? RunSplitLn(gemm, stream, a, n, parts) : Status::Error("no workspace for the split-K partials");
    })
                                     : -1.0f;
    // Kept only where clearly faster than the plain form (3%), so noise does not flip it.
    if (t.us[1 + c] >= 0.0f && (t.us[0] < 0.0f || t.us[1 + c] < 0.97f * t.us[0]) && (best < 0.0f || t.us[1 + c] < best)) {
      best = t.us[1 + c];
      t.splits = n;
    }
  }
  g_split_choices.Add(t);
  return t.splits;
}

}  // namespace

std::string SplitLnChoicesJson() {
  return g_split_choices.Json([](const SplitTiming& t, char* buf, size_t size) {
    std::snprintf(buf, size, "{\"device\":%d,\"M\":%d,\"N\":%d,\"K\":%d,\"y32\":%d,\"splits\":%d,\"us\":[",
                  t.key.device, t.key.M, t.key.N, t.key.K, t.key.y32, t.splits);
    return std::make_pair(static_cast<const float*>(t.us), sizeof(t.us) / sizeof(float));
  });
}

// ---- the op's steps ----------------------------------------------------------------------------

namespace {

// The GEMM's epilogue and residual (C), then at most one elementwise kernel (bias + activation)
// and, for SkipLayerNorm, the LayerNorm kernel (adding what the GEMM did not).
struct Steps {
  Epilogue epi = Epilogue::kBias;
  const __half* C = nullptr;
  Act act = Act::kNone;
  bool post = false;  // run bf_bias_act_f16 after the GEMM
  const __half* post_bias = nullptr;
  const __half* ln_bias = nullptr;
  const __half* ln_skip = nullptr;
};

Status PlanSteps(const DenseGemm& gemm, const DenseArgs& a, Steps* out) {
  Steps s;
  const bool sln = a.kind == DenseKind::kBiasSkipLayerNorm;
  switch (a.kind) {
    case DenseKind::kBias:
      break;
    case DenseKind::kBiasGelu:
      s.post = true;
      s.act = a.approximate ? Act::kGeluTanh : Act::kGeluErf;
      if (a.approximate) {  // cuBLASLt's GELU epilogue is the tanh form: one kernel
        s.epi = Epilogue::kBiasGeluTanh;
        s.post = false;
      } else if (a.variant == DenseVariant::kGeluPlainGemm) {  // plain GEMM, then one bias + erf-GELU kernel
        s.epi = Epilogue::kNone;
        s.post_bias = a.bias;
      } else if (a.variant == DenseVariant::kGeluErfLib) {  // as the default, erf by CUDA's erff
        s.act = Act::kGeluErfLib;
      }  // else: GEMM with the bias epilogue, then erf-GELU in place
      break;
    case DenseKind::kBiasSkipLayerNorm:
      // Measured on the H200 (M = 1280, 128, 4096): the plain GEMM with the LN adding bias and
      // residual is fastest (shenma FFN down 13.8 us against 14.9 with the residual as C).
      if (a.variant == DenseVariant::kLnBiasEpilogue) {  // bias epilogue, LN adds the residual
        s.ln_skip = a.skip;
      } else if (a.variant == DenseVariant::kLnResidualAsC) {  // bias epilogue + residual as C, LN in place
        s.C = a.skip;
      } else {  // plain GEMM, LN adds bias and residual
        s.epi = Epilogue::kNone;
        s.ln_bias = a.bias;
        s.ln_skip = a.skip;
      }
      break;
    default:
      return Status::Error("unknown dense kind " + std::to_string(static_cast<int>(a.kind)),
                           bf::Code::kInvalidArgument);
  }
  // Where cuBLASLt offered no algorithm for a combination (found once, then remembered), its
  // parts move into our kernels: tanh GELU first, then bias and residual.
  if (s.epi == Epilogue::kBiasGeluTanh && !gemm.Supports(a.fp8, s.epi, false)) {
    s.epi = Epilogue::kBias;
    s.post = true;
  }
  if ((s.epi != Epilogue::kNone || s.C) && !gemm.Supports(a.fp8, s.epi, s.C != nullptr)) {
    if (sln) {
      s.ln_bias = s.epi == Epilogue::kBias ? a.bias : s.ln_bias;
      s.ln_skip = a.skip;
      s.C = nullptr;
    } else {
      s.post = true;
      s.post_bias = a.bias;
    }
    s.epi = Epilogue::kNone;
  }
  *out = s;
  return Status::Ok();
}

const __half* EpilogueBias(const DenseArgs& a, const Steps& s) { return s.epi == Epilogue::kNone ? nullptr : a.bias; }

// can_implement of the op's cuBLASLt GEMM with these steps.
Status CanImplementGemm(DenseGemm& gemm, WorkspaceSource* ws, const DenseArgs& a, const Steps& s) {
  if (a.fp8)
    return gemm.CanImplementFp8(ws, a.xq, static_cast<const uint8_t*>(a.w), a.w_scale, EpilogueBias(a, s), s.C,
                                a.y, a.M, a.N, a.K, s.epi, a.fast_accum);
  return gemm.CanImplementF16(ws, a.x, static_cast<const __half*>(a.w), EpilogueBias(a, s), s.C, a.y, a.M, a.N,
                              a.K, s.epi);
}

// The steps whose cuBLASLt GEMM can run: each combination cuBLASLt turns down is remembered by
// `gemm` (Supports) and the steps are planned again without it.
Status PlanRunnableSteps(DenseGemm& gemm, WorkspaceSource* ws, const DenseArgs& a, Steps* s) {
  for (;;) {
    BF_RETURN_IF_ERROR(PlanSteps(gemm, a, s));
    Status can = CanImplementGemm(gemm, ws, a, *s);
    if (can.ok()) return can;
    const bool now_unsupported = (s->epi != Epilogue::kNone || s->C) && !gemm.Supports(a.fp8, s->epi, s->C != nullptr);
    if (!now_unsupported) return can;
  }
}

Status Cuda(const char* what, cudaError_t e) { return e == cudaSuccess ? Status::Ok() : Status::Cuda(what, e); }

}  // namespace

Status bf_dense_forward(DenseGemm& gemm, cudaStream_t stream, WorkspaceSource* ws, const DenseArgs& a) {
  const int M = a.M, N = a.N, K = a.K;
  const bool sln = a.kind == DenseKind::kBiasSkipLayerNorm;
  if (sln && SplitEligible(a)) {
    const int splits = ChooseSplitLn(gemm, stream, ws, a);
    float* parts = splits > 0 ? SplitParts(ws, a, splits) : nullptr;
    if (parts && gemm.CanImplementF16SplitK(a.x, static_cast<const __half*>(a.w), parts, M, N, K, splits).ok())
      return RunSplitLn(gemm, stream, a, splits, parts);
  }
  Steps s;
  BF_RETURN_IF_ERROR(PlanSteps(gemm, a, &s));
  // fp16 with the production variant: bertfuse's sm_90a GEMM, with bias and erf GELU in its
  // epilogue, where it beats cuBLASLt at this shape (tanh GELU stays on cuBLASLt's epilogue).
  if (!a.fp8 && a.variant == DenseVariant::kProduction && !(a.kind == DenseKind::kBiasGelu && a.approximate) &&
      sm90::Available()) {
    sm90::Problem p;
    p.x = a.x;
    p.w = static_cast<const __half*>(a.w);
    p.bias = a.bias;
    p.y = a.y;
    p.M = M;
    p.N = N;
    p.K = K;
    p.act = a.kind == DenseKind::kBiasGelu ? sm90::Act::kGeluErf : sm90::Act::kIdentity;
    const auto cublas_part = [&]() -> Status {
      BF_RETURN_IF_ERROR(gemm.RunF16(stream, ws, a.x, static_cast<const __half*>(a.w), EpilogueBias(a, s), s.C, a.y,
                                     M, N, K, s.epi));
      if (!s.post) return Status::Ok();
      return Cuda("bias/GELU", bf_bias_act_f16(stream, a.y, a.y, s.post_bias, M, N, s.act));
    };
    const int cfg = ChooseGemm(stream, ws, p, cublas_part);
    if (Sm90CanImplement(cfg)) {
      BF_RETURN_IF_ERROR(RunSm90(cfg, p, stream, ws));
      if (a.yq && !sln)  // the e4m3 copy for an FP8 GEMM downstream
        BF_RETURN_IF_ERROR(Cuda("e4m3 copy", bf_bias_act_f16(stream, a.y, nullptr, nullptr, M, N, Act::kNone, a.yq,
                                                            a.yq_scale)));
      if (sln)  // the bias is in; the LayerNorm adds the residual
        return Cuda("LayerNorm", bf_layernorm_f16(stream, a.y, nullptr, a.skip, a.gamma, a.beta, a.epsilon, a.y, M, N,
                                                  a.yq, a.yq_scale, a.y32, a.weights_const));
      return Status::Ok();
    }
  }
  if (a.fp8) {
    if (!a.xq) return Status::Error("FP8 dense: no scratch buffer for the quantized activations");
    if (a.x)  // else xq already holds them (quantized upstream)
      BF_RETURN_IF_ERROR(Cuda("FP8 activation quantize",
                              bf_quantize_e4m3(stream, a.x, a.x_scale, a.xq, static_cast<size_t>(M) * K)));
    // Only the e4m3 copy is read, and the epilogue is all cuBLASLt's (tanh GELU, or the bias):
    // the GEMM writes it, from fp32, with no fp16 Y and no pass after.
    if (a.yq && a.y_unread && a.yq_dscale && !s.post && !s.C && s.epi != Epilogue::kNone && !sln &&
        Fp8OutFlag().load() &&
        gemm.CanImplementFp8Quantized(a.xq, static_cast<const uint8_t*>(a.w), a.w_scale, a.bias, a.yq,
                                      a.yq_dscale, M, N, K, s.epi, a.fast_accum)
            .ok()) {
      return gemm.RunFp8Quantized(stream, ws, a.xq, static_cast<const uint8_t*>(a.w), a.w_scale, a.x_scale, a.bias,
                                  a.yq, a.yq_dscale, M, N, K, s.epi, a.fast_accum);
    }
  }
  // cuBLASLt's GEMM, its combination of epilogue and residual asked for first.
  BF_RETURN_IF_ERROR(PlanRunnableSteps(gemm, ws, a, &s));
  if (a.fp8) {
    BF_RETURN_IF_ERROR(gemm.RunFp8(stream, ws, a.xq, static_cast<const uint8_t*>(a.w), a.w_scale, a.x_scale,
                                   EpilogueBias(a, s), s.C, a.y, M, N, K, s.epi, a.fast_accum));
  } else {
    BF_RETURN_IF_ERROR(gemm.RunF16(stream, ws, a.x, static_cast<const __half*>(a.w), EpilogueBias(a, s), s.C, a.y, M,
                                   N, K, s.epi));
  }
  if (s.post || (a.yq && !sln)) {  // a pass only for the e4m3 copy leaves Y as the GEMM wrote it
    // y's own write is skipped where nothing reads it (y_unread: only the e4m3 copy is kept)
    BF_RETURN_IF_ERROR(Cuda("bias/GELU", bf_bias_act_f16(stream, a.y, s.post && !(a.y_unread && a.yq) ? a.y : nullptr,
                                                         s.post_bias, M, N, s.post ? s.act : Act::kNone, a.yq,
                                                         a.yq_scale)));
  }
  if (sln)
    return Cuda("LayerNorm", bf_layernorm_f16(stream, a.y, s.ln_bias, s.ln_skip, a.gamma, a.beta, a.epsilon, a.y, M, N,
                                              a.yq, a.yq_scale, a.y32, a.weights_const));
  return Status::Ok();
}

}  // namespace bertfuse
