// Fitting low-rank bases from calibration statistics (DESIGN.md §4.3, §4.5;
// docs/calibration.md). Every fit is full rank d, directions sorted by decreasing energy with
// deterministic signs (each encoder column's largest-magnitude entry positive), so a press
// truncates to any rank r by taking the first r columns.
//  - K-SVD (StiefAttention baseline): keys = eigenvectors of G_K (= right singular vectors of
//    K), values = eigenvectors of G_V.
//  - EigenAttention: keys = eigenvectors of G_K + G_Q (SVD of [K; Q] stacked, OjaKV's initial
//    key basis), values as K-SVD.
//  - StaticPCA (OjaKV baseline): the same fixed basis as EigenAttention, under its own name.
//  - KQ-SVD (oblique): keys: best rank-r approximation of the score matrix Q·Kᵀ; values: of
//    V·W_O (see calibration.h for the encoder / decoder conventions and fit.cpp for the maths).
#pragma once
#include <vector>

#include "calib/calibration.h"

namespace kvtrim {

HeadFit fit_head(BasisMethod m, const HeadStats& s);
// One fit per entry of stats.
std::vector<HeadFit> fit_all(BasisMethod m, const std::vector<HeadStats>& stats);

// Diagnostics on a statistics set (possibly other text than the fit's):
// RER = 1 − tr(Uᵀ G U) / tr(G) of an orthonormal basis U [d, r] (0 when G is zero).
double rer_gram(const std::vector<double>& G, int d, const std::vector<float>& U, int r);
// SO(U1, U2) = ‖U1ᵀ U2‖²_F / r of the spans of two [d, r] column sets (each orthonormalised
// first, so oblique encoders compare by the subspace they span).
double span_overlap(const std::vector<float>& U1, const std::vector<float>& U2, int d, int r);
// KQ-SVD keys: relative score error ‖Q (I − D_r E_rᵀ) Kᵀ‖²_F / ‖Q Kᵀ‖²_F computed from the
// Grams of Q and K (tr(Mᵀ G_Q M G_K) / tr(G_Q G_K), M = I − D_r E_rᵀ).
double kq_score_rel_error(const HeadStats& s, const SideFit& f, int r);
// KQ-SVD values: relative ‖V (I − E_r D_rᵀ) W_O‖²_F / ‖V W_O‖²_F from G_V and G_VO.
double vo_rel_error(const HeadStats& s, const SideFit& f, int r);

}  // namespace kvtrim
