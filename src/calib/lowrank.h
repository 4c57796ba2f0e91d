// Small dense linear algebra for low-rank KV methods (DESIGN.md §4.3, §4.5): orthonormalisation,
// Oja's subspace update, pooling, eigenvectors of Gram matrices, and the diagnostics OjaKV
// reports (residual-energy ratio, subspace overlap). Matrices are row-major; a basis U [d, r]
// holds one direction per column.
#pragma once
#include <cstdint>
#include <vector>

namespace kvtrim {

// The first r columns of a square U [d, d] as a row-major [d, r] matrix (0 <= r <= d).
std::vector<float> first_columns(const std::vector<float>& U, int d, int r);

// Orthonormalises the columns of U [d, r] in place (r <= d): U ← Q of U = QR with R's
// diagonal made positive (so an orthonormal U is unchanged up to rounding). A column that
// becomes numerically zero is replaced by a unit vector orthogonal to the previous ones.
void orthonormalize(float* U, int d, int r);

// One batch step of Oja's rule on U [d, r] (orthonormal columns) with samples X [n, d]:
// C = XᵀX / n, U ← U + η (C U − U (Uᵀ C U)), then orthonormalize(U). n == 0: no change.
void oja_update(float* U, int d, int r, const float* X, int64_t n, double eta);

// Average pooling of consecutive rows: X [n, d] -> [ceil(n / p), d] (the last group may hold
// fewer rows; p >= 1; p == 1 copies).
std::vector<float> avg_pool_rows(const float* X, int64_t n, int d, int p);

// Eigen-decomposition of a symmetric G [d, d] (f64): the top r eigenvectors as U [d, r]
// (columns sorted by decreasing eigenvalue, each with its largest-magnitude entry positive, so
// the result is deterministic) and all d eigenvalues, decreasing (eig may be nullptr).
void top_eigenvectors(const double* G, int d, int r, std::vector<float>* U, std::vector<double>* eig);

// Residual-energy ratio ‖X − X U Uᵀ‖²_F / ‖X‖²_F of X [n, d] in the orthonormal basis U [d, r]
// (0 when X is zero), and the same from X's Gram matrix G = XᵀX [d, d]: 1 − tr(Uᵀ G U) / tr(G).
double residual_energy_ratio(const float* X, int64_t n, int d, const float* U, int r);
double residual_energy_ratio_gram(const double* G, int d, const float* U, int r);

// Subspace overlap SO(U1, U2) = tr(U1ᵀ U2 U2ᵀ U1) / r1 of U1 [d, r1] and U2 [d, r2] (both
// orthonormal): 1 when span(U1) ⊆ span(U2), 0 when orthogonal.
double subspace_overlap(const float* U1, int r1, const float* U2, int r2, int d);

}  // namespace kvtrim
