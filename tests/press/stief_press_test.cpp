// stiefattention and eigenattention:eps on the tiny model with an in-memory calibration holding
// hand-made StiefAttention fits (test::with_stief_fits): each layer's ranks are the brute-force pick from its error
// surface (Pareto, Weighted Pareto, Uniform) or from EigenAttention's walk, the bases are the
// trained candidate's first columns (keys shared by the kv heads, values per head), a layer
// with nothing under the budget stays uncompressed, fixed ranks must be trained candidates, and
// the saving is real bytes.
#include <gtest/gtest.h>

#include "basis_test_util.h"
#include "calib/stief_fits.h"

namespace kvtrim {
namespace {

constexpr int kStiefTokens = 40;

class StiefPress : public test::PressFixture {
 protected:
  static std::shared_ptr<Calibration> cal() {
    static std::shared_ptr<Calibration> c = test::with_stief_fits(
        *model_, *test::tiny_calibration(*model_, capture(test::calib_tokens())));
    return c;
  }
  static std::vector<float> first_cols(const std::vector<float>& U, int d, int r) {
    std::vector<float> o;
    for (int i = 0; i < d; ++i) o.insert(o.end(), U.begin() + i * d, U.begin() + i * d + r);
    return o;
  }
};

TEST_F(StiefPress, RanksAndBasesFollowTheAllocation) {
  test::CalibrationScope scope(cal());
  const StiefFits& f = cal()->stief();
  for (const char* alloc : {"pareto", "wpareto", "uniform"}) {
    for (const double eps : {0.01, 0.05, 0.08}) {
      const std::string spec =
          "stiefattention:eps=" + std::to_string(eps) + ",alloc=" + alloc + ",prefill=full";
      SCOPED_TRACE(spec);
      const auto choice = allocate_ranks(f, parse_rank_alloc(alloc), eps);
      auto s = prefilled(spec, tokens(kStiefTokens));
      const CompressionPlan p = plan_with_model(*s);
      for (int il = 0; il < p.n_layer; ++il) {
        // brute force over the 4 x 4 surface (Pareto family; uniform checked via allocate_ranks)
        if (std::string(alloc) == "pareto") {
          int bt = 1 << 30, bi = 3, bj = 3;
          double be = 0;
          for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) {
              const double e = f.surface(il, i, j);
              const int t = f.rank_k(i) + f.rank_v(j);
              if (e <= eps && (t < bt || (t == bt && e < be))) bi = i, bj = j, bt = t, be = e;
            }
          EXPECT_EQ(choice[il].ik, bi);
          EXPECT_EQ(choice[il].iv, bj);
        }
        const int ik = choice[il].ik, iv = choice[il].iv;
        for (int ih = 0; ih < p.n_head_kv; ++ih) {
          const HeadPlan& h = p.at(il, ih);
          if (ik == 3 && iv == 3) {  // nothing fits: the layer stays dense
            EXPECT_FALSE(h.keep_all && h.key.rank > 0) << "layer " << il;
            continue;
          }
          ASSERT_EQ(h.key.rank, f.rank_k(ik)) << "layer " << il;
          ASSERT_EQ(h.value.rank, f.rank_v(iv)) << "layer " << il;
          if (ik < 3) {
            EXPECT_EQ(h.key.basis, first_cols(f.layers[il].key[ik], 16, h.key.rank));
          }
          if (iv < 3) {
            EXPECT_EQ(h.value.basis, first_cols(f.layers[il].value[iv][ih], 16, h.value.rank));
          }
        }
      }
      // the saving is real: the stored K/V coefficients shrink whenever a layer compressed
      // (on this 40-token prompt the bases, d x r floats per head, cost about as much again:
      // bytes().bases counts them)
      bool any = false;
      for (const auto& c : choice) any = any || c.ik < 3 || c.iv < 3;
      const KvBytes before = s->cache().bytes();
      s->compress();
      const KvBytes after = s->cache().bytes();
      if (any) {
        EXPECT_LT(after.keys + after.values, before.keys + before.values);
        EXPECT_GT(after.bases, before.bases);
      }
    }
  }
}

TEST_F(StiefPress, EigenAttentionUnderTheSameBudgetWalksItsThresholds) {
  test::CalibrationScope scope(cal());
  for (const double eps : {0.02, 0.05, 0.2}) {
    const std::string spec = "eigenattention:eps=" + std::to_string(eps) + ",prefill=full";
    SCOPED_TRACE(spec);
    auto s = prefilled(spec, tokens(kStiefTokens));
    const CompressionPlan p = plan_with_model(*s);
    for (int il = 0; il < p.n_layer; ++il) {
      const StiefLayerFit& L = cal()->stief().layers[il];
      double tau = 1.0;
      for (size_t k = 0; k < L.eig_tau.size(); ++k)
        if (L.eig_err[k] <= eps) {
          tau = L.eig_tau[k];
          break;
        }
      for (int ih = 0; ih < p.n_head_kv; ++ih) {
        const HeadFit& fit = cal()->fit(BasisMethod::kEigenAttention, il, ih);
        const int rk = fit.k.rank_for_energy(tau), rv = fit.v.rank_for_energy(tau);
        const HeadPlan& h = p.at(il, ih);
        if (rk == 16 && rv == 16) {
          EXPECT_FALSE(h.keep_all && h.key.rank > 0);
          continue;
        }
        EXPECT_EQ(h.key.rank, rk) << "layer " << il;
        EXPECT_EQ(h.value.rank, rv) << "layer " << il;
        EXPECT_EQ(h.key.basis, fit.k.enc_cols(rk));
      }
    }
  }
}

TEST_F(StiefPress, FixedRanksMustBeTrainedAndErrorsAreClear) {
  test::CalibrationScope scope(cal());
  auto s = prefilled("stiefattention:ratio=0.5,prefill=full", tokens(kStiefTokens));
  const CompressionPlan p = plan_with_model(*s);
  for (int il = 0; il < p.n_layer; ++il) {
    EXPECT_EQ(p.at(il, 0).key.rank, 8);
    EXPECT_EQ(p.at(il, 1).value.rank, 8);
    EXPECT_EQ(p.at(il, 1).value.basis, first_cols(cal()->stief().layers[il].value[1][1], 16, 8));
  }
  const std::string e = test::error_of([&] { prefilled("stiefattention:ratio=0.3,prefill=full", tokens(kStiefTokens))->compress(); });
  EXPECT_NE(e.find("was not trained"), std::string::npos) << e;
  EXPECT_NE(e.find("4, 8, 12"), std::string::npos) << e;
  EXPECT_NE(test::error_of([] { make_press("stiefattention:alloc=greedy"); }).find("uniform, pareto or wpareto"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { make_press("stiefattention:energy=0.9"); }).find("does not apply"),
            std::string::npos);
  // a calibration without the StiefAttention section names the command that makes one
  test::CalibrationScope plain(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  const std::string e2 = test::error_of([&] { prefilled("stiefattention:prefill=full", tokens(kStiefTokens))->compress(); });
  EXPECT_NE(e2.find("kvtrim calibrate --stief"), std::string::npos) << e2;
  const std::string e3 = test::error_of([&] { prefilled("eigenattention:eps=0.1,prefill=full", tokens(kStiefTokens))->compress(); });
  EXPECT_NE(e3.find("kvtrim calibrate --stief"), std::string::npos) << e3;
}

}  // namespace
}  // namespace kvtrim
