// Presses from Python: the registry (every built-in press, its options and docs, for the press
// classes kvtrim.presses makes), press strings and press objects to C++ presses, and ScorerPress
// subclasses written in Python (kvpress's ScorerPress.score): kvtrim reads each layer's heads,
// calls the object's score with numpy arrays, and keeps the top-k as for its own presses.
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"
#include "press/press_spec.h"
#include "py_common.h"

namespace kvtrim::py {

namespace {

// A kvtrim.ScorerPress instance (python/kvtrim/presses.py) as a C++ ScorerPress. The object's
// _score_layer(layer, keys, values, queries, positions) calls the user's score and checks what
// it returns (shape, NaN), giving back float32 scores [n_kv_heads, n_tokens] (a list of
// per-head arrays when the heads hold different counts, after an earlier press of a
// composition).
class PyScorerPress final : public ScorerPress {
 public:
  PyScorerPress(nb::object obj, Budget b, int64_t window, std::string name)
      : ScorerPress(b), obj_(std::move(obj)), window_(window), name_(std::move(name)) {}
  ~PyScorerPress() override {
    nb::gil_scoped_acquire gil;
    obj_ = nb::object();
  }
  std::string name() const override { return name_; }
  PressNeeds needs() const override {
    PressNeeds n;
    n.window = window_;
    return n;
  }

  void score_layer(const PressContext& ctx, int il, std::vector<std::vector<float>>* scores) const override {
    const int nkv = ctx.n_head_kv(), dk = ctx.head_dim_k(), dv = ctx.head_dim_v();
    std::vector<HeadData> heads(static_cast<size_t>(nkv));
    bool same = true;
    for (int ih = 0; ih < nkv; ++ih) {
      ctx.read_head(il, ih, &heads[static_cast<size_t>(ih)], true, true);
      same = same && heads[static_cast<size_t>(ih)].n == heads[0].n;
    }
    // The window's queries [n_head, W, head_dim_k] (kvpress's layout), W = 0 without.
    std::vector<float> q;
    int64_t w = 0;
    if (window_ > 0 && ctx.has_observations()) {
      const ObservedQueries& oq = ctx.queries(il, false, name_.c_str());
      w = std::min<int64_t>(window_, oq.n);
      q.resize(static_cast<size_t>(ctx.n_head() * w * dk));
      for (int h = 0; h < ctx.n_head(); ++h)
        for (int64_t i = 0; i < w; ++i) {
          const float* src = oq.query(oq.n - w + i, h, ctx.n_head(), dk);
          std::copy(src, src + dk, q.begin() + static_cast<std::ptrdiff_t>((h * w + i) * dk));
        }
    }
    nb::gil_scoped_acquire gil;
    nb::object keys, values, pos;
    if (same) {
      const size_t n = static_cast<size_t>(heads[0].n);
      std::vector<float> k(static_cast<size_t>(nkv) * n * static_cast<size_t>(dk)), v(static_cast<size_t>(nkv) * n * static_cast<size_t>(dv));
      std::vector<int32_t> p(static_cast<size_t>(nkv) * n);
      for (int ih = 0; ih < nkv; ++ih) {
        const HeadData& h = heads[static_cast<size_t>(ih)];
        std::copy(h.k.begin(), h.k.end(), k.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(ih) * n * static_cast<size_t>(dk)));
        std::copy(h.v.begin(), h.v.end(), v.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(ih) * n * static_cast<size_t>(dv)));
        std::copy(h.pos.begin(), h.pos.end(), p.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(ih) * n));
      }
      keys = nb::cast(owned_array<float>(std::move(k), {static_cast<size_t>(nkv), n, static_cast<size_t>(dk)}));
      values = nb::cast(owned_array<float>(std::move(v), {static_cast<size_t>(nkv), n, static_cast<size_t>(dv)}));
      pos = nb::cast(owned_array<int32_t>(std::move(p), {static_cast<size_t>(nkv), n}));
    } else {
      nb::list kl, vl, pl;
      for (HeadData& h : heads) {
        const size_t n = static_cast<size_t>(h.n);
        kl.append(owned_array<float>(std::move(h.k), {n, static_cast<size_t>(dk)}));
        vl.append(owned_array<float>(std::move(h.v), {n, static_cast<size_t>(dv)}));
        pl.append(owned_array<int32_t>(std::move(h.pos), {n}));
      }
      keys = kl;
      values = vl;
      pos = pl;
    }
    nb::object queries = nb::cast(owned_array<float>(std::move(q), {static_cast<size_t>(ctx.n_head()), static_cast<size_t>(w), static_cast<size_t>(dk)}));
    // A Python exception (the user's, or the shape / NaN checks) propagates as nb::python_error;
    // the plan is not applied, so the cache is unchanged.
    nb::object res = obj_.attr("_score_layer")(il, keys, values, queries, pos);
    // The result as a sequence of per-head rows (a 2-D array iterates by rows, a list by heads).
    nb::list rows;
    for (nb::handle r : res) rows.append(r);
    if (nb::len(rows) != static_cast<size_t>(nkv))
      throw nb::value_error(strprintf("press %s: layer %d: scores for %zu heads, the layer has %d", name_.c_str(), il,
                                      nb::len(rows), nkv).c_str());
    for (int ih = 0; ih < nkv; ++ih) {
      nb::object row = rows[static_cast<size_t>(ih)];
      auto a = nb::cast<nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>>(row);
      const size_t n = static_cast<size_t>(heads[static_cast<size_t>(ih)].n);
      if (a.shape(0) != n)
        throw nb::value_error(strprintf("press %s: layer %d head %d: %zu scores for %zu tokens", name_.c_str(), il, ih,
                                        static_cast<size_t>(a.shape(0)), n).c_str());
      (*scores)[static_cast<size_t>(ih)].assign(a.data(), a.data() + n);
    }
  }

 private:
  nb::object obj_;
  int64_t window_;
  std::string name_;
};

std::unique_ptr<Press> press_from_part(nb::handle part) {
  if (nb::isinstance<nb::str>(part)) {
    const std::string spec = nb::cast<std::string>(part);
    KVTRIM_CHECK(!spec.empty() && spec != "none", "'none' (no press) cannot be part of a composition");
    return make_press(spec);
  }
  if (nb::hasattr(part, "_score_layer")) {
    Budget b;
    b.ratio = nb::cast<double>(part.attr("ratio"));
    b.n_keep = nb::cast<int64_t>(part.attr("budget"));
    KVTRIM_CHECK(b.ratio >= 0 && b.ratio < 1, "ScorerPress: ratio must be in [0, 1) (got %g)", b.ratio);
    KVTRIM_CHECK(b.n_keep >= 0, "ScorerPress: budget must be >= 0 (got %lld)", static_cast<long long>(b.n_keep));
    const int64_t window = nb::cast<int64_t>(part.attr("window"));
    KVTRIM_CHECK(window >= 0, "ScorerPress: window must be >= 0 (got %lld)", static_cast<long long>(window));
    const std::string name = nb::cast<std::string>(part.attr("_spec")());
    auto p = std::make_unique<PyScorerPress>(nb::borrow<nb::object>(part), b, window, name);
    p->set_spec(name);
    return p;
  }
  throw nb::type_error("a press is a press string, a kvtrim.presses press or a kvtrim.ScorerPress");
}

}  // namespace

std::unique_ptr<Press> press_from_object(nb::handle obj) {
  if (obj.is_none()) return nullptr;
  if (nb::isinstance<nb::str>(obj)) {
    const std::string spec = nb::cast<std::string>(obj);
    if (spec.empty() || spec == "none") return nullptr;
    return make_press(spec);
  }
  if (!nb::hasattr(obj, "_parts")) throw nb::type_error("a press is a press string, a kvtrim.presses press or a kvtrim.ScorerPress");
  nb::list parts = nb::list(obj.attr("_parts")());
  KVTRIM_CHECK(nb::len(parts) > 0, "an empty press");
  std::vector<std::unique_ptr<Press>> ps;
  std::string spec;
  for (nb::handle part : parts) {
    ps.push_back(press_from_part(part));
    spec += (spec.empty() ? "" : "+") + ps.back()->spec();
  }
  if (ps.size() == 1) return std::move(ps[0]);
  auto c = std::make_unique<ComposedPress>(std::move(ps));
  c->set_spec(spec);
  return c;
}

void register_presses(nb::module_& m) {
  m.def(
      "press_registry",
      [] {
        nb::list out;
        for (const PressInfo& p : press_registry()) {
          nb::list opts;
          for (const PressOption& o : p.options) opts.append(nb::make_tuple(o.name, o.default_value, o.help));
          nb::dict d;
          d["name"] = p.name;
          d["description"] = p.description;
          d["paper"] = p.paper;
          d["options"] = opts;
          d["wrapper"] = p.wrapper;
          d["axis"] = press_axis_name(p.axis);
          d["per_layer_budget"] = p.per_layer_budget;
          d["feature_axis"] = p.axis == PressAxis::kBasis;  // the keys before PressInfo::axis
          d["channel_axis"] = p.axis == PressAxis::kChannel;
          out.append(d);
        }
        return out;
      },
      "Every registered press: name, description, paper, options (name, default, help), wrapper, "
      "axis (token, basis, channel, precision), per_layer_budget.");
  m.def(
      "check_press",
      [](nb::handle press) {
        auto p = press_from_object(press);
        return p ? p->spec() : std::string("none");
      },
      nb::arg("press"), "The canonical spec of a press (string or object); raises ValueError for a bad one.");
}

}  // namespace kvtrim::py
