// Calibration: capture statistics against a brute-force f64 computation on a tiny model, the
// fits' invariants (orthonormality, sorted energies, full-rank losslessness, KQ-SVD's optimal
// rank-r score and V·W_O errors against a brute-force SVD), and the calibration file: round
// trip, wrong model, truncated / bit-flipped / other-version / non-calibration files.
#include "calib/calibration.h"

#include <gtest/gtest.h>

#include <Eigen/SVD>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "../common/tiny_model.h"
#include "calib/capture.h"
#include "calib/fit.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "ops/matmul.h"

namespace kvtrim {
namespace {

using Mat = Eigen::MatrixXd;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& path, const std::string& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

// Expects load() to throw an Error whose message contains every needle.
void expect_load_error(const std::string& path, const Model* model,
                       const std::vector<std::string>& needles) {
  try {
    Calibration::load(path, model);
    ADD_FAILURE() << "loading " << path << " did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg << "\nmissing: " << n;
  }
}

// Records every q/k/v the forward pass shows (post- and pre-RoPE) and the layer io, then
// forwards to the capture under test.
class RecordingCapture : public CalibCapture {
 public:
  using CalibCapture::CalibCapture;
  struct Layer {
    std::vector<float> q, k, v, q_pre, k_pre, x_in, x_out;
  };
  std::vector<Layer> layers;
  void on_qkv(int il, int64_t n, const float* q, const float* k, const float* v,
              const int32_t* pos) override {
    grow(il);
    const HParams& hp = model_ref->hparams();
    append(layers[il].q, q, n * hp.n_head * hp.head_dim_k);
    append(layers[il].k, k, n * hp.n_head_kv * hp.head_dim_k);
    append(layers[il].v, v, n * hp.n_head_kv * hp.head_dim_v);
    CalibCapture::on_qkv(il, n, q, k, v, pos);
  }
  void on_qk_pre_rope(int il, int64_t n, const float* q, const float* k) override {
    grow(il);
    const HParams& hp = model_ref->hparams();
    append(layers[il].q_pre, q, n * hp.n_head * hp.head_dim_k);
    append(layers[il].k_pre, k, n * hp.n_head_kv * hp.head_dim_k);
    CalibCapture::on_qk_pre_rope(il, n, q, k);
  }
  void on_layer_io(int il, int64_t n, const float* x_in, const float* x_out) override {
    grow(il);
    append(layers[il].x_in, x_in, n * model_ref->hparams().n_embd);
    append(layers[il].x_out, x_out, n * model_ref->hparams().n_embd);
    CalibCapture::on_layer_io(il, n, x_in, x_out);
  }
  const Model* model_ref = nullptr;

 private:
  void grow(int il) {
    if (static_cast<int>(layers.size()) <= il) layers.resize(il + 1);
  }
  static void append(std::vector<float>& dst, const float* src, int64_t n) {
    dst.insert(dst.end(), src, src + n);
  }
};

// Brute-force Σ over rows of the given heads' [d] slices: x[t, head, :] x[t, head, :]ᵀ.
std::vector<double> brute_gram(const std::vector<float>& x, int n_heads_row, int d,
                               const std::vector<int>& heads) {
  const int64_t n = static_cast<int64_t>(x.size()) / (n_heads_row * d);
  std::vector<double> g(static_cast<size_t>(d) * d, 0);
  for (int64_t t = 0; t < n; ++t)
    for (int h : heads) {
      const float* r = x.data() + (t * n_heads_row + h) * d;
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) g[i * d + j] += double(r[i]) * r[j];
    }
  return g;
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rel,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 1e-12, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(b[i]));
    diff = std::max(diff, std::fabs(a[i] - b[i]));
  }
  EXPECT_LE(diff / scale, rel) << what;
}

struct TinyRun {
  std::unique_ptr<Model> model;
  std::vector<HeadStats> stats;
  std::vector<LayerIoSample> io;
};

TinyRun run_tiny(Arch arch, uint32_t seed, int io_rows, RecordingCapture** rec_out = nullptr) {
  static const std::string dir = test::temp_dir("calib_tiny");
  TinyRun r;
  r.model = Model::load(test::write_tiny_model(test::tiny_spec(arch, seed), dir));
  const int nv = r.model->hparams().n_vocab;
  const std::vector<std::vector<int32_t>> seqs = {test::random_tokens(40, nv, 3), test::random_tokens(33, nv, 4)};
  static std::unique_ptr<RecordingCapture> keep;
  keep = std::make_unique<RecordingCapture>(*r.model, io_rows, 7);
  keep->model_ref = r.model.get();
  ThreadPool pool(1);
  run_capture(*r.model, seqs, *keep, &pool);
  r.stats = keep->stats();
  r.io = keep->layer_io();
  if (rec_out) *rec_out = keep.get();
  return r;
}

class CaptureTest : public ::testing::TestWithParam<Arch> {};

TEST_P(CaptureTest, GramsMatchBruteForce) {
  RecordingCapture* rec = nullptr;
  TinyRun r = run_tiny(GetParam(), 3, 16, &rec);
  const HParams& hp = r.model->hparams();
  const int g = hp.n_head / hp.n_head_kv, dk = hp.head_dim_k, dv = hp.head_dim_v;
  ASSERT_EQ(r.stats.size(), static_cast<size_t>(hp.n_layer * hp.n_head_kv));
  for (int il = 0; il < hp.n_layer; ++il) {
    const RecordingCapture::Layer& L = rec->layers[il];
    std::vector<float> w(static_cast<size_t>(r.model->layers()[il].wo.n_rows * hp.n_head * dv));
    for (int64_t row = 0; row < r.model->layers()[il].wo.n_rows; ++row)
      get_row(r.model->layers()[il].wo, row, w.data() + row * hp.n_head * dv);
    for (int ih = 0; ih < hp.n_head_kv; ++ih) {
      const HeadStats& s = r.stats[il * hp.n_head_kv + ih];
      const std::string at = "layer " + std::to_string(il) + " head " + std::to_string(ih);
      EXPECT_EQ(s.n_tokens, 73) << at;
      EXPECT_EQ(s.n_group, g);
      std::vector<int> group;
      for (int h = 0; h < g; ++h) group.push_back(ih * g + h);
      expect_close(s.gram_k, brute_gram(L.k, hp.n_head_kv, dk, {ih}), 1e-5, "gram_k " + at);
      expect_close(s.gram_v, brute_gram(L.v, hp.n_head_kv, dv, {ih}), 1e-5, "gram_v " + at);
      expect_close(s.gram_q, brute_gram(L.q, hp.n_head, dk, group), 1e-5, "gram_q " + at);
      expect_close(s.gram_k_pre, brute_gram(L.k_pre, hp.n_head_kv, dk, {ih}), 1e-5,
                   "gram_k_pre " + at);
      expect_close(s.gram_q_pre, brute_gram(L.q_pre, hp.n_head, dk, group), 1e-5,
                   "gram_q_pre " + at);
      std::vector<double> sk(dk, 0), sv(dv, 0), skp(dk, 0);
      for (int64_t t = 0; t < 73; ++t) {
        for (int j = 0; j < dk; ++j) sk[j] += L.k[(t * hp.n_head_kv + ih) * dk + j];
        for (int j = 0; j < dk; ++j) skp[j] += L.k_pre[(t * hp.n_head_kv + ih) * dk + j];
        for (int j = 0; j < dv; ++j) sv[j] += L.v[(t * hp.n_head_kv + ih) * dv + j];
      }
      expect_close(s.sum_k, sk, 1e-5, "sum_k " + at);
      expect_close(s.sum_v, sv, 1e-5, "sum_v " + at);
      expect_close(s.sum_k_pre, skp, 1e-5, "sum_k_pre " + at);
      // gram_vo: W_O's rows hold head h's output weights at columns h·dv .. (h+1)·dv
      expect_close(s.gram_vo, brute_gram(w, hp.n_head, dv, group), 1e-5, "gram_vo " + at);
    }
    // layer io: R rows, each an actual (input, output) pair of this layer
    const LayerIoSample& io = r.io[il];
    ASSERT_EQ(io.n_rows, 16);
    ASSERT_EQ(io.n_embd, hp.n_embd);
    for (int i = 0; i < io.n_rows; ++i) {
      bool found = false;
      for (int64_t t = 0; t < 73 && !found; ++t)
        found = std::memcmp(io.x_in.data() + i * hp.n_embd, L.x_in.data() + t * hp.n_embd,
                            sizeof(float) * hp.n_embd) == 0 &&
                std::memcmp(io.x_out.data() + i * hp.n_embd, L.x_out.data() + t * hp.n_embd,
                            sizeof(float) * hp.n_embd) == 0;
      EXPECT_TRUE(found) << "layer " << il << " sampled row " << i
                         << " is not a captured (x_in, x_out) pair";
    }
  }
  // the reservoir is deterministic (same seed, same rows)
  TinyRun again = run_tiny(GetParam(), 3, 16);
  EXPECT_EQ(again.io[0].x_in, r.io[0].x_in);
}

INSTANTIATE_TEST_SUITE_P(Archs, CaptureTest,
                         ::testing::Values(Arch::kLlama, Arch::kQwen2, Arch::kGemma3),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

// Synthetic statistics from explicit anisotropic Q, K, V and W_O.
struct Synthetic {
  int d = 8, n = 120, e = 12, g = 2;
  Mat Q, K, V, W;  // Q [g·n, d] (group's heads stacked), K, V [n, d], W = Σ-stacked W_O^h: [d, g·e]
  HeadStats s;
};

Synthetic make_synthetic(uint32_t seed) {
  Synthetic y;
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  auto rnd = [&](int r, int c) {
    Mat m(r, c);
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < c; ++j) m(i, j) = nd(rng);
    return m;
  };
  Mat scale = Mat::Zero(y.d, y.d);
  for (int i = 0; i < y.d; ++i) scale(i, i) = std::pow(0.6, i);
  y.K = rnd(y.n, y.d) * scale * rnd(y.d, y.d);
  y.Q = rnd(y.g * y.n, y.d) * scale * rnd(y.d, y.d);
  y.V = rnd(y.n, y.d) * scale * rnd(y.d, y.d);
  y.W = rnd(y.d, y.g * y.e);
  auto rm = [](const Mat& m) {
    std::vector<double> v(static_cast<size_t>(m.rows() * m.cols()));
    for (int i = 0; i < m.rows(); ++i)
      for (int j = 0; j < m.cols(); ++j) v[i * m.cols() + j] = m(i, j);
    return v;
  };
  y.s.n_tokens = y.n;
  y.s.n_group = y.g;
  y.s.gram_k = rm(y.K.transpose() * y.K);
  y.s.gram_q = rm(y.Q.transpose() * y.Q);
  y.s.gram_v = rm(y.V.transpose() * y.V);
  y.s.gram_vo = rm(y.W * y.W.transpose());
  y.s.gram_k_pre = y.s.gram_k;
  y.s.gram_q_pre = y.s.gram_q;
  y.s.sum_k.assign(y.d, 0);
  y.s.sum_v.assign(y.d, 0);
  y.s.sum_k_pre.assign(y.d, 0);
  return y;
}

Mat cols(const std::vector<float>& rm, int d, int r) {
  Mat m(d, r);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < r; ++j) m(i, j) = rm[i * r + j];
  return m;
}

TEST(Fit, OrthonormalFitsSortedAndLossless) {
  const Synthetic y = make_synthetic(1);
  for (BasisMethod m :
       {BasisMethod::kKSvd, BasisMethod::kEigenAttention, BasisMethod::kStaticPca}) {
    const HeadFit f = fit_head(m, y.s);
    for (const SideFit* sf : {&f.k, &f.v}) {
      ASSERT_TRUE(sf->orthonormal()) << basis_method_name(m);
      const Mat E = cols(sf->enc, y.d, y.d);
      EXPECT_LT((E.transpose() * E - Mat::Identity(y.d, y.d)).cwiseAbs().maxCoeff(), 1e-5)
          << basis_method_name(m);
      for (int j = 1; j < y.d; ++j) EXPECT_GE(sf->energy[j - 1], sf->energy[j]);
      EXPECT_GE(sf->energy.back(), 0);
    }
    EXPECT_NEAR(rer_gram(y.s.gram_k, y.d, f.k.enc, y.d), 0, 1e-5);
    EXPECT_NEAR(rer_gram(y.s.gram_v, y.d, f.v.enc, y.d), 0, 1e-5);
    EXPECT_NEAR(span_overlap(f.k.enc_cols(3), f.k.enc_cols(3), y.d, 3), 1, 1e-6);
  }
  // K-SVD keys: energy = eigenvalues of G_K (sum = trace); rank-r RER = tail energy share
  const HeadFit f = fit_head(BasisMethod::kKSvd, y.s);
  double tr = 0, tail = 0;
  for (int i = 0; i < y.d; ++i) tr += y.s.gram_k[i * y.d + i];
  for (int j = 3; j < y.d; ++j) tail += f.k.energy[j];
  EXPECT_NEAR(std::accumulate(f.k.energy.begin(), f.k.energy.end(), 0.0) / tr, 1, 1e-9);
  EXPECT_NEAR(rer_gram(y.s.gram_k, y.d, f.k.enc_cols(3), 3), tail / tr, 1e-5);
  // EigenAttention keys = eigenvectors of G_K + G_Q; StaticPCA is the same basis
  const HeadFit ea = fit_head(BasisMethod::kEigenAttention, y.s),
                sp = fit_head(BasisMethod::kStaticPca, y.s);
  EXPECT_EQ(ea.k.enc, sp.k.enc);
  EXPECT_EQ(ea.v.enc, f.v.enc);
  // deterministic signs: each column's largest-magnitude entry is positive
  const Mat E = cols(ea.k.enc, y.d, y.d);
  for (int j = 0; j < y.d; ++j) {
    Eigen::Index imax;
    E.col(j).cwiseAbs().maxCoeff(&imax);
    EXPECT_GT(E(imax, j), 0);
  }
}

// SWAN: P_QK = right singular vectors of [Q; K] (EigenAttention's keys), P_VO = of [V; W_Oᵀ]:
// eigenvectors of G_V + G_VO, checked against the eigen-equation and a brute-force SVD of the
// stacked rows.
TEST(Fit, SwanRotationsAreTheStackedSingularVectors) {
  const Synthetic y = make_synthetic(3);
  const HeadFit f = fit_head(BasisMethod::kSwan, y.s);
  const HeadFit ea = fit_head(BasisMethod::kEigenAttention, y.s);
  EXPECT_EQ(f.k.enc, ea.k.enc);
  ASSERT_TRUE(f.v.orthonormal());
  const int d = y.d;
  const Mat E = cols(f.v.enc, d, d);
  EXPECT_LT((E.transpose() * E - Mat::Identity(d, d)).cwiseAbs().maxCoeff(), 1e-5);
  Mat S(y.V.rows() + y.W.cols(), d);  // [V; W_Oᵀ]: y.W is [d, n_embd]
  S << y.V, y.W.transpose();
  Eigen::JacobiSVD<Mat> svd(S, Eigen::ComputeFullV);
  for (int j = 0; j < d; ++j) {
    const double sv2 = svd.singularValues()(j) * svd.singularValues()(j);
    EXPECT_NEAR(f.v.energy[j] / sv2, 1, 1e-5) << j;
    // the same direction up to sign (singular values of a random matrix are distinct)
    EXPECT_NEAR(std::fabs(E.col(j).dot(svd.matrixV().col(j))), 1, 1e-4) << j;
  }
  HeadStats no_vo = y.s;
  no_vo.gram_vo.clear();
  EXPECT_THROW(fit_head(BasisMethod::kSwan, no_vo), Error);
}

TEST(Fit, KqSvdFullRankExactAndOptimalAtRankR) {
  const Synthetic y = make_synthetic(2);
  const HeadFit f = fit_head(BasisMethod::kKqSvd, y.s);
  ASSERT_FALSE(f.k.orthonormal());
  ASSERT_FALSE(f.v.orthonormal());
  const int d = y.d;
  const Mat Ek = cols(f.k.enc, d, d), Dk = cols(f.k.dec, d, d), Ev = cols(f.v.enc, d, d),
            Dv = cols(f.v.dec, d, d);
  // full rank: D Eᵀ = I, so q·D·Eᵀ·k = q·k; values E Dᵀ = I
  EXPECT_LT((Dk * Ek.transpose() - Mat::Identity(d, d)).cwiseAbs().maxCoeff(), 1e-4);
  EXPECT_LT((Ev * Dv.transpose() - Mat::Identity(d, d)).cwiseAbs().maxCoeff(), 1e-4);
  const Mat S = y.Q * y.K.transpose();
  EXPECT_LT((y.Q * Dk * Ek.transpose() * y.K.transpose() - S).norm() / S.norm(), 1e-4);
  for (int j = 1; j < d; ++j) {
    EXPECT_GE(f.k.energy[j - 1], f.k.energy[j]);
    EXPECT_GE(f.v.energy[j - 1], f.v.energy[j]);
  }
  // rank r: the score error equals the optimum Σ_{i>r} σ_i² of Q·Kᵀ (brute-force SVD)
  Eigen::JacobiSVD<Mat> svd(S);
  const Mat VW = y.V * y.W;
  Eigen::JacobiSVD<Mat> svd_vw(VW);
  for (int r : {1, 3, 5}) {
    const Mat err = y.Q * cols(f.k.dec_cols(r), d, r) * cols(f.k.enc_cols(r), d, r).transpose() *
                        y.K.transpose() -
                    S;
    double opt = 0;
    for (int i = r; i < svd.singularValues().size(); ++i)
      opt += std::pow(svd.singularValues()(i), 2);
    EXPECT_NEAR(err.squaredNorm() / S.squaredNorm(), opt / S.squaredNorm(), 1e-4) << "rank " << r;
    EXPECT_NEAR(kq_score_rel_error(y.s, f.k, r), opt / S.squaredNorm(), 1e-4) << "rank " << r;
    // energies are the squared singular values of Q·Kᵀ
    EXPECT_NEAR(f.k.energy[r - 1] / S.squaredNorm(),
                std::pow(svd.singularValues()(r - 1), 2) / S.squaredNorm(), 1e-6);
    // values: ‖V E_r D_rᵀ W − V W‖² = Σ_{i>r} σ_i²(V·W)
    const Mat errv =
        y.V * cols(f.v.enc_cols(r), d, r) * cols(f.v.dec_cols(r), d, r).transpose() * y.W - VW;
    double optv = 0;
    for (int i = r; i < svd_vw.singularValues().size(); ++i)
      optv += std::pow(svd_vw.singularValues()(i), 2);
    EXPECT_NEAR(errv.squaredNorm() / VW.squaredNorm(), optv / VW.squaredNorm(), 1e-4)
        << "rank " << r;
    EXPECT_NEAR(vo_rel_error(y.s, f.v, r), optv / VW.squaredNorm(), 1e-4) << "rank " << r;
  }
}

TEST(Fit, RankSelection) {
  SideFit f;
  f.d = 4;
  f.energy = {5, 3, 1.5, 0.5};  // total 10
  EXPECT_EQ(f.rank_for_energy(0.5), 1);
  EXPECT_EQ(f.rank_for_energy(0.51), 2);
  EXPECT_EQ(f.rank_for_energy(0.8), 2);
  EXPECT_EQ(f.rank_for_energy(0.95), 3);
  EXPECT_EQ(f.rank_for_energy(1.0), 4);
  EXPECT_THROW(f.rank_for_energy(0), Error);
  EXPECT_EQ(rank_for_ratio(0.5, 64), 32);
  EXPECT_EQ(rank_for_ratio(0.001, 64), 1);
  EXPECT_EQ(rank_for_ratio(1.0, 64), 64);
  EXPECT_THROW(rank_for_ratio(1.5, 64), Error);
  EXPECT_THROW(rank_for_ratio(0, 64), Error);
  EXPECT_EQ(parse_basis_method("kqsvd"), BasisMethod::kKqSvd);
  try {
    parse_basis_method("nope");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("eigenattention"), std::string::npos);
  }
}

// A saved calibration of the tiny llama model (all methods, stats, layer io).
struct Saved {
  TinyRun run;
  Calibration calib;
  std::string path;
};

Saved make_saved(const std::string& tag) {
  Saved s;
  s.run = run_tiny(Arch::kLlama, 5, 8);
  const HParams& hp = s.run.model->hparams();
  s.calib = Calibration(model_fingerprint(*s.run.model), hp.n_layer, hp.n_head_kv);
  for (BasisMethod m : all_basis_methods()) s.calib.set_fits(m, fit_all(m, s.run.stats));
  s.calib.set_stats(s.run.stats);
  s.calib.set_layer_io(s.run.io);
  s.calib.meta["text"] = "synthetic";
  s.path = test::temp_dir("calib_file_" + tag) + "/tiny.kvcalib";
  s.calib.save(s.path);
  return s;
}

void expect_rounded(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i], static_cast<double>(static_cast<float>(want[i])));
}

TEST(CalibrationFile, RoundTrip) {
  const Saved s = make_saved("roundtrip");
  EXPECT_FALSE(std::ifstream(s.path + ".tmp").good());  // the temporary was renamed
  const Calibration c = Calibration::load(s.path, s.run.model.get());
  EXPECT_EQ(c.fingerprint(), model_fingerprint(*s.run.model));
  EXPECT_EQ(c.n_layer(), s.calib.n_layer());
  EXPECT_EQ(c.n_head_kv(), s.calib.n_head_kv());
  EXPECT_EQ(c.methods(), all_basis_methods());
  EXPECT_EQ(c.meta.at("text"), "synthetic");
  for (BasisMethod m : all_basis_methods())
    for (int il = 0; il < c.n_layer(); ++il)
      for (int ih = 0; ih < c.n_head_kv(); ++ih) {
        const HeadFit &a = c.fit(m, il, ih), &b = s.calib.fit(m, il, ih);
        EXPECT_EQ(a.k.enc, b.k.enc);
        EXPECT_EQ(a.k.dec, b.k.dec);
        EXPECT_EQ(a.v.enc, b.v.enc);
        EXPECT_EQ(a.v.dec, b.v.dec);
        expect_rounded(a.k.energy, b.k.energy);
        expect_rounded(a.v.energy, b.v.energy);
        const HeadStats &x = c.stats(il, ih), &y = s.calib.stats(il, ih);
        EXPECT_EQ(x.n_tokens, y.n_tokens);
        EXPECT_EQ(x.n_group, y.n_group);
        expect_rounded(x.gram_k, y.gram_k);
        expect_rounded(x.gram_q, y.gram_q);
        expect_rounded(x.gram_v, y.gram_v);
        expect_rounded(x.gram_k_pre, y.gram_k_pre);
        expect_rounded(x.gram_q_pre, y.gram_q_pre);
        expect_rounded(x.gram_vo, y.gram_vo);
        expect_rounded(x.sum_k, y.sum_k);
        expect_rounded(x.sum_v, y.sum_v);
        expect_rounded(x.sum_k_pre, y.sum_k_pre);
      }
  ASSERT_TRUE(c.has_layer_io());
  for (int il = 0; il < c.n_layer(); ++il) {
    EXPECT_EQ(c.layer_io(il).n_rows, 8);
    EXPECT_EQ(c.layer_io(il).x_in, s.calib.layer_io(il).x_in);
    EXPECT_EQ(c.layer_io(il).x_out, s.calib.layer_io(il).x_out);
  }
  // saving what was loaded gives the same file
  const std::string again = s.path + ".again";
  c.save(again);
  EXPECT_EQ(read_bytes(again), read_bytes(s.path));
  EXPECT_THROW(c.fit(BasisMethod::kKqSvd, c.n_layer(), 0), Error);
}

TEST(CalibrationFile, WrongModelNamesBothFingerprints) {
  const Saved s = make_saved("wrongmodel");
  auto other = Model::load(
      test::write_tiny_model(test::tiny_spec(Arch::kLlama, 9), test::temp_dir("calib_other")));
  const ModelFingerprint a = model_fingerprint(*s.run.model), b = model_fingerprint(*other);
  EXPECT_NE(a.weights_hash, b.weights_hash);
  expect_load_error(s.path, other.get(), {s.path, "another model", a.describe(), b.describe()});
  EXPECT_NO_THROW(Calibration::load(s.path));  // without a model, any fingerprint loads
}

TEST(CalibrationFile, TruncatedDamagedAndForeignFiles) {
  const Saved s = make_saved("damage");
  const std::string bytes = read_bytes(s.path);
  const std::string dir = test::temp_dir("calib_damage");
  for (size_t cut : {size_t{0}, size_t{4}, size_t{16}, size_t{200}, bytes.size() / 3,
                     bytes.size() / 2, bytes.size() - 40}) {
    const std::string p = dir + "/cut_" + std::to_string(cut) + ".kvcalib";
    write_bytes(p, bytes.substr(0, cut));
    expect_load_error(p, nullptr, {p});
  }
  // one flipped bit inside tensor data: the GGUF structure is intact, the checksum is not
  std::string flipped = bytes;
  flipped[bytes.size() - 100] ^= 0x10;
  write_bytes(dir + "/flipped.kvcalib", flipped);
  expect_load_error(dir + "/flipped.kvcalib", nullptr, {"damaged", "checksum"});
  // another format version: patch the u32 value after the key "kvtrim.calibration.version"
  const std::string key = "kvtrim.calibration.version";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  std::string other_version = bytes;
  const uint32_t v99 = 99;
  std::memcpy(other_version.data() + at + key.size() + 4, &v99, 4);  // skip the value type (u32)
  write_bytes(dir + "/v99.kvcalib", other_version);
  expect_load_error(dir + "/v99.kvcalib", nullptr, {"format version 99", "versions 1 to 3"});
  // a tensor missing (renamed in the tensor table; names are not part of the data checksum)
  const std::string tname = "blk.1.kqsvd.v_dec";
  const size_t tat = bytes.find(tname);
  ASSERT_NE(tat, std::string::npos);
  std::string renamed = bytes;
  renamed[tat + tname.size() - 1] = 'X';
  write_bytes(dir + "/renamed.kvcalib", renamed);
  expect_load_error(dir + "/renamed.kvcalib", nullptr, {"missing tensor", tname});
  // a GGUF that is not a calibration (a model), a missing file, not a GGUF at all
  const std::string model_gguf = test::write_tiny_model(test::tiny_spec(Arch::kLlama, 5), dir);
  expect_load_error(model_gguf, nullptr, {"not a kvtrim calibration file", "llama"});
  expect_load_error(dir + "/missing.kvcalib", nullptr, {"does not exist"});
  write_bytes(dir + "/text.kvcalib", "hello, this is not a gguf file at all");
  expect_load_error(dir + "/text.kvcalib", nullptr, {"not a readable GGUF"});
}

}  // namespace
}  // namespace kvtrim
