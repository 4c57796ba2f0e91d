// Dense reference attention: the textbook formula, one query head at a time, in double; and
// the same over a cache's kept tokens, reconstructed head by head.
#include "kv/attention_reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace kvtrim {

void attention_reference(int64_t n_q, const float* q, const int32_t* q_pos, int64_t n_kv,
                         const float* k, const float* v, const int32_t* k_pos, int n_head_kv,
                         int hdk, int hdv, const AttnParams& p, float* out) {
  KVTRIM_CHECK(n_head_kv > 0 && p.n_head % n_head_kv == 0,
               "n_head %d is not a multiple of n_head_kv %d", p.n_head, n_head_kv);
  const int n_group = p.n_head / n_head_kv;
  std::vector<double> s(static_cast<size_t>(n_kv));
  for (int64_t iq = 0; iq < n_q; ++iq) {
    for (int ih = 0; ih < p.n_head; ++ih) {
      const int ihk = ih / n_group;  // GQA: the kv head this query head reads
      const float* qh = q + (iq * p.n_head + ih) * hdk;
      float* oh = out + (iq * p.n_head + ih) * hdv;
      // scores s_t = scale · q·k_t (soft-capped), -inf where the key is masked
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t t = 0; t < n_kv; ++t) {
        const bool visible = k_pos[t] <= q_pos[iq] &&
                             (p.sliding_window <= 0 || q_pos[iq] - k_pos[t] < p.sliding_window);
        if (!visible) {
          s[t] = -std::numeric_limits<double>::infinity();
          continue;
        }
        const float* kt = k + (t * n_head_kv + ihk) * hdk;
        double d = 0;
        for (int i = 0; i < hdk; ++i) d += static_cast<double>(qh[i]) * kt[i];
        d *= p.scale;
        if (p.softcap > 0) d = p.softcap * std::tanh(d / p.softcap);
        s[t] = d;
        if (d > m) m = d;
      }
      for (int i = 0; i < hdv; ++i) oh[i] = 0;
      if (m == -std::numeric_limits<double>::infinity()) continue;  // nothing visible
      // softmax, then out = Σ_t a_t v_t
      double sum = 0;
      for (int64_t t = 0; t < n_kv; ++t) {
        s[t] = std::isinf(s[t]) ? 0.0 : std::exp(s[t] - m);
        sum += s[t];
      }
      std::vector<double> acc(static_cast<size_t>(hdv), 0.0);
      for (int64_t t = 0; t < n_kv; ++t) {
        if (s[t] == 0) continue;
        const float* vt = v + (t * n_head_kv + ihk) * hdv;
        for (int i = 0; i < hdv; ++i) acc[i] += s[t] / sum * vt[i];
      }
      for (int i = 0; i < hdv; ++i) oh[i] = static_cast<float>(acc[i]);
    }
  }
}

void attention_reference_cache(const KvCache& cache, int il, int64_t n_q, const float* q,
                               const int32_t* q_pos, const AttnParams& p, float* out) {
  const KvCacheConfig& c = cache.config();
  KVTRIM_CHECK(p.n_head > 0 && p.n_head % c.n_head_kv == 0,
               "n_head %d is not a multiple of n_head_kv %d", p.n_head, c.n_head_kv);
  const int n_group = p.n_head / c.n_head_kv;
  const int hdk = c.head_dim_k, hdv = c.head_dim_v;
  AttnParams pg = p;
  pg.n_head = n_group;
  std::vector<float> k, v, qg(static_cast<size_t>(n_q * n_group * hdk)),
      og(static_cast<size_t>(n_q * n_group *
                             hdv));  // qg [n_q, n_group, hdk], og [n_q, n_group, hdv]
  std::vector<int32_t> pos;
  for (int ihk = 0; ihk < c.n_head_kv; ++ihk) {
    cache.read_head(il, ihk, &k, &v, &pos);  // k [n_tok, hdk], v [n_tok, hdv], pos [n_tok]
    for (int64_t iq = 0; iq < n_q; ++iq)
      for (int g = 0; g < n_group; ++g)
        for (int i = 0; i < hdk; ++i)
          qg[(iq * n_group + g) * hdk + i] =
              q[(iq * p.n_head + static_cast<int64_t>(ihk) * n_group + g) * hdk + i];
    attention_reference(n_q, qg.data(), q_pos, static_cast<int64_t>(pos.size()), k.data(), v.data(),
                        pos.data(), 1, hdk, hdv, pg, og.data());
    for (int64_t iq = 0; iq < n_q; ++iq)
      for (int g = 0; g < n_group; ++g)
        for (int i = 0; i < hdv; ++i)
          out[(iq * p.n_head + static_cast<int64_t>(ihk) * n_group + g) * hdv + i] =
              og[(iq * n_group + g) * hdv + i];
  }
}

}  // namespace kvtrim
