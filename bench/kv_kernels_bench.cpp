// The attention kernels of one KV head (kv/attn_kernels.h) per storage format, against dense
// f16 measured in the same run and interleaved iteration by iteration (f16 call, then the
// format's call), so machine noise hits both alike.
//
//   build/<dir>/bench/kvtrim_bench_kernels --benchmark_filter=KvKernels --benchmark_min_time=0.5
//
// KvKernels/<model>/ctx:<n>/<fmt>/<mem>: scores + accumulate over all n tokens of one kv head,
// 1 thread, in blocks of 256 tokens as the cache's attention walks them (scores of the block
// for the group's n_g query heads, then Σ p·v with fixed weights; no softmax). Formats:
//   f16     attn_scores_f16 + attn_accum_f16 (the baseline itself: ratio 1)
//   q8      attn_scores_q8 + attn_accum_q8 (value scale folded into p per block)
//   q8q     the same with attn_scores_q8q: the query in 8 bits (QueryQ8, set once per call), not
//           yet what the cache runs (see attn_kernels.h)
//   fp8     attn_scores_fp8 + attn_accum_fp8 (value scale folded into p per block)
//   q4      attn_scores_q4 + attn_accum_q4
//   e5m2    attn_scores_dense + attn_accum_dense of fp8 E5M2 codes (no scale: the top byte
//           of an f16)
//   sp_f16  sparse_scores + sparse_accum, keys and values both T = d/4 entries per token, f16
//           values, uint8 channel indices, fixed count
//   sp_fp8  the same with fp8 values and a per-row f32 scale
//   mk_f16  masked_scores + masked_accum: the same T = d/4 kept coordinates per token as a
//           bitmask (ceil(d/8) bytes) instead of a list, f16 values (SWAN's layout)
//   spark   keys masked with SPARK's degenerate recovery at λ = 0.8 (T = d - int(0.8 d) kept, a
//           sign bit per coordinate, one f32 fill per token), values dense f16
// mem: "dram": each iteration takes the next of several copies of the head (about 64 MiB of
// dense f16 in all), so the data comes from memory as in a decode step over all layers;
// "hot": the same copy every iteration (cache resident: what the kernels' compute costs).
// Counters (medians over the iterations): f16_us, us (the format), ratio = us / f16_us,
// bytes_ratio = the format's K+V bytes (codes, scales, indices) / dense f16's. The reported
// time is the format's call.
//
// Shapes (query heads per kv head n_g, head dim): SmolLM2-135M 3 × 64, Qwen2.5-1.5B 6 × 128,
// Gemma3-270M 4 × 256.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "kv/attn_kernels.h"
#include "kv/kv_type.h"
#include "kv/quant_formats.h"

namespace kvtrim {
namespace {

struct Shape {
  const char* name;
  int n_g;  // query heads per kv head
  int64_t d;
};
constexpr Shape kShapes[] = {{"smollm2", 3, 64}, {"qwen2.5-1.5b", 6, 128}, {"gemma3-270m", 4, 256}};
constexpr size_t kDramBytes = size_t{64} << 20;  // dense f16 bytes walked in "dram" mode
constexpr int64_t kBlock = 256;                  // tokens per scores / accum call

enum class Fmt { kF16, kQ8, kQ8Q, kFP8, kQ4, kE5M2, kSpF16, kSpFP8, kMkF16, kSpark };
const char* fmt_name(Fmt f) {
  switch (f) {
    case Fmt::kF16:
      return "f16";
    case Fmt::kQ8:
      return "q8";
    case Fmt::kQ8Q:
      return "q8q";
    case Fmt::kFP8:
      return "fp8";
    case Fmt::kQ4:
      return "q4";
    case Fmt::kE5M2:
      return "e5m2";
    case Fmt::kSpF16:
      return "sp_f16";
    case Fmt::kSpFP8:
      return "sp_fp8";
    case Fmt::kMkF16:
      return "mk_f16";
    case Fmt::kSpark:
      return "spark";
  }
  return "";
}

// One kv head of n tokens in one format (only the fields the format uses are filled).
struct Head {
  std::vector<uint8_t> k, v;         // codes / elements (bytes)
  std::vector<float> ks, vs;         // q8 / fp8 / sparse fp8 per-token scales
  std::vector<uint16_t> ks16, vs16;  // q4 block scales
  std::vector<uint8_t> kidx, vidx;   // sparse channel indices [n, T], or bitmasks [n, ceil(d/8)]
  std::vector<uint8_t> ksign;        // spark: sign bits [n, ceil(d/8)]
  std::vector<float> kfill, kw;      // spark: fill per token, recovery weights [d]
  size_t bytes() const {
    return k.size() - (slack ? kv::kMaskedSlack : 0) + v.size() - (vslack ? kv::kMaskedSlack : 0) +
           4 * (ks.size() + vs.size()) +
           2 * (ks16.size() + vs16.size()) + kidx.size() + vidx.size() + ksign.size() +
           4 * (kfill.size() + kw.size());
  }
  bool slack = false, vslack = false;  // k / v hold kv::kMaskedSlack bytes past their entries (not counted)
};

// Random rows in [-1, 1) (the data does not change the kernels' speed).
struct Rng {
  uint64_t s;
  float next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<float>(s >> 40) * (2.f / 16777216.f) - 1.f;
  }
};

template <typename T>
T* as(std::vector<uint8_t>& b) {
  return reinterpret_cast<T*>(b.data());
}

// h's buffers sized for n tokens of width d in format f.
// The per-token counts of a head of width d: q4 blocks, the sparse rows' T = d/4 entries, mask
// bytes, and SPARK's kept keys at λ = 0.8.
struct Counts {
  int64_t nb, T, mb, Ts;
  explicit Counts(int64_t d)
      : nb(kv::q4_blocks(d)),
        T(d / 4),
        mb((d + 7) / 8),
        Ts(d - static_cast<int64_t>(0.8 * static_cast<double>(d))) {}
};

void size_head(Fmt f, int64_t n, int64_t d, Head& h) {
  const int64_t n_pad = (n + kv::kKeyTile - 1) / kv::kKeyTile * kv::kKeyTile;
  const auto [nb, T, mb, Ts] = Counts(d);
  switch (f) {
    case Fmt::kF16:
      h.k.resize(n_pad * d * 2), h.v.resize(n * d * 2);
      break;
    case Fmt::kQ8:
    case Fmt::kQ8Q:
    case Fmt::kFP8:
      h.k.resize(n_pad * d), h.v.resize(n * d), h.ks.resize(n_pad), h.vs.resize(n);
      break;
    case Fmt::kE5M2:
      h.k.resize(n_pad * d), h.v.resize(n * d);
      break;
    case Fmt::kQ4:
      h.k.resize(n_pad * d / 2), h.v.resize(n * kv::q4_row_bytes(d));
      h.ks16.resize(n_pad / kv::kKeyTile * nb * kv::kKeyTile), h.vs16.resize(n * nb);
      break;
    case Fmt::kSpF16:
    case Fmt::kSpFP8: {
      const size_t es = f == Fmt::kSpF16 ? 2 : 1;
      h.k.resize(n * T * es), h.v.resize(n * T * es), h.kidx.resize(n * T), h.vidx.resize(n * T);
      if (f == Fmt::kSpFP8) h.ks.resize(n), h.vs.resize(n);
      break;
    }
    case Fmt::kMkF16:
      h.k.resize(n * T * 2 + kv::kMaskedSlack), h.v.resize(n * T * 2 + kv::kMaskedSlack);
      h.kidx.resize(n * mb), h.vidx.resize(n * mb);
      h.slack = h.vslack = true;
      break;
    case Fmt::kSpark:
      h.k.resize(n * Ts * 2 + kv::kMaskedSlack), h.v.resize(n * d * 2);
      h.kidx.resize(n * mb), h.ksign.resize(n * mb), h.kfill.resize(n), h.kw.assign(d, 1.f);
      h.slack = true;
      break;
  }
}

Head make_head(Fmt f, int64_t n, int64_t d, uint64_t seed) {
  Head h;
  Rng rng{seed * 0x9e3779b97f4a7c15ull + 1};
  const auto [nb, T, mb, Ts] = Counts(d);
  std::vector<float> x(d);
  std::vector<int> ch(d);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  size_head(f, n, d, h);
  for (int64_t t = 0; t < n; ++t) {
    for (int side = 0; side < 2; ++side) {  // 0: key, 1: value
      for (float& e : x) e = rng.next();
      std::vector<uint8_t>& buf = side ? h.v : h.k;
      switch (f) {
        case Fmt::kF16:
          for (int64_t i = 0; i < d; ++i) {
            const int64_t at = side ? t * d + i : kv::key_tile_index(t, i, d);
            as<uint16_t>(buf)[at] = fp32_to_fp16(x[i]);
          }
          break;
        case Fmt::kQ8:
        case Fmt::kQ8Q:
        case Fmt::kFP8: {
          uint8_t* dst = side ? &buf[t * d] : &buf[kv::key_tile_index(t, 0, d)];
          const int64_t stride = side ? 1 : kv::kKeyTile;
          const float sc = f != Fmt::kFP8
                               ? kv::q8_encode(x.data(), d, reinterpret_cast<int8_t*>(dst), stride)
                               : kv::fp8_encode(x.data(), d, dst, stride);
          (side ? h.vs : h.ks)[t] = sc;
          break;
        }
        case Fmt::kE5M2: {
          std::vector<uint8_t> codes(d);
          kv_type(KvDtype::kE5M2).ops.encode(x.data(), d, codes.data(), false);
          for (int64_t i = 0; i < d; ++i)
            buf[side ? t * d + i : kv::key_tile_index(t, i, d)] = codes[i];
          break;
        }
        case Fmt::kQ4:
          if (side) {
            kv::q4_encode_row(x.data(), d, &buf[t * kv::q4_row_bytes(d)], &h.vs16[t * nb]);
          } else {
            kv::q4_encode_key(x.data(), d, t, buf.data(), h.ks16.data());
          }
          break;
        case Fmt::kSpF16:
        case Fmt::kSpFP8: {
          std::iota(ch.begin(), ch.end(), 0);
          std::shuffle(ch.begin(), ch.end(), gen);
          std::sort(ch.begin(), ch.begin() + T);
          std::vector<float> kept(T);
          for (int64_t j = 0; j < T; ++j) {
            (side ? h.vidx : h.kidx)[t * T + j] = static_cast<uint8_t>(ch[j]);
            kept[j] = x[ch[j]];
          }
          if (f == Fmt::kSpF16) {
            for (int64_t j = 0; j < T; ++j) as<uint16_t>(buf)[t * T + j] = fp32_to_fp16(kept[j]);
          } else {
            (side ? h.vs : h.ks)[t] = kv::fp8_encode(kept.data(), T, &buf[t * T], 1);
          }
          break;
        }
        case Fmt::kMkF16:
        case Fmt::kSpark: {
          if (f == Fmt::kSpark && side) {  // dense f16 values
            for (int64_t i = 0; i < d; ++i) as<uint16_t>(buf)[t * d + i] = fp32_to_fp16(x[i]);
            break;
          }
          const int64_t cnt = f == Fmt::kSpark ? Ts : T;
          std::iota(ch.begin(), ch.end(), 0);
          std::shuffle(ch.begin(), ch.end(), gen);
          std::sort(ch.begin(), ch.begin() + cnt);
          uint8_t* m = &(side ? h.vidx : h.kidx)[t * mb];
          for (int64_t j = 0; j < cnt; ++j) {
            m[ch[j] / 8] |= static_cast<uint8_t>(1u << (ch[j] % 8));
            as<uint16_t>(buf)[t * cnt + j] = fp32_to_fp16(x[ch[j]]);
          }
          if (f == Fmt::kSpark) {
            for (int64_t i = 0; i < d; ++i)
              if (x[i] < 0) h.ksign[t * mb + i / 8] |= static_cast<uint8_t>(1u << (i % 8));
            h.kfill[t] = 0.1f;
          }
          break;
        }
      }
    }
  }
  return h;
}

// The masked kernels' view of h's keys (value = false) or values.
kv::MaskedRows masked_rows(const Head& h, Fmt f, int64_t d, bool value) {
  kv::MaskedRows r;
  r.type = KvDtype::kF16;
  r.vals = value ? h.v.data() : h.k.data();
  r.mask = value ? h.vidx.data() : h.kidx.data();
  const Counts c(d);
  r.T = static_cast<int>(f == Fmt::kSpark ? c.Ts : c.T);
  if (f == Fmt::kSpark) {
    r.signs = h.ksign.data();
    r.fill = h.kfill.data();
    r.weight = h.kw.data();
  }
  r.dim = d;
  return r;
}

kv::SparseRows sparse_rows(const Head& h, Fmt f, int64_t d, bool value) {
  kv::SparseRows r;
  r.type = f == Fmt::kSpF16 ? KvDtype::kF16 : KvDtype::kFP8;
  r.vals = value ? h.v.data() : h.k.data();
  r.idx = value ? h.vidx.data() : h.kidx.data();
  r.idx_bytes = 1;
  r.T = static_cast<int>(Counts(d).T);
  r.scale = f == Fmt::kSpFP8 ? (value ? h.vs.data() : h.ks.data()) : nullptr;
  r.dim = d;
  return r;
}

// Scratch of one attention pass: q [n_g, d], s [n_g, kBlock], p [n_g, kBlock] (fixed
// weights), pv [n_g, kBlock] (p with the value scales folded in), acc [n_g, d].
struct Scratch {
  std::vector<float> q, s, p, pv, acc;
  Scratch(int n_g, int64_t d)
      : q(n_g * d), s(n_g * kBlock), p(n_g * kBlock), pv(n_g * kBlock), acc(n_g * d) {
    Rng rng{42};
    for (float& e : q) e = rng.next();
    for (float& e : p) e = 0.5f * (rng.next() + 1.f) / kBlock;
  }
};

// pv[g][t] = p[g][t] · vs[b + t]
void fold(Scratch& w, int n_g, const float* vs, int64_t nb) {
  for (int g = 0; g < n_g; ++g) {
    for (int64_t t = 0; t < nb; ++t) w.pv[g * kBlock + t] = w.p[g * kBlock + t] * vs[t];
  }
}

// Scores and accumulation over all n tokens of head h.
void attend(Fmt f, const Head& h, int n_g, int64_t d, int64_t n, Scratch& w) {
  std::fill(w.acc.begin(), w.acc.end(), 0.f);
  const kv::SparseRows rk = sparse_rows(h, f, d, false), rv = sparse_rows(h, f, d, true);
  const kv::MaskedRows mk = masked_rows(h, f, d, false), mv = masked_rows(h, f, d, true);
  thread_local kv::QueryQ8 q8q;  // the query in 8 bits, once per call (as the cache does)
  if (f == Fmt::kQ8Q) q8q.set(w.q.data(), n_g, d);
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t nb = std::min(kBlock, n - b);
    switch (f) {
      case Fmt::kF16:
        kv::attn_scores_f16(w.q.data(), n_g, d, reinterpret_cast<const uint16_t*>(h.k.data()), b,
                            nb, w.s.data(), kBlock);
        kv::attn_accum_f16(w.p.data(), n_g, kBlock,
                           reinterpret_cast<const uint16_t*>(h.v.data()) + b * d, nb, d,
                           w.acc.data());
        break;
      case Fmt::kQ8:
      case Fmt::kQ8Q:
        if (f == Fmt::kQ8Q)
          kv::attn_scores_q8q(q8q, reinterpret_cast<const int8_t*>(h.k.data()), h.ks.data(), b, nb,
                              w.s.data(), kBlock);
        else
          kv::attn_scores_q8(w.q.data(), n_g, d, reinterpret_cast<const int8_t*>(h.k.data()),
                             h.ks.data(), b, nb, w.s.data(), kBlock);
        fold(w, n_g, h.vs.data() + b, nb);
        kv::attn_accum_q8(w.pv.data(), n_g, kBlock,
                          reinterpret_cast<const int8_t*>(h.v.data()) + b * d, nb, d, w.acc.data());
        break;
      case Fmt::kFP8:
        kv::attn_scores_fp8(w.q.data(), n_g, d, h.k.data(), h.ks.data(), b, nb, w.s.data(), kBlock);
        fold(w, n_g, h.vs.data() + b, nb);
        kv::attn_accum_fp8(w.pv.data(), n_g, kBlock, h.v.data() + b * d, nb, d, w.acc.data());
        break;
      case Fmt::kE5M2:
        kv::attn_scores_dense(KvDtype::kE5M2, w.q.data(), n_g, d, h.k.data(), nullptr, b, nb,
                              w.s.data(), kBlock);
        kv::attn_accum_dense(KvDtype::kE5M2, w.p.data(), n_g, kBlock, h.v.data() + b * d, nb, d,
                             w.acc.data());
        break;
      case Fmt::kQ4: {
        const int64_t nbk = kv::q4_blocks(d);
        kv::attn_scores_q4(w.q.data(), n_g, d, h.k.data(), h.ks16.data(), b, nb, w.s.data(),
                           kBlock);
        kv::attn_accum_q4(w.p.data(), n_g, kBlock, h.v.data() + b * kv::q4_row_bytes(d),
                          h.vs16.data() + b * nbk, nb, d, w.acc.data());
        break;
      }
      case Fmt::kSpF16:
      case Fmt::kSpFP8:
        kv::sparse_scores(rk, w.q.data(), n_g, d, b, nb, w.s.data(), kBlock);
        kv::sparse_accum(rv, w.p.data(), n_g, kBlock, b, nb, w.acc.data(), d);
        break;
      case Fmt::kMkF16:
        kv::masked_scores(mk, w.q.data(), n_g, d, b, nb, w.s.data(), kBlock);
        kv::masked_accum(mv, w.p.data(), n_g, kBlock, b, nb, w.acc.data(), d);
        break;
      case Fmt::kSpark:
        kv::masked_scores(mk, w.q.data(), n_g, d, b, nb, w.s.data(), kBlock);
        kv::attn_accum_f16(w.p.data(), n_g, kBlock, reinterpret_cast<const uint16_t*>(h.v.data()) + b * d, nb,
                           d, w.acc.data());
        break;
    }
  }
  benchmark::DoNotOptimize(w.acc.data());
  benchmark::DoNotOptimize(w.s.data());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Copies of the head kept across the benchmarks of one (shape, ctx, mem) (registered in order).
struct Heads {
  std::string key;
  std::vector<Head> heads;
  const std::vector<Head>& get(const std::string& k, Fmt f, int64_t n, int64_t d, int copies) {
    if (k != key) {
      heads.clear();
      for (int c = 0; c < copies; ++c) heads.push_back(make_head(f, n, d, 1000 + c));
      key = k;
    }
    return heads;
  }
};
Heads g_base, g_test;

void run(benchmark::State& state, const Shape& sh, int64_t n, Fmt f, bool dram) {
  const size_t dense = static_cast<size_t>(n * sh.d * 2 * 2);
  const int copies = dram ? static_cast<int>(std::max<size_t>(2, kDramBytes / dense)) : 1;
  const std::string key =
      std::string(sh.name) + "/" + std::to_string(n) + "/" + std::to_string(copies);
  const auto& base = g_base.get(key + "/f16", Fmt::kF16, n, sh.d, copies);
  const auto& test =
      f == Fmt::kF16 ? base : g_test.get(key + "/" + fmt_name(f), f, n, sh.d, copies);
  Scratch w(sh.n_g, sh.d);
  std::vector<double> tb, tt;
  using clock = std::chrono::steady_clock;
  int c = 0;
  for (auto _ : state) {
    const auto t0 = clock::now();
    attend(Fmt::kF16, base[c], sh.n_g, sh.d, n, w);
    const auto t1 = clock::now();
    attend(f, test[(c + copies / 2) % copies], sh.n_g, sh.d, n, w);
    const auto t2 = clock::now();
    tb.push_back(std::chrono::duration<double>(t1 - t0).count());
    tt.push_back(std::chrono::duration<double>(t2 - t1).count());
    state.SetIterationTime(tt.back());
    c = (c + 1) % copies;
  }
  const double mb = median(tb), mt = median(tt);
  state.counters["f16_us"] = mb * 1e6;
  state.counters["us"] = mt * 1e6;
  state.counters["ratio"] = mb > 0 ? mt / mb : 0;
  state.counters["bytes_ratio"] =
      static_cast<double>(test[0].bytes()) / static_cast<double>(base[0].bytes());
}

void register_all() {
  for (bool dram : {true, false}) {
    for (const Shape& sh : kShapes) {
      for (int64_t n : {4096, 8192}) {
        for (Fmt f : {Fmt::kF16, Fmt::kQ8, Fmt::kQ8Q, Fmt::kFP8, Fmt::kQ4, Fmt::kE5M2, Fmt::kSpF16,
                      Fmt::kSpFP8, Fmt::kMkF16, Fmt::kSpark}) {
          const std::string name = std::string("KvKernels/") + sh.name +
                                   "/ctx:" + std::to_string(n) + "/" + fmt_name(f) + "/" +
                                   (dram ? "dram" : "hot");
          benchmark::RegisterBenchmark(name.c_str(),
                                       [=](benchmark::State& st) { run(st, sh, n, f, dram); })
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

const int g_registered = (register_all(), 0);

}  // namespace
}  // namespace kvtrim
