// Sparse coding over a dictionary (Lexico, DESIGN.md §4.1): orthogonal matching pursuit (OMP).
//
// A dictionary holds N atoms of dimension d, given as a basis is: D [d, N] row-major, column j =
// atom j (unit norm). OMP approximates x [d] by s atoms: s times, pick the atom
// most correlated with the residual (largest |⟨a_j, r⟩|, ties to the lower index), then refit
// every picked atom's coefficient by least squares (x ≈ A_S γ, an incrementally updated Cholesky
// factor of A_Sᵀ A_S) and recompute the residual r = x − A_S γ. A row stops early when its
// residual vanishes (‖r‖² <= 1e-12·‖x‖²) or the next atom is numerically dependent on the
// picked ones (Cholesky pivot² <= 1e-6); its remaining slots then take the lowest-numbered
// unused atoms with coefficient 0, so every row has exactly s entries.
#pragma once
#include <cstdint>

namespace kvtrim {
class ThreadPool;
}

namespace kvtrim::kv {

// Codes of the rows of X [n, d] (rows ldx apart): idx [n, s] (each row's atoms, strictly
// increasing) and coef [n, s] (their coefficients, in the same order). 1 <= s <= min(N, d).
// Rows are processed in blocks whose correlations are one sgemm per OMP step (pool: blocks in
// parallel; may be nullptr).
void omp_encode(const float* D, int d, int n_atoms, const float* x, int64_t n, int64_t ldx,
                int s, int32_t* idx, float* coef, ThreadPool* pool = nullptr);

// Rounding-aware coefficients for a store that keeps each row's entries on a coarse grid (fp8:
// one scale per row, scale = max|c| / 448, 3 mantissa bits): for each row's code (idx, coef from
// omp_encode, the support kept), the coefficients are fixed one at a time, largest first, each
// rounded to the grid and the still-free ones refitted by least squares to what the fixed ones
// leave of x. Rounding one coefficient then no longer leaves its error in x: the later ones
// absorb it. On return coef holds values on the grid (re-encoding them is exact up to the
// division by the scale). round(v, scale) gives the grid value nearest v.
using GridRound = float (*)(float v, float scale);
void refit_rounded(const float* D, int d, int n_atoms, const float* x, int64_t n, int64_t ldx, int s,
                   const int32_t* idx, float* coef, GridRound round, float grid_max);
// fp8 E4M3's grid with a row scale (for refit_rounded): scale · fp8(v / scale).
float fp8_grid_round(float v, float scale);

// The same algorithm in double precision, one row at a time, correlations recomputed from the
// residual by plain loops, the least-squares fit solved from scratch each step (tests).
void omp_encode_reference(const float* D, int d, int n_atoms, const float* x, int64_t n,
                          int64_t ldx, int s, int32_t* idx, float* coef);

}  // namespace kvtrim::kv
