// StiefAttention's basis predictor: MLP, QR and their backward passes, AdamW (see
// stief_predictor.h). Everything here is small (d ≤ 256, hidden ~128), so it runs in f64.
#include "calib/stief_predictor.h"

#include <Eigen/Dense>
#include <cmath>
#include <random>

#include "core/error.h"

namespace kvtrim {

namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapD = Eigen::Map<MatD>;
using MapCD = Eigen::Map<const MatD>;

double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_grad(double x) {
  const double cdf = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
  const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
  return cdf + x * pdf;
}

constexpr double kLnEps = 1e-5;

}  // namespace

void qr_positive(const std::vector<double>& A, int d, std::vector<double>* Q,
                 std::vector<double>* R) {
  const MapCD Am(A.data(), d, d);
  Eigen::HouseholderQR<MatD> qr(Am);
  MatD Qm = qr.householderQ();
  MatD Rm = qr.matrixQR().triangularView<Eigen::Upper>();
  for (int i = 0; i < d; ++i) {
    KVTRIM_CHECK(std::abs(Rm(i, i)) > 1e-12 * std::max(1.0, Rm.cwiseAbs().maxCoeff()),
                 "QR of a singular %dx%d matrix (column %d is dependent on the previous ones)",
                 d, d, i);
    if (Rm(i, i) < 0) {
      Qm.col(i) *= -1;
      Rm.row(i) *= -1;
    }
  }
  Q->assign(Qm.data(), Qm.data() + Qm.size());
  R->assign(Rm.data(), Rm.data() + Rm.size());
}

std::vector<double> qr_backward(const std::vector<double>& Q, const std::vector<double>& R,
                                const std::vector<double>& qbar, int d) {
  const MapCD Qm(Q.data(), d, d), Rm(R.data(), d, d), Qb(qbar.data(), d, d);
  const MatD M = -(Qb.transpose() * Qm);
  MatD C = M.triangularView<Eigen::Lower>();
  C.triangularView<Eigen::StrictlyUpper>() = M.transpose().triangularView<Eigen::StrictlyUpper>();
  const MatD X = Qb + Qm * C;  // Ā = X·R⁻ᵀ  ⇔  R·Āᵀ = Xᵀ
  const MatD At = Rm.triangularView<Eigen::Upper>().solve(X.transpose());
  const MatD Abar = At.transpose();
  return std::vector<double>(Abar.data(), Abar.data() + Abar.size());
}

BasisPredictor::BasisPredictor(int d, int hidden, uint64_t seed, const std::vector<float>& init,
                               double head_scale)
    : d_(d), hidden_(hidden) {
  KVTRIM_CHECK(d >= 1 && hidden >= 1, "basis predictor: d = %d and hidden = %d must be >= 1", d,
               hidden);
  KVTRIM_CHECK(init.empty() || init.size() == static_cast<size_t>(d) * d,
               "basis predictor: initial basis has %zu values, expected %d x %d", init.size(), d, d);
  size_t off = 0;
  auto lin = [&](int n_in, int n_out) {
    Lin l{off, off + static_cast<size_t>(n_in) * n_out, n_in, n_out};
    off = l.b + static_cast<size_t>(n_out);
    return l;
  };
  auto ln = [&](int n) {
    Ln l{off, off + static_cast<size_t>(n)};
    off = l.b + static_cast<size_t>(n);
    return l;
  };
  lin_[0] = lin(2 * d, hidden);
  ln_[0] = ln(hidden);
  lin_[1] = lin(hidden, hidden);
  ln_[1] = ln(hidden);
  lin_[2] = lin(hidden, hidden);
  ln_[2] = ln(hidden);
  head_ = lin(hidden, d * d);
  theta_.assign(off, 0.0);
  grad_.assign(off, 0.0);
  m_.assign(off, 0.0);
  v_.assign(off, 0.0);
  // PyTorch's defaults: Linear weights and biases U(±1/sqrt(n_in)); LayerNorm gain 1, bias 0.
  std::mt19937_64 rng(seed);
  auto fill_lin = [&](const Lin& l, double scale) {
    std::uniform_real_distribution<double> u(-1.0 / std::sqrt(l.n_in), 1.0 / std::sqrt(l.n_in));
    for (size_t i = l.w; i < l.b + static_cast<size_t>(l.n_out); ++i) theta_[i] = scale * u(rng);
  };
  for (int i = 0; i < 3; ++i) {
    fill_lin(lin_[i], 1.0);
    for (int j = 0; j < hidden; ++j) theta_[ln_[i].g + static_cast<size_t>(j)] = 1.0;
  }
  if (init.empty()) {
    fill_lin(head_, 1.0);
  } else {
    fill_lin(head_, head_scale);
    for (size_t i = 0; i < init.size(); ++i) theta_[head_.b + i] = init[i];
  }
}

void BasisPredictor::forward(const std::vector<float>& features) {
  KVTRIM_CHECK(features.size() == static_cast<size_t>(2 * d_),
               "basis predictor: %zu features, expected %d", features.size(), 2 * d_);
  z_[0].assign(features.begin(), features.end());
  for (int l = 0; l < 3; ++l) {
    const Lin& L = lin_[l];
    const MapCD W(theta_.data() + L.w, L.n_out, L.n_in);
    const Eigen::Map<const Eigen::VectorXd> b(theta_.data() + L.b, L.n_out);
    const Eigen::Map<const Eigen::VectorXd> z(z_[l].data(), L.n_in);
    const Eigen::VectorXd pre = W * z + b;
    pre_[l].assign(pre.data(), pre.data() + pre.size());
    std::vector<double> a(static_cast<size_t>(L.n_out));
    double mean = 0;
    for (int i = 0; i < L.n_out; ++i) mean += (a[i] = gelu(pre[i]));
    mean /= L.n_out;
    double var = 0;
    for (double x : a) var += (x - mean) * (x - mean);
    var /= L.n_out;
    inv_std_[l] = 1.0 / std::sqrt(var + kLnEps);
    xhat_[l].resize(a.size());
    z_[l + 1].resize(a.size());
    for (int i = 0; i < L.n_out; ++i) {
      xhat_[l][i] = (a[i] - mean) * inv_std_[l];
      z_[l + 1][i] = xhat_[l][i] * theta_[ln_[l].g + i] + theta_[ln_[l].b + i];
    }
  }
  const MapCD Wh(theta_.data() + head_.w, head_.n_out, head_.n_in);
  const Eigen::Map<const Eigen::VectorXd> bh(theta_.data() + head_.b, head_.n_out);
  const Eigen::VectorXd A = Wh * Eigen::Map<const Eigen::VectorXd>(z_[3].data(), hidden_) + bh;
  qr_positive(std::vector<double>(A.data(), A.data() + A.size()), d_, &Q_, &R_);
}

std::vector<float> BasisPredictor::predict(const std::vector<float>& features) {
  forward(features);
  return std::vector<float>(Q_.begin(), Q_.end());
}

void BasisPredictor::backward(const std::vector<float>& gU, int r) {
  KVTRIM_CHECK(r >= 1 && r <= d_ && gU.size() == static_cast<size_t>(d_) * r,
               "basis predictor: gradient of %zu values for rank %d", gU.size(), r);
  KVTRIM_CHECK(!Q_.empty(), "basis predictor: backward() before predict()");
  std::vector<double> qbar(static_cast<size_t>(d_) * d_, 0.0);
  for (int i = 0; i < d_; ++i)
    for (int j = 0; j < r; ++j)
      qbar[static_cast<size_t>(i) * d_ + j] = gU[static_cast<size_t>(i) * r + j];
  const std::vector<double> Abar = qr_backward(Q_, R_, qbar, d_);
  // Head: A = Wh z3 + bh.
  const Eigen::Map<const Eigen::VectorXd> dA(Abar.data(), head_.n_out);
  MapD(grad_.data() + head_.w, head_.n_out, head_.n_in).noalias() +=
      dA * Eigen::Map<const Eigen::VectorXd>(z_[3].data(), hidden_).transpose();
  Eigen::Map<Eigen::VectorXd>(grad_.data() + head_.b, head_.n_out) += dA;
  Eigen::VectorXd dz = MapCD(theta_.data() + head_.w, head_.n_out, head_.n_in).transpose() * dA;
  for (int l = 2; l >= 0; --l) {
    const Lin& L = lin_[l];
    const int n = L.n_out;
    // z = xhat·g + b (LayerNorm of a = gelu(pre)).
    Eigen::VectorXd dxhat(n);
    for (int i = 0; i < n; ++i) {
      grad_[ln_[l].g + i] += dz[i] * xhat_[l][i];
      grad_[ln_[l].b + i] += dz[i];
      dxhat[i] = dz[i] * theta_[ln_[l].g + i];
    }
    double mean_dx = 0, mean_dxx = 0;
    for (int i = 0; i < n; ++i) {
      mean_dx += dxhat[i];
      mean_dxx += dxhat[i] * xhat_[l][i];
    }
    mean_dx /= n;
    mean_dxx /= n;
    Eigen::VectorXd dpre(n);
    for (int i = 0; i < n; ++i) {
      const double da = inv_std_[l] * (dxhat[i] - mean_dx - xhat_[l][i] * mean_dxx);
      dpre[i] = da * gelu_grad(pre_[l][i]);
    }
    MapD(grad_.data() + L.w, n, L.n_in).noalias() +=
        dpre * Eigen::Map<const Eigen::VectorXd>(z_[l].data(), L.n_in).transpose();
    Eigen::Map<Eigen::VectorXd>(grad_.data() + L.b, n) += dpre;
    dz = MapCD(theta_.data() + L.w, n, L.n_in).transpose() * dpre;
  }
}

void BasisPredictor::step(double lr, double weight_decay) {
  constexpr double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  ++t_;
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(t_));
  const double c2 = 1.0 - std::pow(b2, static_cast<double>(t_));
  for (size_t i = 0; i < theta_.size(); ++i) {
    const double g = grad_[i];
    theta_[i] -= lr * weight_decay * theta_[i];
    m_[i] = b1 * m_[i] + (1 - b1) * g;
    v_[i] = b2 * v_[i] + (1 - b2) * g * g;
    theta_[i] -= lr * (m_[i] / c1) / (std::sqrt(v_[i] / c2) + eps);
    grad_[i] = 0;
  }
}

std::vector<float> basis_features(const float* X, int64_t n, int d, int64_t stride) {
  std::vector<double> mean(static_cast<size_t>(d), 0.0), sq(static_cast<size_t>(d), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int j = 0; j < d; ++j) {
      const double x = X[t * stride + j];
      mean[j] += x;
      sq[j] += x * x;
    }
  std::vector<double> f(static_cast<size_t>(2 * d));
  for (int j = 0; j < d; ++j) {
    const double m = n > 0 ? mean[j] / static_cast<double>(n) : 0.0;
    f[j] = m;
    f[d + j] = n > 0 ? std::max(0.0, sq[j] / static_cast<double>(n) - m * m) : 0.0;
  }
  double rms = 0;
  for (double x : f) rms += x * x;
  rms = std::sqrt(rms / static_cast<double>(f.size()));
  std::vector<float> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) out[i] = static_cast<float>(rms > 0 ? f[i] / rms : 0.0);
  return out;
}

}  // namespace kvtrim
