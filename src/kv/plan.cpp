// Plan validation and composition (plan.h).
#include "kv/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace kvtrim {
namespace {

#define PLAN_CHECK(cond, fmt, ...)                                                   \
  KVTRIM_CHECK(cond, "compression plan (layer %d, kv head %d): " fmt, s.il, \
               s.ih __VA_OPT__(, ) __VA_ARGS__)

// Indices strictly increasing in [0, n).
void check_indices(const std::vector<int32_t>& v, int64_t n, const char* what, const HeadShape& s,
                   const char* range) {
  for (size_t j = 0; j < v.size(); ++j) {
    PLAN_CHECK(v[j] >= 0 && v[j] < n, "%s[%zu] = %d is out of range [0, %lld) (%s)", what, j, v[j],
               static_cast<long long>(n), range);
    PLAN_CHECK(j == 0 || v[j] > v[j - 1], "%s[%zu] = %d after %d (must be strictly increasing)",
               what, j, v[j], v[j - 1]);
  }
}

// The basis stage of one side: none, or U [d, r] orthonormal (or any finite U with a decoder).
void check_basis(const SideSpec& sp, int d, const char* side, const HeadShape& s) {
  const std::vector<float>& U = sp.basis;
  const std::vector<float>& D = sp.decoder;
  const int r = sp.rank;
  PLAN_CHECK(D.empty() || !U.empty(), "%s decoder given without a %s basis (the encoder)", side,
             side);
  if (r == 0 && U.empty()) return;
  if (sp.channels.get<SparseCodeChannels>()) {  // a dictionary: N unit-norm atoms, N may exceed d
    PLAN_CHECK(D.empty(), "%s dictionary (sparse-coded channels) cannot have a decoder", side);
    PLAN_CHECK(r >= 1 && r <= 65535, "%s dictionary size %d is out of range [1, 65535]", side, r);
    PLAN_CHECK(U.size() == static_cast<size_t>(d) * static_cast<size_t>(r),
               "%s dictionary holds %zu floats, expected head_dim %d x atoms %d = %lld", side, U.size(), d,
               r, static_cast<long long>(d) * r);
    for (int j = 0; j < r; ++j) {
      double nn = 0;
      for (int i = 0; i < d; ++i) nn += static_cast<double>(U[static_cast<size_t>(i) * r + j]) * U[static_cast<size_t>(i) * r + j];
      PLAN_CHECK(std::fabs(std::sqrt(nn) - 1.0) <= 1e-3,
                 "%s dictionary atom %d has norm %g (atoms must have unit norm, tolerance 1e-3)", side, j,
                 std::sqrt(nn));
    }
    return;
  }
  PLAN_CHECK(r >= 1 && r <= d, "%s basis rank %d is out of range [1, %d]", side, r, d);
  PLAN_CHECK(U.size() == static_cast<size_t>(d) * static_cast<size_t>(r),
             "%s basis holds %zu floats, expected head_dim %d x rank %d = %d", side, U.size(), d, r,
             d * r);
  if (!D.empty()) {
    PLAN_CHECK(D.size() == U.size(),
               "%s decoder holds %zu floats, expected head_dim %d x rank %d = %d (the basis's "
               "shape)",
               side, D.size(), d, r, d * r);
    for (const std::vector<float>* m : {&U, &D}) {
      for (size_t i = 0; i < m->size(); ++i)
        PLAN_CHECK(std::isfinite((*m)[i]), "%s %s element %zu is not finite", side,
                   m == &U ? "basis" : "decoder", i);
    }
    return;  // oblique: no orthonormality required
  }
  double worst = 0;
  for (int a = 0; a < r; ++a) {
    for (int b = a; b < r; ++b) {
      double dot = 0;
      for (int i = 0; i < d; ++i)
        dot += static_cast<double>(U[static_cast<size_t>(i) * r + a]) *
               U[static_cast<size_t>(i) * r + b];
      const double dev = std::fabs(dot - (a == b ? 1.0 : 0.0));
      if (!(dev <= worst)) worst = std::isnan(dev) ? std::numeric_limits<double>::infinity() : dev;
    }
  }
  PLAN_CHECK(worst <= 1e-4,
             "%s basis columns are not orthonormal (max |UᵀU - I| = %g, tolerance 1e-4)", side,
             worst);
}

// A press's per-token channels (TokenChannels) and their rows, in coordinates of width w.
void check_token_channels(const TokenChannels& c, const TokenRows& t, int w, bool keys,
                          size_t rows, const char* side, const HeadShape& s) {
  PLAN_CHECK(c.topk >= 0 && c.topk <= w, "%s topk %d is out of range [1, %d] (width)", side,
             c.topk, w);
  size_t total = 0;
  if (c.topk > 0) {
    PLAN_CHECK(t.counts.empty(), "%s channels: topk %d and rows.counts cannot both be given",
               side, c.topk);
    total = rows * static_cast<size_t>(c.topk);
  } else {
    PLAN_CHECK(t.counts.size() == rows,
               "%s channels: rows.counts holds %zu counts, expected %zu kept tokens (topk 0 = a "
               "variable count per token)",
               side, t.counts.size(), rows);
    for (size_t r = 0; r < rows; ++r) {
      PLAN_CHECK(t.counts[r] >= 1 && t.counts[r] <= w,
                 "%s rows.counts[%zu] = %d is out of range [1, %d]", side, r, t.counts[r], w);
      total += static_cast<size_t>(t.counts[r]);
    }
  }
  PLAN_CHECK(t.channels.size() == total,
             "%s rows.channels holds %zu indices, expected %zu (kept tokens x channels per token)",
             side, t.channels.size(), total);
  size_t at = 0;
  for (size_t r = 0; r < rows; ++r) {
    const size_t n = c.topk > 0 ? static_cast<size_t>(c.topk) : static_cast<size_t>(t.counts[r]);
    for (size_t j = 0; j < n; ++j) {
      const int32_t ch = t.channels[at + j];
      PLAN_CHECK(ch >= 0 && ch < w && (j == 0 || ch > t.channels[at + j - 1]),
                 "%s rows.channels row %zu entry %zu = %d is out of range [0, %d) or not strictly "
                 "increasing",
                 side, r, j, ch, w);
    }
    at += n;
  }
  const KeyRecovery* rec = c.recovery ? &*c.recovery : nullptr;
  if (keys) {
    PLAN_CHECK(!c.fill, "key channels take a recovery (recovery scale and rows.fill), not a fill");
    PLAN_CHECK(!rec == t.fill.empty(),
               "key recovery scale and rows.fill are given together or not at all");
    if (rec)
      PLAN_CHECK(rec->scale.size() == static_cast<size_t>(w),
                 "key recovery scale holds %zu floats, expected the width %d", rec->scale.size(),
                 w);
  } else {
    PLAN_CHECK(!rec, "value channels take a fill per token (rows.fill), not a recovery");
    PLAN_CHECK(c.fill ? t.fill.size() == rows : t.fill.empty(),
               "value rows.fill holds %zu floats, expected %zu (one per kept token with a fill, "
               "none without)",
               t.fill.size(), c.fill ? rows : size_t{0});
  }
  const RecoveryDist dist = rec ? rec->dist : RecoveryDist::kFill;
  if (dist != RecoveryDist::kFill) {
    for (float x : t.fill)
      PLAN_CHECK(x >= 0, "%s rows.fill (sampled recovery: μ_t) is negative", side);
  }
  const size_t n_spread = dist == RecoveryDist::kGaussian ? rows : 0;
  PLAN_CHECK(t.spread.size() == n_spread,
             "%s rows.spread holds %zu floats, expected %zu (σ_t per kept token, Gaussian "
             "recovery only)",
             side, t.spread.size(), n_spread);
  for (float x : t.spread)
    PLAN_CHECK(std::isfinite(x) && x >= 0, "%s rows.spread is not finite and >= 0", side);
  PLAN_CHECK(t.fill.empty() || t.fill.size() == rows,
             "%s rows.fill holds %zu floats, expected %zu kept tokens", side, t.fill.size(), rows);
  if (rec)
    for (float x : rec->scale)
      PLAN_CHECK(std::isfinite(x), "%s recovery scale is not finite", side);
  for (float x : t.fill) PLAN_CHECK(std::isfinite(x), "%s rows.fill is not finite", side);
}

// The channel stage of one side, in the coordinates after the basis (width w), and the
// per-token rows only a press's per-token channels take.
void check_channels(const SideSpec& sp, int w, int d, bool keys, size_t rows, const char* side,
                    const HeadShape& s) {
  const ChannelStage& c = sp.channels;
  if (const TokenChannels* t = c.get<TokenChannels>()) {
    check_token_channels(*t, sp.rows, w, keys, rows, side, s);
    return;
  }
  PLAN_CHECK(sp.rows.empty(),
             "%s channels %s: per-token rows (channels / counts / fill / spread) are given, but "
             "only per-token channels chosen by a press take them (the cache chooses a token's "
             "channels itself, or there are none to choose)",
             side, c.name());
  if (const ChannelSubset* sub = c.subset()) {
    PLAN_CHECK(!sub->channels.empty() && sub->channels.size() <= static_cast<size_t>(w),
               "%zu %s channels for width %d (a per-head subset keeps 1 .. width)",
               sub->channels.size(), side, w);
    const std::vector<int32_t> idx(sub->channels.begin(), sub->channels.end());
    check_indices(idx, w, keys ? "key_channels" : "value_channels", s,
                  "coordinates after the basis");
  } else if (const SparseCodeChannels* sc = c.get<SparseCodeChannels>()) {
    PLAN_CHECK(sp.has_basis(), "%s channels by sparse coding need a dictionary (the side's basis)",
               side);
    PLAN_CHECK(sc->topk >= 1 && sc->topk <= std::min(w, d),
               "%s channels by sparse coding: %d atoms per token is out of range [1, %d] (atoms, "
               "head dim)",
               side, sc->topk, std::min(w, d));
  } else if (const MagnitudeChannels* m = c.get<MagnitudeChannels>()) {
    PLAN_CHECK(m->topk >= 1 && m->topk <= w,
               "%s channels by magnitude: topk %d is out of range [1, %d] (width)", side, m->topk,
               w);
  }
}

}  // namespace

void validate_head_plan(const HeadPlan& hp, const HeadShape& s) {
  const int64_t n = s.n_tokens;
  check_basis(hp.key, s.head_dim_k, "key", s);
  check_basis(hp.value, s.head_dim_v, "value", s);
  PLAN_CHECK(!hp.value.rope, "a value basis cannot have a RoPE spec (only keys are rotated)");
  if (hp.key.rope) {
    const RopeSpec& r = *hp.key.rope;
    PLAN_CHECK(hp.key.has_basis() && !hp.key.channels_set(),
               "a pre-RoPE key basis (rope) needs a basis and all channels");
    PLAN_CHECK(r.n_rot >= 2 && r.n_rot % 2 == 0 && r.n_rot <= s.head_dim_k,
               "key RoPE n_rot %d must be even and in [2, head_dim %d]", r.n_rot, s.head_dim_k);
    PLAN_CHECK(std::isfinite(r.base) && r.base > 0 && std::isfinite(r.freq_scale) && r.freq_scale > 0,
               "key RoPE base %g and freq_scale %g must be finite and positive", r.base, r.freq_scale);
  }
  const size_t rows = hp.keep_all ? static_cast<size_t>(n) : hp.keep.size();
  check_channels(hp.key, hp.key.rank > 0 ? hp.key.rank : s.head_dim_k, s.head_dim_k, true, rows,
                 "key", s);
  check_channels(hp.value, hp.value.rank > 0 ? hp.value.rank : s.head_dim_v, s.head_dim_v, false,
                 rows, "value", s);
  PLAN_CHECK(!hp.appends_dense || hp.has_epoch(),
             "appends_dense is given without a basis or channels (it says how tokens appended "
             "after the plan's epoch are stored)");
  if (!hp.keep_all) check_indices(hp.keep, n, "keep", s, "the head's stored tokens");
  if (hp.buffer != 0) {
    PLAN_CHECK(hp.buffer > 0, "buffer %lld is negative", static_cast<long long>(hp.buffer));
    PLAN_CHECK(hp.has_epoch(),
               "a dense buffer is given without a basis or channels (it says how many recent "
               "tokens an epoch leaves dense)");
    PLAN_CHECK(!hp.appends_dense,
               "a dense buffer and appends_dense cannot be combined (the buffer encodes the "
               "tokens that leave it; appends_dense leaves them to a later plan)");
    for (const ChannelStage* c : {&hp.key.channels, &hp.value.channels})
      PLAN_CHECK(c->self_encoding(),
                 "a dense buffer needs an epoch that encodes tokens by itself (channels all, by "
                 "magnitude or by sparse coding), not channels chosen by a press");
  }
  if (!hp.anchors.empty()) {
    PLAN_CHECK(hp.has_epoch(),
               "anchors are given without a basis or channels (anchors are the tokens an epoch "
               "leaves dense)");
    check_indices(hp.anchors, n, "anchors", s, "the head's stored tokens");
    for (size_t j = 0; j < hp.anchors.size(); ++j) {
      const int32_t a = hp.anchors[j];
      PLAN_CHECK(hp.keep_all || std::binary_search(hp.keep.begin(), hp.keep.end(), a),
                 "anchors[%zu] = %d is not kept", j, a);
      PLAN_CHECK(s.dense.empty() || s.dense[static_cast<size_t>(a)],
                 "anchors[%zu] = %d is already stored in a basis (its full-rank vector is gone)", j,
                 a);
    }
  }
}

#undef PLAN_CHECK

namespace {

// Rows `pick` of a per-token array whose row r has len(r) entries.
template <class T, class Len>
std::vector<T> select_rows(const std::vector<T>& rows, const std::vector<int32_t>& pick, Len len) {
  if (rows.empty()) return rows;
  std::vector<size_t> start;
  size_t at = 0;
  for (size_t r = 0; at < rows.size(); ++r) {
    start.push_back(at);
    at += len(r);
  }
  std::vector<T> out;
  for (int32_t p : pick) {
    KVTRIM_CHECK(p >= 0 && static_cast<size_t>(p) < start.size(),
                 "compose_plans: per-token row %d out of range", p);
    const size_t b = start[static_cast<size_t>(p)];
    out.insert(out.end(), rows.begin() + static_cast<std::ptrdiff_t>(b),
               rows.begin() + static_cast<std::ptrdiff_t>(b + len(static_cast<size_t>(p))));
  }
  return out;
}

// The per-token rows of a side restricted to the rows `pick` (second plan's keep over first's
// rows).
TokenRows select_token_rows(const ChannelStage& c, const TokenRows& t,
                            const std::vector<int32_t>& pick) {
  if (!c.per_token()) return t;
  TokenRows o;
  const size_t T = static_cast<size_t>(c.topk());
  o.channels = select_rows(t.channels, pick, [&](size_t r) {
    return T > 0 ? T : static_cast<size_t>(t.counts[r]);
  });
  o.counts = select_rows(t.counts, pick, [](size_t) { return size_t{1}; });
  o.fill = select_rows(t.fill, pick, [](size_t) { return size_t{1}; });
  o.spread = select_rows(t.spread, pick, [](size_t) { return size_t{1}; });
  return o;
}

// One side of the composition: stages from the plan that sets them; conflicts refused.
SideSpec compose_side(const SideSpec& a, const SideSpec& b, bool b_keeps_all,
                      const std::vector<int32_t>& b_keep, const char* side, size_t i, int nkv) {
  const int il = static_cast<int>(i / static_cast<size_t>(std::max(1, nkv)));
  const int ih = static_cast<int>(i % static_cast<size_t>(std::max(1, nkv)));
  KVTRIM_CHECK(!(a.has_basis() && b.has_basis()),
               "compose_plans: two presses both set a %s basis for layer %d kv head %d (bases on the "
               "same side do not compose)",
               side, il, ih);
  KVTRIM_CHECK(!(a.channels_set() && b.channels_set()),
               "compose_plans: two presses both set %s channels for layer %d kv head %d (channel "
               "choices on the same side do not compose)",
               side, il, ih);
  KVTRIM_CHECK(!((a.has_basis() && b.channels_set()) || (b.has_basis() && a.channels_set())),
               "compose_plans: one press sets a %s basis and another %s channels for layer %d kv "
               "head %d (the channels were chosen in the coordinates the basis changes)",
               side, side, il, ih);
  KVTRIM_CHECK(!(a.dtype && b.dtype && *a.dtype != *b.dtype),
               "compose_plans: two presses set different %s precisions (%s, %s) for layer %d kv "
               "head %d",
               side, kv_dtype_name(*a.dtype), kv_dtype_name(*b.dtype), il, ih);
  SideSpec o;
  const SideSpec& bs = a.has_basis() ? a : b;
  o.rank = bs.rank;
  o.basis = bs.basis;
  o.decoder = bs.decoder;
  o.rope = bs.rope;
  o.dtype = a.dtype ? a.dtype : b.dtype;
  if (b.channels_set()) {
    o.channels = b.channels;  // b's rows follow b's keep order, which is the result's
    o.rows = b.rows;
  } else if (a.channels_set()) {
    o.channels = a.channels;
    o.rows = b_keeps_all ? a.rows : select_token_rows(a.channels, a.rows, b_keep);
  }
  return o;
}

}  // namespace

CompressionPlan compose_plans(const CompressionPlan& first, const CompressionPlan& second) {
  KVTRIM_CHECK(first.n_layer == second.n_layer && first.n_head_kv == second.n_head_kv,
               "compose_plans: shapes differ (%dx%d vs %dx%d)", first.n_layer, first.n_head_kv,
               second.n_layer, second.n_head_kv);
  CompressionPlan out(first.n_layer, first.n_head_kv);
  for (size_t i = 0; i < first.heads.size(); ++i) {
    const HeadPlan& a = first.heads[i];
    const HeadPlan& b = second.heads[i];
    HeadPlan& o = out.heads[i];
    // second's token indices count first's kept tokens
    auto through_a = [&](int32_t t, const char* what) {
      if (a.keep_all) return t;
      KVTRIM_CHECK(t >= 0 && static_cast<size_t>(t) < a.keep.size(),
                   "compose_plans: %s %d out of range (%zu tokens after the first plan)", what, t,
                   a.keep.size());
      return a.keep[static_cast<size_t>(t)];
    };
    // Token axis.
    o.keep_all = a.keep_all && b.keep_all;
    if (b.keep_all) {
      o.keep = a.keep;
    } else {
      o.keep.resize(b.keep.size());
      for (size_t j = 0; j < b.keep.size(); ++j) o.keep[j] = through_a(b.keep[j], "index");
    }
    // Key and value encodings, each side separately.
    o.key = compose_side(a.key, b.key, b.keep_all, b.keep, "key", i, first.n_head_kv);
    o.value = compose_side(a.value, b.value, b.keep_all, b.keep, "value", i, first.n_head_kv);
    o.appends_dense = a.appends_dense || b.appends_dense;
    KVTRIM_CHECK(a.buffer == 0 || b.buffer == 0 || a.buffer == b.buffer,
                 "compose_plans: two presses set different dense buffers (%lld, %lld tokens) for "
                 "layer %zu kv head %zu",
                 static_cast<long long>(a.buffer), static_cast<long long>(b.buffer),
                 i / static_cast<size_t>(std::max(1, first.n_head_kv)),
                 i % static_cast<size_t>(std::max(1, first.n_head_kv)));
    o.buffer = a.buffer != 0 ? a.buffer : b.buffer;
    // Anchors: first's that are still kept, plus second's mapped through first.
    std::vector<int32_t> anchors;
    for (int32_t t : a.anchors)
      if (o.keep_all || std::binary_search(o.keep.begin(), o.keep.end(), t)) anchors.push_back(t);
    for (int32_t t : b.anchors) anchors.push_back(through_a(t, "anchor"));
    std::sort(anchors.begin(), anchors.end());
    anchors.erase(std::unique(anchors.begin(), anchors.end()), anchors.end());
    o.anchors = std::move(anchors);
  }
  return out;
}

std::vector<float> kept_rows(const std::vector<float>& rows, const HeadPlan& h, size_t width) {
  if (h.keep_all) return rows;
  std::vector<float> out(h.keep.size() * width);
  for (size_t j = 0; j < h.keep.size(); ++j) {
    const size_t src = static_cast<size_t>(h.keep[j]) * width;
    KVTRIM_CHECK(src + width <= rows.size(), "kept_rows: token %d is past the %zu rows held", h.keep[j],
                 rows.size() / (width ? width : 1));
    std::copy(rows.begin() + static_cast<std::ptrdiff_t>(src), rows.begin() + static_cast<std::ptrdiff_t>(src + width),
              out.begin() + static_cast<std::ptrdiff_t>(j * width));
  }
  return out;
}

}  // namespace kvtrim
