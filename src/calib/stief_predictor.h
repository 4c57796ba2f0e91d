// StiefAttention's basis predictor (DESIGN.md §4.3; docs/stiefattention.md): an MLP maps the
// per-dimension mean and variance of a layer's keys (or one kv head's values), a 2·d vector,
// through three hidden layers (each Linear → GELU → LayerNorm) and a linear head to a d×d
// matrix A; the basis is U = Q of A = QR (R with a positive diagonal), and a rank-r projector
// uses its first r columns. The gradient flows back through the QR (qr_backward) and the MLP;
// AdamW updates the parameters.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvtrim {

// A = QR of a square A [d, d] (row-major) with R's diagonal made positive. Throws Error when A
// is numerically singular (a zero diagonal entry of R).
void qr_positive(const std::vector<double>& A, int d, std::vector<double>* Q, std::vector<double>* R);
// ∂loss/∂A from ∂loss/∂Q (qbar [d, d]; R̄ = 0): Ā = (Q̄ + Q·copyltu(M))·R⁻ᵀ, M = −Q̄ᵀQ, where
// copyltu(M) is the symmetric matrix with M's lower triangle (Walter & Lehmann 2018).
std::vector<double> qr_backward(const std::vector<double>& Q, const std::vector<double>& R,
                                const std::vector<double>& qbar, int d);

class BasisPredictor {
 public:
  // d: head dimension; hidden: width of the hidden layers; seed: initial weights. init [d, d]
  // (row-major, orthonormal columns) or empty: with init, the head's bias is vec(init) and its
  // weights are scaled by head_scale, so the first prediction is ≈ init (a warm start);
  // without, A starts random (the head at PyTorch's default scale).
  BasisPredictor(int d, int hidden, uint64_t seed, const std::vector<float>& init,
                 double head_scale = 1e-2);

  int d() const { return d_; }
  size_t n_params() const { return theta_.size(); }

  // The basis U [d, d] (row-major; columns orthonormal, the first r span the rank-r subspace)
  // predicted from features [2·d]; keeps what backward() needs.
  std::vector<float> predict(const std::vector<float>& features);
  // Accumulates ∂loss/∂θ from ∂loss/∂U (gU [d, r], the first r columns; the rest are 0), for
  // the features of the last predict().
  void backward(const std::vector<float>& gU, int r);
  // One AdamW step (β = 0.9, 0.999, ε = 1e-8, decoupled weight decay) on the accumulated
  // gradient, which it then clears.
  void step(double lr, double weight_decay);

  // Flat parameters (tests: finite differences).
  std::vector<double>& params() { return theta_; }
  const std::vector<double>& grad() const { return grad_; }

 private:
  struct Lin {
    size_t w, b;
    int n_in, n_out;
  };
  struct Ln {
    size_t g, b;
  };
  void forward(const std::vector<float>& features);
  int d_, hidden_;
  std::vector<double> theta_, grad_, m_, v_;
  int64_t t_ = 0;
  Lin lin_[3], head_;
  Ln ln_[3];
  // last forward
  std::vector<double> z_[4];    // z_[0] = input, z_[l] = output of hidden layer l
  std::vector<double> pre_[3];  // Linear outputs
  std::vector<double> xhat_[3];  // normalised GELU outputs
  double inv_std_[3] = {0, 0, 0};
  std::vector<double> Q_, R_;
};

// The predictor's input from the rows X [n, d] (keys of every kv head, or one head's values):
// per-dimension mean and variance, concatenated, scaled to unit RMS (the paper gives no input
// normalisation; key variances in the hundreds would saturate the first GELU).
std::vector<float> basis_features(const float* X, int64_t n, int d, int64_t stride);

}  // namespace kvtrim
