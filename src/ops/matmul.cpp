// matvec / matmul / get_row: threading, activation quantization and the prefill GEMM path
// around the per-ISA kernels of matmul_kernels.cpp.
//
// matvec (decode): x is quantized once to 8 bits (see matmul_internal.h), then the rows of
//   W are split over the pool in contiguous ranges of kRowGrain-row chunks, a thread done with
//   its own range finishing the back of a late one's (for_rows, kStealPieces); each thread runs
//   the integer dot kernel on the quantized blocks directly (no dequantized copy of W).
// matmul (prefill):
//   n_tok < kGemmMinTok, or (int8_prefill()) any n_tok for the types with an integer prefill
//     kernel on this CPU (detail::has_strip_kernel: Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q8_0 with VNNI,
//     Q6_K with AVX-512 VNNI): the same integer kernel, each weight row (strip of 8 rows) reused
//     from L1 for all tokens; with AVX-512 VNNI, Q4_K and Q6_K from 2 tokens on and the legacy
//     types from 16 take 16-row tiles, each block decoded once for all tokens
//     (ops/kquant_tiles-inl.h). The
//     strips beat the f32 sgemm below at every token count: SmolLM2's weights (Q4_1 + Q8_0),
//     2 threads, Zen 4, kvtrim_bench_kernels BM_SmolLM2Token, min of 5: 16 tokens 9.7 vs
//     28.0 ms, 64 30.8 vs 68.7, 128 58.5 vs 122, 512 222 vs 451 ms;
//   otherwise: each thread dequantizes tiles of W rows (~4 MiB of f32, gemm_tile_rows) into a
//     private f32 buffer and calls single-threaded OpenBLAS cblas_sgemm (x · tileᵀ), writing
//     its columns of y in place. The tile is dequantized once per call and reused for all n_tok tokens,
//     so the dequantization cost is amortized and the product runs at sgemm speed.
// ref::: scalar dequantize_row + double accumulation (the ground truth of the tests).

#include "ops/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/quant_blocks.h"
#include "core/thread_pool.h"
#include "ops/dequant.h"
#include "ops/matmul_internal.h"

namespace kvtrim {

namespace detail {

bool matmul_supported(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

ActFormat act_format(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
    case GgmlType::IQ4_NL:
      return ActFormat::kQ8A;
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::IQ4_XS:
      return ActFormat::kQ8K;
    default:
      return ActFormat::kF32;
  }
}

size_t act_row_bytes(ActFormat f, int64_t n_cols) {
  switch (f) {
    case ActFormat::kQ8A:
      return static_cast<size_t>(n_cols / kQK) * sizeof(BlockQ8A);
    case ActFormat::kQ8K:
      return static_cast<size_t>(n_cols / kQK_K) * sizeof(BlockQ8_K);
    case ActFormat::kF32:
      break;
  }
  return static_cast<size_t>(n_cols) * sizeof(float);
}

}  // namespace detail

namespace {

using detail::ActFormat;

constexpr int64_t kRowGrain = 16;           // matvec rows per chunk (a few cache lines of y)
constexpr int64_t kGemmMinTok = kMatmulGemmMinTokens;  // from this many tokens on, matmul uses sgemm
// f32 tile of W per sgemm call. OpenBLAS packs all of x (n_tok x n_cols) again in every call,
// so the tile is sized to amortize that packing rather than to fit a cache (OpenBLAS blocks the
// tile for the caches itself). Measured on Qwen2.5-1.5B pp512, 2 threads: 1 MiB 37-38 tok/s
// (x packing 20 % of the time), 2-8 MiB 40-46 tok/s, 64 MiB 41.
constexpr size_t kGemmTileBytes = size_t{4} << 20;

// Rows per dequantized tile: kGemmTileBytes of f32, a multiple of 16, in [16, 4096].
int64_t gemm_tile_rows(int64_t n_cols) {
  const int64_t r =
      static_cast<int64_t>(kGemmTileBytes / (sizeof(float) * static_cast<size_t>(n_cols)));
  return std::clamp<int64_t>(r / 16 * 16, 16, 4096);
}

void check_weight(const WeightView& w) {
  KVTRIM_CHECK(detail::matmul_supported(w.type), "matmul: unsupported weight type %s",
               std::string(ggml_type_name(w.type)).c_str());
  const int64_t bs = ggml_traits(w.type).block_size;
  KVTRIM_CHECK(w.n_cols > 0 && w.n_cols % bs == 0,
               "matmul: n_cols %lld is not a multiple of the %s block size %lld",
               static_cast<long long>(w.n_cols), std::string(ggml_type_name(w.type)).c_str(),
               static_cast<long long>(bs));
  KVTRIM_CHECK(w.row_bytes == ggml_row_size(w.type, w.n_cols),
               "matmul: row_bytes %zu != %zu for %s x %lld", w.row_bytes,
               ggml_row_size(w.type, w.n_cols), std::string(ggml_type_name(w.type)).c_str(),
               static_cast<long long>(w.n_cols));
}

// Per-thread scratch (the caller's is used for the quantized activation, workers' for tiles).
std::vector<uint8_t>& act_scratch() {
  thread_local std::vector<uint8_t> buf;
  return buf;
}
std::vector<float>& tile_scratch() {
  thread_local std::vector<float> buf;
  return buf;
}

// The integer kernels' rows: each thread's range in kStealPieces runs, the runs of a late
// thread finished by the others (ThreadPool::parallel_for_stealing; a row's result does not
// depend on which thread computes it). Measured on the 2-core Zen 4 VM (perf of `kvtrim bench
// --streams 4`): with halves fixed per thread each thread waited for the other at the end of a
// product for ~9-16 % of its samples (docs/results/perf §12).
constexpr int kStealPieces = 4;

// Runs fn(r0, r1) over [0, n_rows) split in contiguous grain-multiple ranges per thread
// (pieces > 1: each range in that many runs, stolen from the back by a thread done with its
// own). The closure given to the pool captures one pointer, so std::function does not allocate.
template <typename Fn>
void for_rows(ThreadPool* pool, int64_t n_rows, int64_t grain, const Fn& fn, int pieces = 1) {
  if (pool == nullptr || pool->n_threads() <= 1 || n_rows <= grain) {
    fn(int64_t{0}, n_rows);
    return;
  }
  const Fn* f = &fn;
  pool->parallel_for_stealing(
      n_rows, [f](int64_t b, int64_t e) { (*f)(b, e); }, grain, pieces);
}

std::atomic<bool> g_int8_prefill{false};

}  // namespace

bool matmul_token_exact(const WeightView& w) {
  return g_int8_prefill.load(std::memory_order_relaxed) && detail::has_strip_kernel(w.type);
}

namespace {

// The integer kernel for n_tok tokens of w (else the sgemm path).
bool integer_path(const WeightView& w, int64_t n_tok) {
  return n_tok < kGemmMinTok || matmul_token_exact(w);
}

// dst [n_tok rows of `stride` bytes] = x [n_tok, n_cols] quantized to f; a prefill's rows over
// the pool (a decode step's few rows are not worth a round trip).
void quantize_rows(ActFormat f, const float* x, int64_t n_tok, int64_t n_cols, uint8_t* dst, size_t stride,
                   ThreadPool* pool) {
  constexpr int64_t kPoolMinRows = 16;
  for_rows(n_tok >= kPoolMinRows ? pool : nullptr, n_tok, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) detail::quantize_act(f, x + t * n_cols, dst + static_cast<size_t>(t) * stride, n_cols);
  });
}

void ensure_blas_single_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace

void set_int8_prefill(bool on) {
  g_int8_prefill.store(on, std::memory_order_relaxed);
}
bool int8_prefill() {
  return g_int8_prefill.load(std::memory_order_relaxed);
}

void matvec(const WeightView& w, const float* x, float* y, ThreadPool* pool) {
  check_weight(w);
  const ActFormat f = detail::act_format(w.type);
  const void* act = x;
  if (f != ActFormat::kF32) {
    auto& buf = act_scratch();
    buf.resize(detail::act_row_bytes(f, w.n_cols));
    detail::quantize_act(f, x, buf.data(), w.n_cols);
    act = buf.data();
  }
  for_rows(
      pool, w.n_rows, kRowGrain, [&](int64_t r0, int64_t r1) { detail::dot_rows(w, r0, r1, act, 0, 1, y, 0); },
      kStealPieces);
}

void matmul(const WeightView& w, const float* x, int64_t n_tok, float* y, ThreadPool* pool) {
  check_weight(w);
  if (n_tok <= 0) return;
  if (n_tok == 1) {
    matvec(w, x, y, pool);
    return;
  }
  const int64_t n_rows = w.n_rows, n_cols = w.n_cols;
  if (integer_path(w, n_tok)) {
    const ActFormat f = detail::act_format(w.type);
    const size_t stride = detail::act_row_bytes(f, n_cols);
    const void* act = x;
    if (f != ActFormat::kF32) {
      auto& buf = act_scratch();
      buf.resize(stride * static_cast<size_t>(n_tok));
      quantize_rows(f, x, n_tok, n_cols, buf.data(), stride, pool);
      act = buf.data();
    }
    for_rows(
        pool, n_rows, kRowGrain,
        [&](int64_t r0, int64_t r1) { detail::dot_rows(w, r0, r1, act, stride, n_tok, y, n_rows); }, kStealPieces);
    return;
  }
  ensure_blas_single_thread();
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t tile_rows = gemm_tile_rows(n_cols);
  // Split rows evenly over the threads (in multiples of 16), tiles within each range.
  const int64_t n_thr = pool ? pool->n_threads() : 1;
  const int64_t grain = std::max<int64_t>(16, (n_rows + n_thr - 1) / n_thr / 16 * 16);
  for_rows(pool, n_rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t t0 = r0; t0 < r1; t0 += tile_rows) {
      const int64_t nr = std::min(tile_rows, r1 - t0);
      const float* tile;
      if (w.type == GgmlType::F32) {
        tile = reinterpret_cast<const float*>(base + static_cast<size_t>(t0) * w.row_bytes);
      } else {
        auto& buf = tile_scratch();
        buf.resize(static_cast<size_t>(nr * n_cols));
        dequantize_rows_simd(w.type, base + static_cast<size_t>(t0) * w.row_bytes, w.row_bytes, buf.data(), nr,
                             n_cols);
        tile = buf.data();
      }
      // y[:, t0:t0+nr] = x[n_tok, n_cols] · tile[nr, n_cols]ᵀ
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n_tok),
                  static_cast<int>(nr), static_cast<int>(n_cols), 1.0f, x, static_cast<int>(n_cols),
                  tile, static_cast<int>(n_cols), 0.0f, y + t0, static_cast<int>(n_rows));
    }
  });
}

void matmul_jobs(const MatmulJob* jobs, int n, ThreadPool* pool) {
  // the jobs on the integer kernels run together; the others (sgemm path) one by one
  std::vector<int> together;
  together.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const MatmulJob& j = jobs[i];
    check_weight(*j.w);
    if (j.n_tok <= 0) continue;
    if (integer_path(*j.w, j.n_tok)) {
      together.push_back(i);
    } else {
      matmul(*j.w, j.x, j.n_tok, j.y, pool);
    }
  }
  if (together.empty()) return;
  if (together.size() == 1) {
    const MatmulJob& j = jobs[together[0]];
    matmul(*j.w, j.x, j.n_tok, j.y, pool);
    return;
  }
  // each distinct (x, activation format) quantized once, the jobs' rows laid end to end
  const size_t m = together.size();
  thread_local std::vector<std::vector<uint8_t>> bufs;
  std::vector<const void*> act(m);
  std::vector<size_t> stride(m);
  std::vector<int64_t> row0(m + 1, 0);
  size_t n_bufs = 0;
  for (size_t t = 0; t < m; ++t) {
    const MatmulJob& j = jobs[together[t]];
    const ActFormat f = detail::act_format(j.w->type);
    stride[t] = detail::act_row_bytes(f, j.w->n_cols);
    row0[t + 1] = row0[t] + j.w->n_rows;
    act[t] = j.x;
    if (f == ActFormat::kF32) continue;  // read as it is
    size_t same = t;
    for (size_t u = 0; u < t && same == t; ++u) {
      const MatmulJob& o = jobs[together[u]];
      if (o.x == j.x && o.n_tok == j.n_tok && detail::act_format(o.w->type) == f && o.w->n_cols == j.w->n_cols) same = u;
    }
    if (same != t) {
      act[t] = act[same];
      continue;
    }
    if (bufs.size() <= n_bufs) bufs.resize(n_bufs + 1);
    auto& buf = bufs[n_bufs++];
    buf.resize(stride[t] * static_cast<size_t>(j.n_tok));
    quantize_rows(f, j.x, j.n_tok, j.w->n_cols, buf.data(), stride[t], pool);
    act[t] = buf.data();
  }
  for_rows(
      pool, row0[m], kRowGrain,
      [&](int64_t r0, int64_t r1) {
        // the first job whose rows reach past r0
        size_t t = static_cast<size_t>(std::upper_bound(row0.begin(), row0.end(), r0) - row0.begin()) - 1;
        for (; t < m && row0[t] < r1; ++t) {
          const MatmulJob& j = jobs[together[t]];
          const int64_t b = std::max(r0, row0[t]), e = std::min(r1, row0[t + 1]);
          if (b < e)
            detail::dot_rows(*j.w, b - row0[t], e - row0[t], act[t], stride[t], j.n_tok, j.y,
                             j.n_tok > 1 ? j.w->n_rows : 0);
        }
      },
      kStealPieces);
}

void matmul_many(const WeightView* const* ws, float* const* ys, int n, const float* x, int64_t n_tok,
                 ThreadPool* pool) {
  constexpr int kMax = 16;
  KVTRIM_CHECK(n <= kMax, "matmul_many: %d weights (at most %d)", n, kMax);
  MatmulJob jobs[kMax];
  for (int i = 0; i < n; ++i) {
    KVTRIM_CHECK(ws[i]->n_cols == ws[0]->n_cols, "matmul_many: weights with %lld and %lld columns",
                 static_cast<long long>(ws[0]->n_cols), static_cast<long long>(ws[i]->n_cols));
    jobs[i] = MatmulJob{ws[i], x, n_tok, ys[i]};
  }
  matmul_jobs(jobs, n, pool);
}

void get_row(const WeightView& w, int64_t row, float* out) {
  KVTRIM_CHECK(row >= 0 && row < w.n_rows, "get_row: row %lld out of range [0, %lld)",
               static_cast<long long>(row), static_cast<long long>(w.n_rows));
  dequantize_row(w.type,
                 static_cast<const uint8_t*>(w.data) + static_cast<size_t>(row) * w.row_bytes, out,
                 w.n_cols);
}

namespace ref {

void matvec(const WeightView& w, const float* x, float* y) {
  matmul(w, x, 1, y);
}

void matmul(const WeightView& w, const float* x, int64_t n_tok, float* y) {
  std::vector<float> row(static_cast<size_t>(w.n_cols));
  for (int64_t r = 0; r < w.n_rows; ++r) {
    dequantize_row(w.type,
                   static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_bytes,
                   row.data(), w.n_cols);
    for (int64_t t = 0; t < n_tok; ++t) {
      const float* xt = x + t * w.n_cols;
      double acc = 0.0;
      for (int64_t i = 0; i < w.n_cols; ++i)
        acc += static_cast<double>(row[static_cast<size_t>(i)]) * xt[i];
      y[t * w.n_rows + r] = static_cast<float>(acc);
    }
  }
}

}  // namespace ref

}  // namespace kvtrim
