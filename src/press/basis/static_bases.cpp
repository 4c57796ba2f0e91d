// The static low-rank baselines: a fixed basis per (layer, kv head) fitted offline by
// `kvtrim calibrate` (src/calib/fit.cpp), truncated to the rank the options ask for; no online
// update. Maths and options: docs/presses-lowrank.md; implementation: lowrank_press.cpp.
//   ksvd            K-SVD: top right singular vectors of the calibration keys (and of the
//                   values) — the StiefAttention paper's baseline (DESIGN.md §4.3).
//   eigenattention  EigenAttention (Saxena et al. 2024, arXiv:2408.05646): keys from the SVD
//                   of [K; Q] stacked (the basis attention scores are computed in), values as
//                   K-SVD.
//   kqsvd           KQ-SVD: the best rank-r approximation of the score matrix Q·Kᵀ (and of
//                   V·W_O for values) under the calibration statistics; oblique (an encoder
//                   and a decoder, HeadPlan::key.decoder / value.decoder).
//   staticpca       StaticPCA, the OjaKV paper's static baseline (Zhu et al. 2025, §6): the
//                   calibration PCA basis, reconstructed on the fly; with hybrid > 0 (plus
//                   sinks / recent) it is the paper's StaticPCA-H ablation (Table 6).
// Hyper-parameters (defaults): ratio = 0.5 (fraction of dimensions removed), energy = 0,
// calib = <model>.kvcalib, prefill = lowrank, sinks = 0, recent = 0, hybrid = 0, w = 32,
// T = 32 (re-encoding interval of the decode buffer, only with anchors).
#include "press/basis/lowrank_press.h"

namespace kvtrim {

namespace {

PressInfo static_info(const char* name, BasisMethod m, const char* description, const char* paper) {
  PressInfo i;
  i.name = name;
  i.description = description;
  i.paper = paper;
  i.options = lowrank_options(LowRankDefaults{}, false);
  i.axis = PressAxis::kBasis;
  i.make = [m](const PressArgs& a) -> std::unique_ptr<Press> {
    return std::make_unique<LowRankPress>(parse_lowrank_config(a, m, false));
  };
  return i;
}

}  // namespace

PressInfo ksvd_press_info() {
  return static_info("ksvd", BasisMethod::kKSvd,
                     "low-rank K/V: top singular vectors of the calibration keys / values",
                     "K-SVD baseline of StiefAttention (DESIGN.md section 4.3): truncated SVD of "
                     "calibration K and V");
}

PressInfo eigenattention_press_info() {
  PressInfo i = static_info(
      "eigenattention", BasisMethod::kEigenAttention,
      "low-rank K/V: keys in the SVD basis of [K; Q], values in the SVD basis of V (calibration)",
      "Saxena et al. 2024, Eigen Attention: Attention in Low-Rank Space for KV Cache Compression "
      "(arXiv:2408.05646)");
  i.options.push_back(
      {"eps", "0",
       "> 0: the StiefAttention paper's EigenAttention procedure: per layer, the smallest energy "
       "threshold whose measured decoder-layer output error is <= eps (needs kvtrim calibrate "
       "--stief; overrides ratio and energy)"});
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    LowRankConfig c = parse_lowrank_config(a, BasisMethod::kEigenAttention, false);
    const double eps = a.get_double_in("eps", 0, 1e9, true);
    if (eps > 0) return make_eigen_budget_press(std::move(c), eps);
    return std::make_unique<LowRankPress>(std::move(c));
  };
  return i;
}

PressInfo kqsvd_press_info() {
  return static_info(
      "kqsvd", BasisMethod::kKqSvd,
      "low-rank K/V: oblique best rank-r approximation of Q·Kᵀ and of V·W_O (calibration)",
      "KQ-SVD baseline of StiefAttention (DESIGN.md section 4.3)");
}

PressInfo staticpca_press_info() {
  return static_info("staticpca", BasisMethod::kStaticPca,
                     "low-rank K/V: a fixed calibration PCA basis (hybrid > 0: StaticPCA-H)",
                     "Zhu et al. 2025, OjaKV: Context-Aware Online Low-Rank KV Cache Compression, "
                     "StaticPCA baseline "
                     "(arXiv:2509.21623)");
}

}  // namespace kvtrim
