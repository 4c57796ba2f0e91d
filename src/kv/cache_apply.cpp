// TokenCache::apply (token_cache.h): validate the whole plan, then per head select the kept
// tokens of every segment, re-encode the kept dense tokens into the plan's new epoch, and keep
// the number of live bases bounded by re-expressing old epochs in the newest basis.
#include <malloc.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kv/token_cache.h"

namespace kvtrim::kv {
namespace {

// The per-token kinds' index layout with kAuto resolved (in place): the bitmask where it is
// smaller than the list, ceil(w / 8) bytes per row against isz per kept entry (variable counts:
// against the rows' mean count, counted exactly). Auto keeps the list for sampled recoveries:
// the list kernel scores their kept entries, while bitmask rows with a drawn recovery take the
// generic per-row loop; q4 rows have no kernel in either layout, so they take the smaller.
// (Sparse codes always keep the list: a dictionary's width is large, and no masked kernel
// reads it.)
void resolve_index(ChannelStage& c, const TokenRows& rows, int w) {
  IndexLayout* ix = nullptr;
  bool sampled = false;
  if (TokenChannels* t = c.get<TokenChannels>()) {
    ix = &t->index;
    sampled = t->recovery && t->recovery->dist != RecoveryDist::kFill;
  } else if (MagnitudeChannels* m = c.get<MagnitudeChannels>()) {
    ix = &m->index;
  }
  if (!ix) return;
  const int isz = w <= 256 ? 1 : 2;
  int64_t kept = c.topk(), n = 1;
  if (kept == 0) {
    for (int32_t k : rows.counts) kept += k;
    n = std::max<int64_t>(1, static_cast<int64_t>(rows.counts.size()));
  }
  const bool mask = *ix == IndexLayout::kBitmask ||
                    (*ix == IndexLayout::kAuto && !sampled && (w + 7) / 8 * n < kept * isz);
  *ix = mask ? IndexLayout::kBitmask : IndexLayout::kList;
}

// One side of a new epoch's encoding from its spec (validated): the basis interned, the
// plan's channel stage with its index resolved, the cache's type unless the plan sets one.
SideEncoding side_encoding(const SideSpec& sp, int d, KvDtype dflt) {
  SideEncoding s;
  s.d = d;
  if (sp.has_basis()) s.basis = intern_basis(d, sp.rank, sp.basis, sp.decoder);
  s.channels = sp.channels;
  resolve_index(s.channels, sp.rows, s.width());
  s.dtype = sp.dtype.value_or(dflt);
  s.rope = sp.rope;
  return s;
}

// The per-token rows of a plan's side: start of each row in rows.channels, and its length.
struct Rows {
  int topk;
  const TokenRows& d;
  std::vector<size_t> start;
  Rows(const ChannelStage& c, const TokenRows& rows) : topk(c.topk()), d(rows) {
    if (!c.get<TokenChannels>()) return;
    size_t at = 0;
    const size_t n = topk > 0 ? d.channels.size() / static_cast<size_t>(topk) : d.counts.size();
    for (size_t r = 0; r < n; ++r) {
      start.push_back(at);
      at += static_cast<size_t>(count(r));
    }
  }
  int count(size_t r) const { return topk > 0 ? topk : d.counts[r]; }
  const int32_t* channels(size_t r) const { return d.channels.data() + start[r]; }
  float fill(size_t r) const { return d.fill.empty() ? 0.f : d.fill[r]; }
  float spread(size_t r) const { return d.spread.empty() ? 0.f : d.spread[r]; }
};

// Pushes coordinates c [width] into one side of a segment through its channel stage.
void push_side(SideStore& st, const SideEncoding& e, const float* c, const Rows& rows, size_t r) {
  if (e.channels.get<MagnitudeChannels>()) {
    thread_local std::vector<int32_t> ch;
    ch.resize(static_cast<size_t>(e.topk()));
    e.magnitude_channels(c, ch.data());
    st.push_sparse(c, ch.data(), e.topk(), nullptr);
    return;
  }
  if (e.channels.get<TokenChannels>()) {
    const float f[2] = {rows.fill(r), rows.spread(r)};
    st.push_sparse(c, rows.channels(r), rows.count(r), f);
    return;
  }
  if (const ChannelSubset* sub = e.channels.subset()) {
    thread_local std::vector<float> g;
    g.resize(sub->channels.size());
    for (size_t j = 0; j < g.size(); ++j) g[j] = c[sub->channels[j]];
    st.push_dense(g.data());
    return;
  }
  st.push_dense(c);
}

// Encodes the rows x [n, d] of one side (rows ldx apart) into st: through the basis and the
// channel stage (plan_rows[j]: row j's row in the plan's per-token arrays; nullptr = none), or,
// sparse-coded, by OMP over the dictionary, all rows in one batch. pos [n]: the rows' positions
// (read by a pre-RoPE key basis only).
void push_rows(SideStore& st, const SideEncoding& e, const float* x, int64_t n, int64_t ldx,
               const Rows& rows, const int32_t* plan_rows, const int32_t* pos) {
  const int w = e.width();
  thread_local std::vector<float> c;
  if (e.channels.get<SparseCodeChannels>()) {
    const int T = e.topk();
    thread_local std::vector<int32_t> idx;
    thread_local std::vector<float> coef;
    idx.resize(static_cast<size_t>(n * T));
    coef.resize(static_cast<size_t>(n * T));
    e.sparse_encode(x, n, ldx, idx.data(), coef.data());
    c.assign(static_cast<size_t>(w), 0.f);
    for (int64_t j = 0; j < n; ++j) {
      const int32_t* ch = idx.data() + j * T;
      for (int i = 0; i < T; ++i) c[static_cast<size_t>(ch[i])] = coef[static_cast<size_t>(j * T + i)];
      st.push_sparse(c.data(), ch, T, nullptr);
      for (int i = 0; i < T; ++i) c[static_cast<size_t>(ch[i])] = 0.f;
    }
    return;
  }
  c.resize(static_cast<size_t>(n * w));
  e.to_coords(x, n, ldx, c.data(), pos);
  for (int64_t j = 0; j < n; ++j)
    push_side(st, e, c.data() + j * w, rows, plan_rows ? static_cast<size_t>(plan_rows[j]) : 0);
}

}  // namespace

HeadShape TokenCache::shape_of(const Layer& L, int il, int ih) const {
  const Head& H = L.heads[static_cast<size_t>(ih)];
  HeadShape s;
  s.il = il;
  s.ih = ih;
  s.head_dim_k = cfg_.head_dim_k;
  s.head_dim_v = cfg_.head_dim_v;
  s.n_tokens = H.n_tokens();
  if (!H.plain()) {
    for (const auto& [seg, row] : order(L, H)) s.dense.push_back(seg == 0 ? 1 : 0);
  }
  return s;
}

std::shared_ptr<const SegmentEncoding> TokenCache::make_encoding(const HeadPlan& hp) {
  auto e = std::make_shared<SegmentEncoding>();
  e->id = next_epoch_++;
  e->k = side_encoding(hp.key, cfg_.head_dim_k, cfg_.type_k());
  e->v = side_encoding(hp.value, cfg_.head_dim_v, cfg_.type_v());
  e->appends_dense = hp.appends_dense;
  e->buffer = hp.buffer;
  return e;
}

void TokenCache::apply(const CompressionPlan& plan) {
  const int nl = cfg_.n_layer, nkv = cfg_.n_head_kv;
  KVTRIM_CHECK(plan.n_layer == nl && plan.n_head_kv == nkv,
               "compression plan is for %d layers x %d kv heads, but the KV cache has %d x %d",
               plan.n_layer, plan.n_head_kv, nl, nkv);
  KVTRIM_CHECK(plan.heads.size() == static_cast<size_t>(nl) * static_cast<size_t>(nkv),
               "compression plan holds %zu head plans, expected %d layers x %d kv heads = %d",
               plan.heads.size(), nl, nkv, nl * nkv);
  // Validate everything before touching storage: a rejected plan leaves the cache as it was.
  for (int il = 0; il < nl; ++il)
    for (int ih = 0; ih < nkv; ++ih)
      validate_head_plan(plan.at(il, ih), shape_of(layers_[static_cast<size_t>(il)], il, ih));
  const size_t before = bytes().total();
  for (int il = 0; il < nl; ++il) {
    Layer& L = layers_[static_cast<size_t>(il)];
    const HeadPlan& h0 = plan.at(il, 0);
    bool any = false, same = true;  // any head planned; all heads planned alike (tokens only)
    for (int ih = 0; ih < nkv; ++ih) {
      const HeadPlan& hp = plan.at(il, ih);
      any = any || hp.planned();
      same = same && !hp.has_epoch() && hp.anchors.empty() && !hp.appends_dense &&
             hp.keep_all == h0.keep_all && (hp.keep_all || hp.keep == h0.keep);
    }
    if (!any) continue;
    if (L.shared && same) {  // the same rows in every head: positions stay shared
      if (h0.keep_all) continue;
      for (Head& H : L.heads) {
        H.segs[0].k.select(h0.keep);
        H.segs[0].v.select(h0.keep);
      }
      std::vector<int32_t> np(h0.keep.size());
      for (size_t j = 0; j < np.size(); ++j) np[j] = L.pos[static_cast<size_t>(h0.keep[j])];
      L.pos = std::move(np);
      continue;
    }
    if (L.shared) {  // heads diverge: each keeps its own positions from now on
      for (Head& H : L.heads) H.segs[0].pos = L.pos;
      std::vector<int32_t>().swap(L.pos);
      L.shared = false;
    }
    for (int ih = 0; ih < nkv; ++ih) {
      const HeadPlan& hp = plan.at(il, ih);
      if (hp.planned()) apply_head(L, L.heads[static_cast<size_t>(ih)], hp);
    }
  }
  const size_t after = bytes().total();
  // Large frees from the heap (buffers that grew by steps) only leave the process when the
  // allocator gives the pages back.
  if (before > after && before - after >= kTrimBytes) malloc_trim(0);
}

void TokenCache::apply_head(Layer& L, Head& H, const HeadPlan& hp) {
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  std::shared_ptr<const SegmentEncoding> ne = hp.has_epoch() ? make_encoding(hp) : nullptr;
  const std::vector<std::pair<int, int64_t>> ord = order(L, H);
  std::vector<std::vector<int32_t>> keep_seg(H.segs.size());
  std::vector<int32_t> reenc, reenc_row;  // dense rows to re-encode, and their plan rows
  size_t ia = 0;
  int32_t prow = 0;  // plan row of the token being taken (keep order)
  auto take = [&](int64_t g) {
    const bool anchor = ia < hp.anchors.size() && hp.anchors[ia] == g;
    if (anchor) ++ia;
    const auto [sg, j] = ord[static_cast<size_t>(g)];
    if (sg > 0 || !ne || anchor) {
      keep_seg[static_cast<size_t>(sg)].push_back(static_cast<int32_t>(j));
    } else {
      reenc.push_back(static_cast<int32_t>(j));
      reenc_row.push_back(prow);
    }
    ++prow;
  };
  // the head's dense buffer (the tail of the dense rows) before this plan
  const int64_t buf_first = H.segs[0].n() - H.buffered;
  if (hp.keep_all) {
    for (int64_t g = 0; g < static_cast<int64_t>(ord.size()); ++g) take(g);
  } else {
    for (int32_t g : hp.keep) take(g);
  }
  int64_t buffered = 0;
  if (ne && ne->buffer > 0) {
    // the newest re-encodable tokens after the last anchor stay dense: the new buffer
    const int32_t last_anchor = keep_seg[0].empty() ? -1 : keep_seg[0].back();
    size_t first = reenc.size();
    while (first > 0 && buffered < ne->buffer && reenc[first - 1] > last_anchor) {
      --first;
      ++buffered;
    }
    keep_seg[0].insert(keep_seg[0].end(), reenc.begin() + static_cast<std::ptrdiff_t>(first), reenc.end());
    reenc.resize(first);
    reenc_row.resize(first);
  } else if (!ne) {  // the current epoch's buffer keeps what is still kept of it
    for (int32_t j : keep_seg[0]) buffered += j >= buf_first ? 1 : 0;
  }
  Segment ns;  // the new epoch's segment, re-encoded from the dense rows still stored
  if (ne && !reenc.empty()) {
    ns = new_segment(ne);
    const SegmentEncoding& e = *ne;
    const Rows rk(hp.key.channels, hp.key.rows), rv(hp.value.channels, hp.value.rows);
    int64_t ent_k = 0, ent_v = 0;
    for (int32_t r : reenc_row) {
      if (e.k.per_token()) ent_k += rk.count(static_cast<size_t>(r));
      if (e.v.per_token()) ent_v += rv.count(static_cast<size_t>(r));
    }
    const int64_t n = static_cast<int64_t>(reenc.size());
    ns.k.reserve(n, ent_k, 1, n);
    ns.v.reserve(n, ent_v, 1, n);
    // the dense rows, back in head coordinates, then each side encoded in one batch
    std::vector<float> kf(static_cast<size_t>(n * dk)), vf(static_cast<size_t>(n * dv));
    const Segment& D = H.segs[0];
    ns.pos.resize(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      const int64_t j = reenc[static_cast<size_t>(r)];
      ns.pos[static_cast<size_t>(r)] = D.pos[static_cast<size_t>(j)];
      read_row(H, 0, j, ns.pos[static_cast<size_t>(r)], kf.data() + r * dk, vf.data() + r * dv);
    }
    push_rows(ns.k, e.k, kf.data(), n, dk, rk, reenc_row.data(), ns.pos.data());
    push_rows(ns.v, e.v, vf.data(), n, dv, rv, reenc_row.data(), ns.pos.data());
  }
  for (size_t sg = 0; sg < H.segs.size(); ++sg) {
    Segment& S = H.segs[sg];
    const std::vector<int32_t>& kp = keep_seg[sg];
    S.k.select(kp);
    S.v.select(kp);
    if (kp.size() != S.pos.size() || S.pos.capacity() != S.pos.size()) {
      std::vector<int32_t> np(kp.size());  // exact size: the old capacity is released
      for (size_t j = 0; j < np.size(); ++j) np[j] = S.pos[static_cast<size_t>(kp[j])];
      S.pos = std::move(np);
    }
  }
  // an epoch no token uses any more is freed with its last segment (unless it is current)
  std::erase_if(H.segs, [](const Segment& S) { return !S.enc->dense() && S.n() == 0; });
  if (ns.n() > 0) H.segs.push_back(std::move(ns));
  if (ne) H.cur = std::move(ne);
  H.buffered = buffered;
  if (cfg_.max_live_bases > 0) bound_live_bases(H);
}

Segment& TokenCache::current_segment(Head& H) const {
  for (Segment& g : H.segs)
    if (g.enc == H.cur) return g;
  H.segs.push_back(new_segment(H.cur));
  return H.segs.back();
}

void TokenCache::encode_into(Segment& S, int64_t n, const float* k, int64_t ldk, const float* v,
                             int64_t ldv, const int32_t* pos) const {
  const SegmentEncoding& e = *S.enc;
  const int64_t rows = S.n() + n;
  reserve(S, rows, e.k.per_token() ? rows * e.k.topk() : 0,
          e.v.per_token() ? rows * e.v.topk() : 0);
  static const TokenRows none;
  const Rows no_rows(ChannelStage{}, none);
  push_rows(S.k, e.k, k, n, ldk, no_rows, nullptr, pos);
  push_rows(S.v, e.v, v, n, ldv, no_rows, nullptr, pos);
}

void TokenCache::spill_buffer(Head& H, int64_t keep) const {
  const int64_t out = H.buffered - keep;
  if (out <= 0) return;
  const int64_t first = H.segs[0].n() - H.buffered;
  const int dk = cfg_.head_dim_k, dv = cfg_.head_dim_v;
  thread_local std::vector<float> kf, vf;
  kf.resize(static_cast<size_t>(out * dk));
  vf.resize(static_cast<size_t>(out * dv));
  thread_local std::vector<int32_t> spos;  // the spilled rows' positions (SWAN: every decode step)
  spos.assign(H.segs[0].pos.begin() + first, H.segs[0].pos.begin() + first + out);
  for (int64_t j = 0; j < out; ++j)
    read_row(H, 0, first + j, spos[static_cast<size_t>(j)], kf.data() + j * dk, vf.data() + j * dv);
  Segment& S = current_segment(H);  // may grow H.segs: segs[0] is looked up again below
  encode_into(S, out, kf.data(), dk, vf.data(), dv, spos.data());
  Segment& D0 = H.segs[0];
  S.pos.insert(S.pos.end(), spos.begin(), spos.end());
  D0.k.erase_rows(first, out);
  D0.v.erase_rows(first, out);
  D0.pos.erase(D0.pos.begin() + first, D0.pos.begin() + first + out);
  H.buffered -= out;
}

// Re-expresses the tokens of every older basis epoch in the newest epoch's encoding when the
// head holds more than max_live_bases distinct bases: c' = E_newᵀ D_old c per side (exact when
// the spans agree), merged by position into the newest segment. Only sides stored whole (all
// channels) are re-expressed; epochs with channels keep their own encoding.
void TokenCache::bound_live_bases(Head& H) const {
  auto bases_of = [](const SegmentEncoding& e) {
    return std::make_pair(e.k.basis.get(), e.v.basis.get());
  };
  std::vector<std::pair<const BasisMat*, const BasisMat*>> live;
  auto note = [&](const SegmentEncoding& e) {
    if (!e.k.basis && !e.v.basis) return;
    const auto b = bases_of(e);
    if (std::find(live.begin(), live.end(), b) == live.end()) live.push_back(b);
  };
  if (H.cur) note(*H.cur);
  for (const Segment& S : H.segs)
    if (!S.enc->dense()) note(*S.enc);
  if (static_cast<int>(live.size()) <= cfg_.max_live_bases || H.segs.size() < 3) return;
  // the newest epoch segment is the target; older ones with a basis and whole sides merge in
  const size_t ti = H.segs.size() - 1;
  const SegmentEncoding& te = *H.segs[ti].enc;
  auto mergeable = [&](const SegmentEncoding& e) {
    if (e.dense() || &e == &te || (!e.k.basis && !e.v.basis) || bases_of(e) == bases_of(te))
      return false;
    const std::pair<const SideEncoding*, const SideEncoding*> sides[] = {{&e.k, &te.k},
                                                                         {&e.v, &te.v}};
    for (const auto& [a, b] : sides) {
      if (*a == *b) continue;
      if (!a->channels.all() || !b->channels.all()) return false;
    }
    return true;
  };
  std::vector<size_t> from;
  for (size_t s = 1; s < ti; ++s)
    if (mergeable(*H.segs[s].enc)) from.push_back(s);
  if (from.empty()) return;
  Segment& T = H.segs[ti];
  int64_t total = T.n();
  for (size_t s : from) total += H.segs[s].n();
  Segment M = new_segment(T.enc);
  M.k.reserve(total, 0, 1, total);
  M.v.reserve(total, 0, 1, total);
  // rows of the target and the merged segments, by position
  std::vector<std::pair<int32_t, std::pair<size_t, int64_t>>> rows;
  for (size_t s : from)
    for (int64_t j = 0; j < H.segs[s].n(); ++j) rows.push_back({H.segs[s].pos[static_cast<size_t>(j)], {s, j}});
  for (int64_t j = 0; j < T.n(); ++j) rows.push_back({T.pos[static_cast<size_t>(j)], {ti, j}});
  std::sort(rows.begin(), rows.end());
  // Each source segment's rows in the target's coordinates, per side, computed in one batch
  // (decode all rows, then E_newᵀ (D_old c) with the SIMD kernels over every row at once):
  // coords[si] = {k [n, w_k], v [n, w_v]}.
  std::vector<std::pair<std::vector<float>, std::vector<float>>> coords(H.segs.size());
  auto side_coords = [](const SideStore& src, const SideEncoding& se, const SideEncoding& de,
                        int64_t n, int d, const int32_t* pos) {
    std::vector<float> c(static_cast<size_t>(n * se.width()));
    for (int64_t j = 0; j < n; ++j) src.get(se, j, c.data() + j * se.width());
    if (se == de) return c;  // same encoding (whole sides): decoded and re-encoded
    std::vector<float> x(static_cast<size_t>(n * d)), c2(static_cast<size_t>(n * de.width()));
    se.from_coords(c.data(), n, x.data(), d, pos);
    de.to_coords(x.data(), n, d, c2.data(), pos);
    return c2;
  };
  std::vector<size_t> srcs = from;
  srcs.push_back(ti);
  for (size_t si : srcs) {
    const Segment& S = H.segs[si];
    coords[si] = {side_coords(S.k, S.enc->k, te.k, S.n(), cfg_.head_dim_k, S.pos.data()),
                  side_coords(S.v, S.enc->v, te.v, S.n(), cfg_.head_dim_v, S.pos.data())};
  }
  for (const auto& [p, sj] : rows) {
    const auto& [ck, cv] = coords[sj.first];
    M.k.push_dense(ck.data() + sj.second * te.k.width());
    M.v.push_dense(cv.data() + sj.second * te.v.width());
    M.pos.push_back(p);
  }
  H.segs[ti] = std::move(M);
  for (auto it = from.rbegin(); it != from.rend(); ++it)
    H.segs.erase(H.segs.begin() + static_cast<std::ptrdiff_t>(*it));
}

}  // namespace kvtrim::kv
