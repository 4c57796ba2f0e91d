// OjaKV: low-rank K/V whose bases adapt online by Oja's rule, with high-error tokens kept
// full-rank. Paper: Zhu et al. 2025, "OjaKV: Context-Aware Online Low-Rank KV Cache
// Compression" (arXiv:2509.21623), Algorithm 1 (appendix A.1); DESIGN.md §4.5.
//
//   init     U_k, U_v = the calibration's EigenAttention fit (SVD of [Q, K], of V; A.3),
//            first r columns (init=prompt: PCA of the prompt's own keys / values).
//   prefill  X = AvgPool(K, p) (and V); ONE batch Oja step U ← U + η(CU − UUᵀCU),
//            C = XᵀX / N (§5.2), then QR re-orthonormalisation (lines 2-5); then the hybrid
//            selection with the updated basis: r_t = k_t − U Uᵀ k_t,
//            e_t = mean over the last w queries of the GQA group that see t of |q·r_t| / √d_h,
//            top-k tokens stay full-rank (lines 6-7), plus sinks and the recent window.
//   decode   new tokens stay dense (the buffer, appends_dense); every T steps: pool the
//            buffer, one Oja step with η_decode, re-orthonormalise, and a new basis epoch
//            re-encodes the buffer except the anchors (lines 11-16); older epochs keep
//            their bases (DESIGN.md §3).
//   prefill=lowrank (default, the paper's main experiments): the prefill's attention reads
//            the compressed cache (plan_after_append; a chunked prefill applies the prefill
//            update per chunk). prefill=full: OjaKV-PF (compress after prefill).
// Hyper-parameters (defaults; paper Table 9 gives η = 0.1, T = 32, w = 32; the rest is our
// choice where the paper is silent, see docs/presses-lowrank.md): ratio = 0.5 (rank
// round(d (1 - ratio))), energy = 0 (> 0: rank by energy, the layer's largest, A.3), eta = 0.1,
// eta_decode = 0.01, T = 32, pool = 4, w = 32, hybrid = 0.05, sinks = 4, recent = 32,
// init = calib, prefill = lowrank.
#include "press/basis/lowrank_press.h"

namespace kvtrim {

PressInfo ojakv_press_info() {
  PressInfo i;
  i.name = "ojakv";
  i.description =
      "low-rank K/V with Oja-updated bases (prefill + every T decode steps), high-error tokens "
      "full-rank";
  i.paper =
      "Zhu et al. 2025, OjaKV: Context-Aware Online Low-Rank KV Cache Compression "
      "(arXiv:2509.21623)";
  i.options = lowrank_options(LowRankDefaults{"4", "32", "0.05"}, true);
  i.axis = PressAxis::kBasis;
  // T = 2: the basis updates during the sweeps' few decode steps
  i.test_easy = "ojakv:ratio=0.25,T=2";
  i.test_hard = "ojakv:ratio=0.9,T=2";
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    return std::make_unique<LowRankPress>(
        parse_lowrank_config(a, BasisMethod::kEigenAttention, true));
  };
  return i;
}

}  // namespace kvtrim
