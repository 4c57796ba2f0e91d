// Lexico: each key and value coded as a sparse combination of s atoms of a per-layer dictionary
// learned offline, by orthogonal matching pursuit, with a dense buffer of the most recent tokens
// (DESIGN.md §4.1, docs/presses-lexico.md). The baseline SWAN compares against throughout.
// Paper: Kim et al., "Lexico: Extreme KV Cache Compression via Sparse Coding over Universal
// Dictionaries" (ICML 2025).
//
// How it maps onto the cache (DESIGN.md §3): one epoch per head with
//   keys:   basis = the layer's key dictionary D_K [d, N] -> sparse codes (OMP, s_K atoms) -> fp8/f16
//   values: basis = the layer's value dictionary D_V      -> sparse codes (OMP, s_V atoms) -> fp8/f16
//   buffer: the newest b tokens stay dense; the cache codes each token leaving the buffer itself.
// Attention runs on the codes without reconstructing a key: the query is mapped once per segment
// and step into atom space (q·D_K, N floats), each score is a sparse dot over the token's s
// entries, the values are summed in atom space and mapped back once (D_V·Σ a c). The paper's
// decoding computes the same products (its Eq. for q·K̂ᵀ = (q D_K) K_csrᵀ).
//
// Storage per coded token and side: s entries of (value, uint16 atom index): 3s + 4 bytes with fp8
// values and one f32 scale per row (the default and the paper's choice: FP8 values and INT16
// indices, its 3s + 2 with a CSR offset we do not need for a fixed s), or 4s (f16). fp8
// coefficients are fitted to their grid (kv/sparse_code.h refit_rounded, by the cache): rounded
// plain, they broke Qwen2.5 (perplexity 9.5 -> 6,351 at ratio 0.5; docs/presses-lexico.md).
// The dictionaries (N·d f32 per layer and side) count under the cache's bases bytes.
//
// Options (defaults): ratio = 0.5 (fraction of a token's f16 bytes removed per side, which sets
// s = floor(((1 − ratio)·2d − scale) / (value bytes + index bytes)), at least 1), s / sv = key /
// value atoms per token (0 = from ratio; sv = 0 takes s), buffer = 128 (the paper's n_b), values =
// fp8 (the paper's) or f16, calib = the default file, prefill = after | throughout (as SWAN).
#include <algorithm>
#include <cmath>

#include "calib/lexico.h"
#include "core/error.h"
#include "kv/kv_type.h"
#include "press/calibration_source.h"

namespace kvtrim {

namespace {

struct LexicoOptions {
  double ratio = 0.5;
  int64_t s = 0, sv = 0;
  int64_t buffer = 128;
  KvDtype values = KvDtype::kFP8;
  std::string calib;
  bool throughout = false;
};

class LexicoPress : public Press {
 public:
  explicit LexicoPress(LexicoOptions o) : o_(std::move(o)), cal_("lexico", o_.calib) {}
  std::string name() const override { return "lexico"; }
  std::string calibration_id(const Model& model) const override { return cal_.identity(model); }

  CompressionPlan plan(const PressContext& ctx) const override {
    CompressionPlan out(ctx.n_layer(), ctx.n_head_kv());
    const std::shared_ptr<const Calibration> cal = cal_.get(ctx);
    for (int il = 0; il < ctx.n_layer(); ++il) plan_layer(ctx, *cal, il, &out);
    return out;
  }
  bool plans_after_append() const override { return o_.throughout; }
  CompressionPlan plan_after_append(const PressContext& ctx, int il) const override {
    CompressionPlan out(ctx.n_layer(), ctx.n_head_kv());
    KVTRIM_CHECK(il >= 0 && il < ctx.n_layer(), "press 'lexico': layer %d out of range", il);
    if (ctx.cache().head_layout(il, 0).current_epoch < 0) plan_layer(ctx, *cal_.get(ctx), il, &out);
    return out;
  }

 private:
  void plan_layer(const PressContext& ctx, const Calibration& cal, int il, CompressionPlan* out) const {
    const LexicoDicts& dict = cal.lexico();
    const int dk = ctx.head_dim_k(), dv = ctx.head_dim_v(), N = dict.n_atoms;
    const int sk = atoms(o_.s, dk, N), sv = atoms(o_.sv > 0 ? o_.sv : o_.s, dv, N);
    for (int ih = 0; ih < ctx.n_head_kv(); ++ih) {
      HeadPlan& hp = out->at(il, ih);
      side(&hp.key, dict.k[static_cast<size_t>(il)], N, sk);
      side(&hp.value, dict.v[static_cast<size_t>(il)], N, sv);
      hp.buffer = o_.buffer;
    }
  }
  // Atoms per token of a side of width d: `s` when given, else from ratio; in [1, min(d, N)].
  int atoms(int64_t s, int d, int N) const {
    const int hi = std::min(d, N);
    if (s > 0) {
      KVTRIM_CHECK(s <= hi, "press 'lexico': %lld atoms per token is more than min(head size %d, dictionary "
                   "atoms %d)", static_cast<long long>(s), d, N);
      return static_cast<int>(s);
    }
    const KvTypeInfo& vt = kv_type(o_.values);
    const double val = static_cast<double>(vt.code_bytes(1)), idx = N <= 256 ? 1.0 : 2.0;
    const double scale = vt.scale == KvScale::kRow ? 4.0 : 0.0;
    const double budget = (1.0 - o_.ratio) * 2.0 * d - scale;
    return std::clamp(static_cast<int>(std::floor(budget / (val + idx) + 1e-9)), 1, hi);
  }
  void side(SideSpec* sp, const std::vector<float>& D, int N, int s) const {
    sp->rank = N;
    sp->basis = D;
    sp->channels = SparseCodeChannels{.topk = s};
    sp->dtype = o_.values;
  }

  LexicoOptions o_;
  CalibrationSource cal_;
};

}  // namespace

PressInfo lexico_press_info() {
  PressInfo i;
  i.name = "lexico";
  i.description = "code each key / value as s atoms of a per-layer dictionary (OMP), dense recent buffer";
  i.paper = "Lexico: Extreme KV Cache Compression via Sparse Coding over Universal Dictionaries (Kim et al., ICML 2025)";
  i.options = {
      {"ratio", "0.5", "fraction of a token's f16 bytes removed per side, in [0, 1): sets s (atoms per token)"},
      {"s", "0", "keys' atoms per token (0 = from ratio)"},
      {"sv", "0", "values' atoms per token (0 = the keys' count)"},
      {"buffer", "128", "n_b: the newest n_b tokens stay dense (0 = every token coded)"},
      {"values", "fp8", "precision of the stored coefficients: fp8 (the paper's; fitted to the fp8 grid) or f16"},
      {"calib", "", "calibration file with Lexico dictionaries (kvtrim calibrate --lexico; default: "
                    "<model>.kvcalib next to the model's .gguf)"},
      {"prefill", "after", "after: code once the prompt is prefilled (its attention is dense); throughout: from the "
                           "first forward call on (the prompt's attention reads the coded cache)"}};
  i.axis = PressAxis::kChannel;  // every token kept, coded in fewer bytes
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    LexicoOptions o;
    o.ratio = a.get_double_in("ratio", 0.0, 1.0, false);
    o.s = a.get_int_min("s", 0);
    o.sv = a.get_int_min("sv", 0);
    o.buffer = a.get_int_min("buffer", 0);
    o.values = a.get_choice<KvDtype>("values", {{"fp8", KvDtype::kFP8}, {"f16", KvDtype::kF16}});
    o.calib = a.get_string("calib");
    o.throughout = a.get_choice<bool>("prefill", {{"after", false}, {"throughout", true}});
    return std::make_unique<LexicoPress>(o);
  };
  return i;
}

}  // namespace kvtrim
