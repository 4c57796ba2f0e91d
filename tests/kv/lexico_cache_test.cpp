// Lexico's cache (DESIGN.md §4.1): a dictionary basis with sparse-coded channels, chosen by the
// cache itself (OMP) for every token the plan re-encodes and every token leaving the dense
// buffer. Checked against brute force: each coded token reads back as D·c of the double-precision
// reference code of its dense row, the buffer holds the newest tokens, attention equals the dense
// reference over the reconstruction, bytes are exact; dictionaries wider than the SIMD kernels' old
// stack staging (N > 512) and narrower than 256 (uint8 indices) both; bad plans are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/attention_reference.h"
#include "kv/kv_cache.h"
#include "kv/sparse_code.h"
#include "kv_test_util.h"
#include "test_util.h"

// A namespace of its own: the generic names of its helpers (Setup, run, dictionary, kD, ...)
// stay out of the other files of a unity build.
namespace kvtrim::lexico_cache_test {
namespace {

using kvtest::make_cfg;
using kvtest::max_abs_diff;
using kvtest::randn;

constexpr int kLayers = 2, kHeads = 2, kD = 32;

std::vector<float> dictionary(int d, int N, std::mt19937& rng) { return test::random_dictionary(d, N, rng); }

std::vector<float> atoms_of(const std::vector<float>& D, int d, int N) {
  std::vector<float> A(D.size());
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < N; ++j) A[static_cast<size_t>(j) * d + i] = D[static_cast<size_t>(i) * N + j];
  return A;
}

struct Setup {
  int N;
  int sk, sv;
  int64_t buffer;
  KvDtype sparse;
};

void run(const Setup& s, ThreadPool* pool) {
  SCOPED_TRACE("N " + std::to_string(s.N) + " s " + std::to_string(s.sk) + "/" + std::to_string(s.sv) + " buffer " +
               std::to_string(s.buffer) + " " + kv_dtype_name(s.sparse));
  std::mt19937 rng(77 + s.N);
  auto c = make_kv_cache(make_cfg(kLayers, kHeads, kD, kD, KvDtype::kF32));  // dense rows exact
  // the same appends stored head after head (no pool): the parallel append must give the same cache
  auto serial = make_kv_cache(make_cfg(kLayers, kHeads, kD, kD, KvDtype::kF32));
  std::vector<float> Dk[kLayers], Dv[kLayers];
  for (int il = 0; il < kLayers; ++il) {
    Dk[il] = dictionary(kD, s.N, rng);
    Dv[il] = dictionary(kD, s.N, rng);
  }
  // originals by position
  std::vector<std::vector<float>> ok[kLayers][kHeads], ov[kLayers][kHeads];
  int64_t buffered = 0;  // tokens the buffer holds: b, or b + n - 1 right after n appended together
  auto append = [&](int64_t n) {
    buffered = s.buffer == 0 ? 0 : std::min(s.buffer + n - 1, buffered + n);
    const int32_t p0 = c->n_past();
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) pos[static_cast<size_t>(j)] = p0 + static_cast<int32_t>(j);
    for (int il = 0; il < kLayers; ++il) {
      const auto k = randn(static_cast<size_t>(n * kHeads * kD), rng, 1.5f);
      const auto v = randn(static_cast<size_t>(n * kHeads * kD), rng);
      for (int ih = 0; ih < kHeads; ++ih)
        for (int64_t j = 0; j < n; ++j) {
          const size_t at = static_cast<size_t>((j * kHeads + ih) * kD);
          ok[il][ih].emplace_back(k.begin() + at, k.begin() + at + kD);
          ov[il][ih].emplace_back(v.begin() + at, v.begin() + at + kD);
        }
      c->append(il, n, k.data(), v.data(), pos.data(), pool);
      serial->append(il, n, k.data(), v.data(), pos.data(), nullptr);
    }
    c->advance(p0 + static_cast<int32_t>(n));
    serial->advance(p0 + static_cast<int32_t>(n));
  };
  auto check = [&](const char* what) {
    size_t idx_bytes = 0;
    int64_t coded_total = 0;
    for (int il = 0; il < kLayers; ++il)
      for (int ih = 0; ih < kHeads; ++ih) {
        std::vector<float> k, v, sk, sv;
        c->read_head(il, ih, &k, &v, nullptr);
        serial->read_head(il, ih, &sk, &sv, nullptr);
        ASSERT_EQ(k, sk) << what << ": appended with the pool vs head after head";
        ASSERT_EQ(v, sv) << what;
        const KvCache::HeadLayout lay = c->head_layout(il, ih);
        const int64_t n = static_cast<int64_t>(lay.epoch.size());
        ASSERT_EQ(n, static_cast<int64_t>(ok[il][ih].size())) << what;
        int64_t coded = 0;
        for (int64_t t = 0; t < n; ++t) {
          const bool dense = lay.epoch[static_cast<size_t>(t)] < 0;
          ASSERT_EQ(dense, t >= n - buffered) << what << " token " << t;
          if (dense) continue;
          ++coded;
          for (auto [D, orig, read, T] : {std::tuple{&Dk[il], &ok[il][ih][static_cast<size_t>(t)], k.data() + t * kD, s.sk},
                                          std::tuple{&Dv[il], &ov[il][ih][static_cast<size_t>(t)], v.data() + t * kD, s.sv}}) {
            const std::vector<float> A = atoms_of(*D, kD, s.N);
            std::vector<int32_t> idx(static_cast<size_t>(T));
            std::vector<float> cf(static_cast<size_t>(T));
            kv::omp_encode_reference(D->data(), kD, s.N, orig->data(), 1, kD, T, idx.data(), cf.data());
            double l1 = 0, err = 0;
            for (int e = 0; e < T; ++e) l1 += std::fabs(cf[static_cast<size_t>(e)]);
            for (int i = 0; i < kD; ++i) {
              double want = 0;
              for (int e = 0; e < T; ++e) want += static_cast<double>(cf[static_cast<size_t>(e)]) * A[static_cast<size_t>(idx[static_cast<size_t>(e)]) * kD + i];
              err = std::max(err, std::fabs(want - read[i]));
            }
            // each coefficient rounded to the stored type moves a component by at most its share
            const double rel = s.sparse == KvDtype::kFP8 ? 0.07 : 1e-3;
            ASSERT_LE(err, rel * l1 + 1e-5) << what << " layer " << il << " head " << ih << " token " << t;
          }
        }
        coded_total += coded;
        idx_bytes += static_cast<size_t>(coded * (s.sk + s.sv) * (s.N <= 256 ? 1 : 2));
      }
    const KvBytes b = c->bytes();
    EXPECT_EQ(b.total(), serial->bytes().total()) << what;
    EXPECT_EQ(b.indices, idx_bytes) << what;
    const size_t elem = s.sparse == KvDtype::kFP8 ? 1 : 2;
    // keys: coded entries + the f32 buffer rows (whole tiles of 16 tokens hold the buffer)
    EXPECT_GE(b.keys, static_cast<size_t>(coded_total * s.sk) * elem) << what;
    EXPECT_EQ(b.values, static_cast<size_t>(coded_total * s.sv) * elem + static_cast<size_t>(kLayers * kHeads * buffered * kD * 4))
        << what;
    EXPECT_GE(b.bases, static_cast<size_t>(kLayers * 2 * kD * s.N * 4)) << "the dictionaries count";
    // attention over the codes = the dense reference over the reconstruction
    std::mt19937 qr(7);
    const int64_t n_q = 2;
    const auto q = randn(static_cast<size_t>(n_q * 4 * kD), qr);
    std::vector<int32_t> qp = {c->n_past() - 5, c->n_past() - 1};
    AttnParams p;
    p.n_head = 4;
    p.scale = 1.f / std::sqrt(static_cast<float>(kD));
    std::vector<float> out(static_cast<size_t>(n_q * 4 * kD)), want(out.size());
    for (int il = 0; il < kLayers; ++il) {
      c->attend(il, n_q, q.data(), qp.data(), p, out.data(), pool);
      attention_reference_cache(*c, il, n_q, q.data(), qp.data(), p, want.data());
      ASSERT_LT(max_abs_diff(out, want), 1e-4) << what << " layer " << il;
    }
  };
  append(70);
  CompressionPlan plan(kLayers, kHeads);
  for (int il = 0; il < kLayers; ++il)
    for (int ih = 0; ih < kHeads; ++ih) {
      HeadPlan& hp = plan.at(il, ih);
      for (auto [sp, D, T] : {std::tuple{&hp.key, &Dk[il], s.sk}, std::tuple{&hp.value, &Dv[il], s.sv}}) {
        sp->rank = s.N;
        sp->basis = *D;
        sp->channels = SparseCodeChannels{.topk = T};
        sp->dtype = s.sparse;
      }
      hp.buffer = s.buffer;
    }
  c->apply(plan);
  serial->apply(plan);
  buffered = s.buffer;
  check("after the plan");
  for (int i = 0; i < 9; ++i) append(1);  // decode: the oldest buffered token is coded
  check("after single appends");
  append(23);
  check("after a chunk");
}

TEST(LexicoCache, CodesEveryTokenLeavingTheBufferByOmp) {
  ThreadPool pool(2);
  run({40, 5, 3, 8, KvDtype::kF16}, &pool);    // N > d, uint8 indices, SIMD sparse kernels
  run({300, 6, 4, 8, KvDtype::kFP8}, &pool);   // uint16 indices
  run({600, 4, 7, 0, KvDtype::kF16}, nullptr); // N > 512 (past the old stack staging); no buffer
  run({32, 32, 32, 4, KvDtype::kF16}, &pool);  // s = d: every token represented exactly (to f16)
}

TEST(LexicoCache, BadPlansAreErrors) {
  std::mt19937 rng(1);
  auto c = make_kv_cache(make_cfg(1, 1, kD, kD, KvDtype::kF16));
  kvtest::fill(*c, 20, 0, rng);
  const std::vector<float> D = dictionary(kD, 50, rng);
  auto plan = [&](auto edit) {
    CompressionPlan p(1, 1);
    SideSpec& sp = p.at(0, 0).key;
    sp.rank = 50;
    sp.basis = D;
    sp.channels = SparseCodeChannels{.topk = 4};
    edit(p.at(0, 0));
    return p;
  };
  EXPECT_NO_THROW(c->clone()->apply(plan([](HeadPlan&) {})));
  auto atoms = [](HeadPlan& h) -> int& { return h.key.channels.get<SparseCodeChannels>()->topk; };
  EXPECT_THROW(c->apply(plan([&](HeadPlan& h) { atoms(h) = kD + 1; })), Error);  // s > d
  EXPECT_THROW(c->apply(plan([&](HeadPlan& h) { atoms(h) = 0; })), Error);
  EXPECT_THROW(c->apply(plan([](HeadPlan& h) {
                 for (int i = 0; i < kD; ++i) h.key.basis[static_cast<size_t>(i) * 50] *= 1.01f;
               })),
               Error);  // atom 0 not unit norm
  EXPECT_THROW(c->apply(plan([](HeadPlan& h) { h.key.basis.pop_back(); })), Error);
  EXPECT_THROW(c->apply(plan([](HeadPlan& h) { h.key.decoder = h.key.basis; })), Error);
  EXPECT_THROW(c->apply(plan([](HeadPlan& h) {
                 h.key.rank = 0;
                 h.key.basis.clear();
               })),
               Error);  // no dictionary
  EXPECT_THROW(c->apply(plan([](HeadPlan& h) { h.key.rows.channels.assign(80, 0); })), Error);
  // (a bitmask index, or sparse coding with by-magnitude channels, is unrepresentable: sparse codes
  // have no index choice, and a side has one channel-stage kind)
  // a dictionary (50 atoms, not orthonormal) is no basis for by-magnitude channels
  EXPECT_THROW(c->apply(plan([](HeadPlan& h) { h.key.channels = MagnitudeChannels{.topk = 4}; })),
               Error);
  EXPECT_EQ(c->head_layout(0, 0).current_epoch, -1) << "a rejected plan leaves the cache as it was";
}

}  // namespace
}  // namespace kvtrim::lexico_cache_test
