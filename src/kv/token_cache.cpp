// The token cache's storage (token_cache.h): construction, append, reading tokens back,
// byte accounting, truncate / reset.
#include "kv/token_cache.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <unordered_set>

#include "core/error.h"
#include "core/thread_pool.h"

namespace kvtrim::kv {

TokenCache::TokenCache(KvCacheConfig cfg) : KvCache(std::move(cfg)) {
  KVTRIM_CHECK(cfg_.n_layer > 0 && cfg_.n_head_kv > 0 && cfg_.head_dim_k > 0 && cfg_.head_dim_v > 0,
               "invalid KV cache config: n_layer %d, n_head_kv %d, head_dim_k %d, head_dim_v %d",
               cfg_.n_layer, cfg_.n_head_kv, cfg_.head_dim_k, cfg_.head_dim_v);
  KVTRIM_CHECK(cfg_.n_ctx > 0, "invalid KV cache config: n_ctx %lld",
               static_cast<long long>(cfg_.n_ctx));
  KVTRIM_CHECK(
      cfg_.sliding_window.empty() || static_cast<int>(cfg_.sliding_window.size()) == cfg_.n_layer,
      "invalid KV cache config: %zu sliding windows for %d layers", cfg_.sliding_window.size(),
      cfg_.n_layer);
  for (KvDtype t : {cfg_.type_k(), cfg_.type_v()}) kv_type(t);  // (an unknown type throws)
  KVTRIM_CHECK(cfg_.max_live_bases >= 0, "invalid KV cache config: max_live_bases %d",
               cfg_.max_live_bases);
  auto e = std::make_shared<SegmentEncoding>();
  e->k.d = cfg_.head_dim_k;
  e->k.dtype = cfg_.type_k();
  e->v.d = cfg_.head_dim_v;
  e->v.dtype = cfg_.type_v();
  if (cfg_.rotate_quantized) {
    for (SideEncoding* sd : {&e->k, &e->v})
      if (kv_rotation_applies(sd->dtype, sd->d)) sd->basis = hadamard_basis(sd->d);
  }
  dense_enc_ = std::move(e);
  layers_.resize(static_cast<size_t>(cfg_.n_layer));
  for (Layer& L : layers_) {
    L.heads.resize(static_cast<size_t>(cfg_.n_head_kv));
    for (Head& H : L.heads) H.segs.push_back(new_segment(dense_enc_));
  }
}

Segment TokenCache::new_segment(std::shared_ptr<const SegmentEncoding> enc) const {
  Segment S;
  S.k.init(enc->k, /*keys=*/true);
  S.v.init(enc->v, /*keys=*/false);
  S.enc = std::move(enc);
  return S;
}

void TokenCache::reserve(Segment& S, int64_t rows, int64_t entries_k, int64_t entries_v) const {
  S.k.reserve(rows, entries_k, kGrowTokens, cfg_.n_ctx);
  S.v.reserve(rows, entries_v, kGrowTokens, cfg_.n_ctx);
}

int32_t TokenCache::last_pos(const Layer& L, const Head& H) const {
  int32_t last = -1;
  if (L.shared) return L.pos.empty() ? -1 : L.pos.back();
  for (const Segment& S : H.segs)
    if (!S.pos.empty()) last = std::max(last, S.pos.back());
  return last;
}

void TokenCache::append(int il, int64_t n, const float* k, const float* v, const int32_t* pos,
                        ThreadPool* pool) {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer, "KV cache: layer %d out of range [0, %d)", il,
               cfg_.n_layer);
  if (n <= 0) return;
  Layer& L = layers_[static_cast<size_t>(il)];
  const int nkv = cfg_.n_head_kv;
  // positions must increase past every stored position of every head
  int32_t last = -1;
  for (const Head& H : L.heads) last = std::max(last, last_pos(L, H));
  for (int64_t j = 0; j < n; ++j) {
    KVTRIM_CHECK(
        pos[j] > last,
        "KV cache layer %d: position %d appended after position %d (positions must increase)", il,
        pos[j], last);
    last = pos[j];
  }
  KVTRIM_CHECK(last < cfg_.n_ctx,
               "KV cache: position %d is beyond the context limit of %lld tokens", last,
               static_cast<long long>(cfg_.n_ctx));
  const int64_t dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  // Each kv head's rows are its own (segments, buffer, positions unless shared), so heads may be
  // stored in parallel; worth it only where a token costs a sparse code (OMP over a dictionary)
  // or a per-token channel choice (SWAN's top-k by magnitude, in a rotated basis) on entering
  // the current epoch or leaving its buffer: a decode step spills one token per head and layer
  // (the top-k alone ~0.8 µs per side at d = 64, so ~5 µs per SmolLM2 layer of 3 heads, that the
  // other threads would spend waiting).
  const auto one_head = [&](int ih) {
    Head& H = L.heads[static_cast<size_t>(ih)];
    thread_local std::vector<float> ck, cv;
    const float* kh = k + ih * dk;  // k: [n, n_head_kv, head_dim_k]
    const float* vh = v + ih * dv;  // v: [n, n_head_kv, head_dim_v]
    Segment* S = &H.segs[0];
    const bool buffering = H.cur && H.cur->appends_here() && H.cur->buffer > 0;
    if (H.cur && H.cur->appends_here() && !buffering) {  // encoded at once with the current epoch
      S = &current_segment(H);
      encode_into(*S, n, kh, nkv * dk, vh, nkv * dv, pos);
    } else if (!S->enc->k.identity() || !S->enc->v.identity()) {  // rotated dense rows
      const SegmentEncoding& e = *S->enc;
      ck.resize(static_cast<size_t>(n * dk));
      cv.resize(static_cast<size_t>(n * dv));
      e.k.to_coords(kh, n, nkv * dk, ck.data(), pos);
      e.v.to_coords(vh, n, nkv * dv, cv.data());
      reserve(*S, S->n() + n, 0, 0);
      for (int64_t j = 0; j < n; ++j) {
        S->k.push_dense(ck.data() + j * dk);
        S->v.push_dense(cv.data() + j * dv);
      }
    } else {
      reserve(*S, S->n() + n, 0, 0);
      for (int64_t j = 0; j < n; ++j) {
        S->k.push_dense(kh + j * nkv * dk);
        S->v.push_dense(vh + j * nkv * dv);
      }
    }
    if (!L.shared) S->pos.insert(S->pos.end(), pos, pos + n);
    if (buffering) {
      // The new rows joined the dense buffer; its oldest leave it, keeping buffer + n - 1:
      // decode (n = 1) is Algorithm 1 exactly (b dense tokens, the new one included); in a chunk
      // every query still sees the b - 1 tokens before it dense, as at decode, and the chunk's
      // own tokens stay dense for its attention (the paper's dense prefill attention), until
      // the next append.
      H.buffered += n;
      spill_buffer(H, H.cur->buffer + n - 1);
    }
  };
  bool coding = false;
  for (const Head& H : L.heads)
    coding = coding ||
             (H.cur && (H.cur->k.channels.codes_tokens() || H.cur->v.channels.codes_tokens()));
  if (pool && coding && nkv > 1) {
    std::exception_ptr err;
    std::mutex mu;
    pool->parallel_for(nkv, [&](int64_t b, int64_t e) {
      try {
        for (int64_t ih = b; ih < e; ++ih) one_head(static_cast<int>(ih));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!err) err = std::current_exception();
      }
    });
    if (err) std::rethrow_exception(err);
  } else {
    for (int ih = 0; ih < nkv; ++ih) one_head(ih);
  }
  if (L.shared) L.pos.insert(L.pos.end(), pos, pos + n);
}

std::vector<std::pair<int, int64_t>> TokenCache::order(const Layer& L, const Head& H) const {
  std::vector<std::pair<int32_t, std::pair<int, int64_t>>> t;
  for (size_t s = 0; s < H.segs.size(); ++s) {
    const int32_t* p = segment_positions(L, H, s);
    for (int64_t j = 0; j < H.segs[s].n(); ++j) t.push_back({p[j], {static_cast<int>(s), j}});
  }
  if (H.segs.size() > 1) std::sort(t.begin(), t.end());
  std::vector<std::pair<int, int64_t>> r(t.size());
  for (size_t i = 0; i < t.size(); ++i) r[i] = t[i].second;
  return r;
}

void TokenCache::read_row(const Head& H, size_t si, int64_t j, int32_t pos, float* kt, float* vt) const {
  const Segment& S = H.segs[si];
  const SegmentEncoding& e = *S.enc;
  thread_local std::vector<float> c;
  if (kt) {
    c.resize(static_cast<size_t>(e.k.width()));
    S.k.get(e.k, j, c.data());
    e.k.from_coords(c.data(), 1, kt, cfg_.head_dim_k, &pos);
  }
  if (vt) {
    c.resize(static_cast<size_t>(e.v.width()));
    S.v.get(e.v, j, c.data());
    e.v.from_coords(c.data(), 1, vt, cfg_.head_dim_v);
  }
}

void TokenCache::read_head(int il, int ih, std::vector<float>* k, std::vector<float>* v,
                           std::vector<int32_t>* pos) const {
  const int64_t n = n_tokens(il, ih);  // range-checks (il, ih)
  const Layer& L = layers_[static_cast<size_t>(il)];
  const Head& H = L.heads[static_cast<size_t>(ih)];
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  const std::vector<std::pair<int, int64_t>> ord = order(L, H);
  if (k) k->resize(static_cast<size_t>(n * dk));
  if (v) v->resize(static_cast<size_t>(n * dv));
  if (pos) pos->resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const auto [sg, j] = ord[static_cast<size_t>(t)];
    const int32_t p = segment_positions(L, H, static_cast<size_t>(sg))[j];
    read_row(H, static_cast<size_t>(sg), j, p, k ? k->data() + t * dk : nullptr,
             v ? v->data() + t * dv : nullptr);
    if (pos) (*pos)[static_cast<size_t>(t)] = p;
  }
}

void TokenCache::read_head_rows(int il, int ih, const std::vector<int32_t>& rows,
                                std::vector<float>* k, std::vector<float>* v) const {
  const int64_t n = n_tokens(il, ih);  // range-checks (il, ih)
  for (size_t r = 0; r < rows.size(); ++r)
    KVTRIM_CHECK(rows[r] >= 0 && rows[r] < n && (r == 0 || rows[r] > rows[r - 1]),
                 "read_head_rows: (layer %d, kv head %d) row %zu is %d: rows must be increasing "
                 "and in [0, %lld)",
                 il, ih, r, rows[r], static_cast<long long>(n));
  const Layer& L = layers_[static_cast<size_t>(il)];
  const Head& H = L.heads[static_cast<size_t>(ih)];
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  const int64_t m = static_cast<int64_t>(rows.size());
  if (k) k->resize(static_cast<size_t>(m * dk));
  if (v) v->resize(static_cast<size_t>(m * dv));
  const std::vector<std::pair<int, int64_t>> ord =
      H.plain() ? std::vector<std::pair<int, int64_t>>() : order(L, H);
  for (int64_t r = 0; r < m; ++r) {
    const int64_t t = rows[static_cast<size_t>(r)];
    const auto [sg, j] = H.plain() ? std::pair<int, int64_t>{0, t} : ord[static_cast<size_t>(t)];
    read_row(H, static_cast<size_t>(sg), j, segment_positions(L, H, static_cast<size_t>(sg))[j],
             k ? k->data() + r * dk : nullptr, v ? v->data() + r * dv : nullptr);
  }
}

int64_t TokenCache::n_tokens(int il, int ih) const {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer && ih >= 0 && ih < cfg_.n_head_kv,
               "KV cache: (layer %d, kv head %d) out of range (%d layers, %d kv heads)", il, ih,
               cfg_.n_layer, cfg_.n_head_kv);
  return layers_[static_cast<size_t>(il)].heads[static_cast<size_t>(ih)].n_tokens();
}

KvBytes TokenCache::bytes() const {
  KvBytes b;
  b.per_layer.resize(layers_.size());
  b.per_head.assign(layers_.size() * static_cast<size_t>(cfg_.n_head_kv), 0);
  std::unordered_set<const BasisMat*> bases;  // each basis once in the cache
  for (size_t il = 0; il < layers_.size(); ++il) {
    const Layer& L = layers_[il];
    KvBytes l;
    if (L.shared) l.positions = L.pos.size() * sizeof(int32_t);
    for (size_t ih = 0; ih < L.heads.size(); ++ih) {
      const Head& H = L.heads[ih];
      std::vector<const SegmentEncoding*> held;  // each epoch encoding the head holds, once
      if (H.cur) held.push_back(H.cur.get());
      size_t& own = b.per_head[il * L.heads.size() + ih];
      for (const Segment& S : H.segs) {
        const SideBytes kb = S.k.bytes(), vb = S.v.bytes();
        own += kb.elems + vb.elems + kb.scales + vb.scales + kb.indices + vb.indices + kb.bitmasks + vb.bitmasks +
               kb.fills + vb.fills + (L.shared ? 0 : static_cast<size_t>(S.n()) * sizeof(int32_t));
        l.keys += kb.elems;
        l.values += vb.elems;
        l.scales += kb.scales + vb.scales;
        l.indices += kb.indices + vb.indices;
        l.bitmasks += kb.bitmasks + vb.bitmasks;
        l.fills += kb.fills + vb.fills;
        if (!L.shared) l.positions += static_cast<size_t>(S.n()) * sizeof(int32_t);
        if (!S.enc->dense()) l.other += sizeof(int32_t);  // the segment's epoch id
        held.push_back(S.enc.get());  // (dense rows: only a rotation of quantized rows counts)
      }
      std::sort(held.begin(), held.end());
      held.erase(std::unique(held.begin(), held.end()), held.end());
      for (const SegmentEncoding* e : held) {
        for (const SideEncoding* s : {&e->k, &e->v}) {
          l.indices += s->subset_bytes();
          l.scales += s->recovery_bytes();
          if (s->basis && bases.insert(s->basis.get()).second) {
            l.bases += s->basis->bytes();
            b.basis_ids.emplace_back(s->basis.get(), s->basis->bytes());
          }
        }
      }
    }
    b.keys += l.keys;
    b.values += l.values;
    b.positions += l.positions;
    b.scales += l.scales;
    b.bases += l.bases;
    b.indices += l.indices;
    b.bitmasks += l.bitmasks;
    b.fills += l.fills;
    b.other += l.other;
    b.per_layer[il] = l.total();
  }
  return b;
}

void TokenCache::truncate(int32_t pos) {
  KVTRIM_CHECK(pos >= 0, "KV cache: cannot truncate to negative position %d", pos);
  for (Layer& L : layers_) {
    if (L.shared) {
      const int64_t keep = std::lower_bound(L.pos.begin(), L.pos.end(), pos) - L.pos.begin();
      L.pos.resize(static_cast<size_t>(keep));
      for (Head& H : L.heads) {
        H.segs[0].k.truncate(keep);
        H.segs[0].v.truncate(keep);
      }
      continue;
    }
    for (Head& H : L.heads) {
      // the buffer is the tail of the dense rows: truncation removes it first
      const std::vector<int32_t>& dp = H.segs[0].pos;
      const int64_t dropped = dp.end() - std::lower_bound(dp.begin(), dp.end(), pos);
      H.buffered = std::max<int64_t>(0, H.buffered - dropped);
      for (Segment& S : H.segs) {
        const int64_t keep = std::lower_bound(S.pos.begin(), S.pos.end(), pos) - S.pos.begin();
        S.pos.resize(static_cast<size_t>(keep));
        S.k.truncate(keep);
        S.v.truncate(keep);
      }
      std::erase_if(H.segs, [](const Segment& S) { return !S.enc->dense() && S.n() == 0; });
    }
    // An emptied layer whose heads hold no epoch shares positions again, so a new context
    // after clear() is stored (and counted) like the first one: 4 bytes per position, not
    // per (position, head).
    const bool empty = std::all_of(L.heads.begin(), L.heads.end(),
                                   [](const Head& H) { return H.n_tokens() == 0 && !H.cur; });
    if (empty) {
      L.shared = true;
      L.pos.clear();
      for (Head& H : L.heads) std::vector<int32_t>().swap(H.segs[0].pos);
    }
  }
  n_past_ = std::min(n_past_, pos);
}

void TokenCache::reset() {
  for (Layer& L : layers_) {
    for (Head& H : L.heads) {
      H.cur.reset();
      H.buffered = 0;
      H.segs.resize(1);
    }
  }
  truncate(0);
}

KvCache::HeadLayout TokenCache::head_layout(int il, int ih) const {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer && ih >= 0 && ih < cfg_.n_head_kv,
               "head_layout: (layer %d, kv head %d) out of range", il, ih);
  const Layer& L = layers_[static_cast<size_t>(il)];
  const Head& H = L.heads[static_cast<size_t>(ih)];
  HeadLayout out;
  for (const auto& [seg, row] : order(L, H)) out.epoch.push_back(H.segs[static_cast<size_t>(seg)].enc->id);
  if (!H.cur) return out;
  const SegmentEncoding& e = *H.cur;
  out.current_epoch = e.id;
  out.appends_dense = !e.appends_here();
  if (e.k.basis) {
    out.rank_k = e.k.basis->r;
    out.basis_k = e.k.basis->enc;
    out.decoder_k = e.k.basis->dec;
  }
  if (e.v.basis) {
    out.rank_v = e.v.basis->r;
    out.basis_v = e.v.basis->enc;
    out.decoder_v = e.v.basis->dec;
  }
  return out;
}

KvCache::RawRows TokenCache::raw_values(int il, int ih) const {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer && ih >= 0 && ih < cfg_.n_head_kv,
               "raw_values: (layer %d, kv head %d) out of range", il, ih);
  const Layer& L = layers_[static_cast<size_t>(il)];
  const Head& H = L.heads[static_cast<size_t>(ih)];
  RawRows r;
  if (!H.plain()) return r;
  const SideStore& v = H.segs[0].v;
  const KvDtype t = v.dtype();
  if (H.segs[0].enc->v.basis || v.sparse() || v.tiled() || v.row_elems() != cfg_.head_dim_v ||
      kv_type(t).scale != KvScale::kNone ||
      kv_type(t).code_bits < 16)  // plain f32 / f16 / bf16 rows only
    return r;
  r.n = v.n();
  r.pos = segment_positions(L, H, 0);
  static const int32_t kNoPositions = 0;
  if (r.pos == nullptr) r.pos = &kNoPositions;  // an empty head: a valid empty view
  r.data = r.n > 0 ? v.data() : nullptr;
  r.dim = cfg_.head_dim_v;
  r.row_bytes = v.elem_size() * static_cast<size_t>(cfg_.head_dim_v);
  r.dtype = t;
  return r;
}

std::string TokenCache::describe() const {
  const KvBytes b = bytes();
  int64_t stored = 0;
  for (const Layer& L : layers_)
    for (const Head& H : L.heads) stored += H.n_tokens();
  const std::string types = cfg_.type_k() == cfg_.type_v()
                                ? std::string(kv_dtype_name(cfg_.type_k()))
                                : std::string("K ") + kv_dtype_name(cfg_.type_k()) + " / V " +
                                      kv_dtype_name(cfg_.type_v());
  return strprintf(
      "token %s cache: %d layers x %d kv heads, head dims %d/%d, n_ctx %lld, n_past %d, "
      "%lld (layer, head) tokens stored, %.2f MiB",
      types.c_str(), cfg_.n_layer, cfg_.n_head_kv, cfg_.head_dim_k, cfg_.head_dim_v,
      static_cast<long long>(cfg_.n_ctx), n_past_, static_cast<long long>(stored),
      static_cast<double>(b.total()) / (1 << 20));
}

}  // namespace kvtrim::kv

namespace kvtrim {

std::unique_ptr<KvCache> make_kv_cache(const KvCacheConfig& cfg) {
  return std::make_unique<kv::TokenCache>(cfg);
}

std::unique_ptr<KvCache> make_dense_cache(const KvCacheConfig& cfg) { return make_kv_cache(cfg); }

}  // namespace kvtrim
