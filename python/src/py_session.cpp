// kvtrim.Session: one context step by step — prefill, decode, compress with any press, and the
// cache read back as numpy arrays. The engine runs with the GIL released; Ctrl-C is seen
// between prefill chunks and decode steps.
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "core/error.h"
#include "engine/document_qa.h"
#include "kv/kv_types.h"
#include "py_common.h"

namespace kvtrim::py {

nb::dict compress_stats_dict(const CompressStats& st) {
  nb::dict d;
  d["tokens_before"] = st.tokens_before;
  d["tokens_after"] = st.tokens_after;
  d["bytes_before"] = st.bytes_before;
  d["bytes_after"] = st.bytes_after;
  d["seconds"] = st.seconds;
  if (st.loss.measured) {
    d["loss"] = st.loss.rel_err;
    d["evicted_mass"] = st.loss.evicted_mass;
    d["loss_queries"] = std::string(loss_queries_name(st.loss.queries));
  }
  return d;
}

nb::dict kv_bytes_dict(const KvCache& c) {
  const KvBytes b = c.bytes();
  nb::dict d;
  d["keys"] = b.keys;
  d["values"] = b.values;
  d["positions"] = b.positions;
  d["scales"] = b.scales;
  d["bases"] = b.bases;
  d["indices"] = b.indices;
  d["bitmasks"] = b.bitmasks;
  d["fills"] = b.fills;
  d["other"] = b.other;
  d["total"] = b.total();
  d["dense_f16"] = c.dense_bytes_f16();
  nb::list layers;
  for (size_t x : b.per_layer) layers.append(x);
  d["per_layer"] = layers;
  return d;
}

SessionParams session_params_for(const PyModel& m, std::optional<int64_t> n_ctx, std::optional<int> threads,
                                 std::optional<std::string> kv_type) {
  SessionParams p;
  p.n_ctx = n_ctx.value_or(m.n_ctx);
  p.n_threads = threads.value_or(m.threads);
  p.kv_dtype = kv_dtype_from_name(kv_type.value_or(m.kv_type));
  KVTRIM_CHECK(p.n_ctx >= 0, "n_ctx must be >= 0 (got %lld)", static_cast<long long>(p.n_ctx));
  KVTRIM_CHECK(p.n_threads >= 0, "threads must be >= 0 (got %d)", p.n_threads);
  return p;
}

namespace {

// Observations a session without a press captures, so that compress(press) works for the
// window-scored presses (SnapKV, PyramidKV, TOVA, ThinK, ...: windows up to 64 queries).
constexpr int64_t kDefaultObserveWindow = 64;

class PySession {
 public:
  PySession(nb::object model, nb::handle press, std::optional<int64_t> n_ctx, std::optional<int> threads,
            std::optional<std::string> kv_type, int64_t observe_window)
      : model_ref_(std::move(model)), m_(nb::cast<PyModel&>(model_ref_)) {
    KVTRIM_CHECK(observe_window >= 0, "observe_window must be >= 0 (got %lld)", static_cast<long long>(observe_window));
    s_ = std::make_unique<Session>(*m_.model, session_params_for(m_, n_ctx, threads, kv_type));
    set_press(press, observe_window);
  }

  void set_press(nb::handle press, int64_t observe_window) {
    check_no_views("set_press");
    KVTRIM_CHECK(s_->n_past() == 0, "set a press before the first prefill (the session holds %d positions; reset() first)",
                 s_->n_past());
    auto p = press_from_object(press);
    if (p) {
      PressSchedule sched;
      sched.after_prefill = false;
      s_->set_press(std::move(p), sched);
    } else {
      s_->set_press(nullptr);
      PressNeeds n;
      n.window = observe_window;
      if (observe_window > 0) s_->set_observer(n);
    }
  }

  nb::ndarray<nb::numpy, float> prefill(const std::vector<int32_t>& tokens) {
    check_no_views("prefill");
    KVTRIM_CHECK(!tokens.empty(), "prefill: no tokens");
    PyInterrupts py;
    {
      nb::gil_scoped_release nogil;
      prefill_chunks(*s_, tokens, [&] { return py.poll(); });
    }
    py.rethrow();
    return logits();
  }

  nb::ndarray<nb::numpy, float> decode(int32_t token) {
    check_no_views("decode");
    {
      nb::gil_scoped_release nogil;
      s_->decode(token);
    }
    return logits();
  }

  nb::ndarray<nb::numpy, float> logits() const { return owned_array<float>(s_->logits(), {s_->logits().size()}); }

  nb::dict generate(const std::vector<int32_t>& prompt, int max_tokens, float temperature, int top_k, float top_p,
                    uint64_t seed, bool stop_at_eog, const std::vector<std::string>& stop, nb::object on_token) {
    check_no_views("generate");
    KVTRIM_CHECK(!prompt.empty() || s_->n_past() > 0, "generate: an empty prompt on an empty session");
    KVTRIM_CHECK(max_tokens >= 0, "max_tokens must be >= 0 (got %d)", max_tokens);
    GenerateParams gp;
    gp.max_new_tokens = max_tokens;
    gp.sampling = {temperature, top_k, top_p, seed};
    gp.stop_at_eog = stop_at_eog;
    gp.stop_strings = stop;
    PyInterrupts py;
    GenerateResult r;
    {
      nb::gil_scoped_release nogil;
      r = s_->generate(prompt, gp, [&](int32_t, const std::string& piece) { return !py.poll() && py.call(on_token, piece); });
    }
    py.rethrow();
    nb::dict d;
    d["text"] = r.text;
    d["tokens"] = r.tokens;
    d["stop"] = std::string(stop_reason_name(r.stop));
    d["n_prompt"] = r.n_prompt;
    d["prefill_tps"] = r.prefill_tps();
    d["decode_tps"] = r.decode_tps();
    return d;
  }

  nb::dict compress(nb::handle press, int64_t budget) {
    check_no_views("compress");
    KVTRIM_CHECK(budget >= 0, "budget must be >= 0 (got %lld)", static_cast<long long>(budget));
    std::unique_ptr<Press> p = press_from_object(press);
    KVTRIM_CHECK(p || s_->press(), "compress: no press given and the session has none");
    Budget b;
    b.n_keep = budget;
    CompressStats st;
    {
      nb::gil_scoped_release nogil;
      if (p && budget > 0) st = s_->compress_with(*p, b);
      else if (p) st = s_->compress_with(*p);
      else if (budget > 0) st = s_->compress(b);
      else st = s_->compress();
    }
    return compress_stats_dict(st);
  }

  nb::ndarray<nb::numpy, float> keys(int il, int ih) const { return head_array(il, ih, true); }
  nb::object values(int il, int ih, bool raw) {
    if (!raw) return nb::cast(head_array(il, ih, false));
    check_head(il, ih);
    const KvCache::RawRows r = s_->cache().raw_values(il, ih);
    if (!r.has())
      throw nb::value_error(strprintf("values(%d, %d, raw=True): this head's values are not stored as plain rows (a "
                                      "compressed encoding or a quantized type); use raw=False for a decoded copy",
                                      il, ih)
                                .c_str());
    // A read-only view; while it is alive the session refuses to change the cache (as numpy's
    // resize refuses while other arrays refer to an array's memory).
    auto* guard = new std::shared_ptr<int>(views_);
    ++*views_;
    nb::capsule owner(guard, [](void* x) noexcept {
      auto* g = static_cast<std::shared_ptr<int>*>(x);
      --**g;
      delete g;
    });
    const size_t shape[2] = {static_cast<size_t>(r.n), static_cast<size_t>(r.dim)};
    const size_t esz = static_cast<size_t>(kv_type(r.dtype).code_bits / 8);
    const int64_t strides[2] = {static_cast<int64_t>(r.row_bytes / esz), 1};
    nb::dlpack::dtype dt{static_cast<uint8_t>(r.dtype == KvDtype::kBF16 ? nb::dlpack::dtype_code::Bfloat
                                                                          : nb::dlpack::dtype_code::Float),
                         static_cast<uint8_t>(esz * 8), 1};
    static const uint16_t kEmpty = 0;
    const void* data = r.data ? r.data : &kEmpty;
    return nb::cast(nb::ndarray<nb::numpy, nb::ro>(data, 2, shape, owner, strides, dt));
  }
  nb::ndarray<nb::numpy, int32_t> positions(int il, int ih) const {
    check_head(il, ih);
    std::vector<int32_t> pos;
    s_->cache().read_head(il, ih, nullptr, nullptr, &pos);
    const size_t n = pos.size();
    return owned_array<int32_t>(std::move(pos), {n});
  }
  int64_t n_tokens(int il, int ih) const {
    check_head(il, ih);
    return s_->cache().n_tokens(il, ih);
  }
  void reset() {
    check_no_views("reset");
    s_->reset();
  }
  void truncate(int32_t pos) {
    check_no_views("truncate");
    KVTRIM_CHECK(pos >= 0 && pos <= s_->n_past(), "truncate(%d): the session holds positions [0, %d)", pos, s_->n_past());
    s_->truncate(pos);
  }
  Session& session() { return *s_; }
  const Session& session() const { return *s_; }

 private:
  void check_head(int il, int ih) const {
    const KvCacheConfig& c = s_->cache().config();
    if (il < 0 || il >= c.n_layer || ih < 0 || ih >= c.n_head_kv)
      throw nb::index_error(strprintf("(layer %d, kv head %d) out of range: %d layers x %d kv heads", il, ih, c.n_layer,
                                      c.n_head_kv)
                                .c_str());
  }
  nb::ndarray<nb::numpy, float> head_array(int il, int ih, bool want_k) const {
    check_head(il, ih);
    std::vector<float> x;
    s_->cache().read_head(il, ih, want_k ? &x : nullptr, want_k ? nullptr : &x, nullptr);
    const KvCacheConfig& c = s_->cache().config();
    const size_t d = static_cast<size_t>(want_k ? c.head_dim_k : c.head_dim_v);
    return owned_array<float>(std::move(x), {static_cast<size_t>(s_->cache().n_tokens(il, ih)), d});
  }
  void check_no_views(const char* what) const {
    if (*views_ > 0)
      throw nb::buffer_error(strprintf("%s would change the cache while %d raw view(s) of it from values(raw=True) are "
                                       "alive: delete them (del v) or copy them (v.copy()) first",
                                       what, *views_)
                                 .c_str());
  }

  nb::object model_ref_;  // keeps the model alive
  PyModel& m_;
  std::unique_ptr<Session> s_;
  std::shared_ptr<int> views_ = std::make_shared<int>(0);
};

}  // namespace

void register_session(nb::module_& m) {
  nb::class_<PySession>(m, "Session")
      .def(nb::init<nb::object, nb::handle, std::optional<int64_t>, std::optional<int>, std::optional<std::string>, int64_t>(),
           nb::arg("model"), nb::arg("press") = nb::none(), nb::arg("n_ctx") = nb::none(), nb::arg("threads") = nb::none(),
           nb::arg("kv_type") = nb::none(), nb::arg("observe_window") = kDefaultObserveWindow)
      .def("set_press", &PySession::set_press, nb::arg("press"), nb::arg("observe_window") = kDefaultObserveWindow)
      .def("prefill", &PySession::prefill, nb::arg("tokens"))
      .def("decode", &PySession::decode, nb::arg("token"))
      .def_prop_ro("logits", &PySession::logits)
      .def("generate", &PySession::generate, nb::arg("prompt"), nb::arg("max_tokens") = 128, nb::arg("temperature") = 0.f,
           nb::arg("top_k") = 40, nb::arg("top_p") = 0.95f, nb::arg("seed") = 42, nb::arg("stop_at_eog") = true,
           nb::arg("stop") = std::vector<std::string>{}, nb::arg("on_token") = nb::none())
      .def("compress", &PySession::compress, nb::arg("press") = nb::none(), nb::arg("budget") = 0)
      .def("kv_bytes", [](const PySession& s) { return kv_bytes_dict(s.session().cache()); })
      .def("keys", &PySession::keys, nb::arg("layer"), nb::arg("head"))
      .def("values", &PySession::values, nb::arg("layer"), nb::arg("head"), nb::arg("raw") = false)
      .def("positions", &PySession::positions, nb::arg("layer"), nb::arg("head"))
      .def("n_tokens", &PySession::n_tokens, nb::arg("layer"), nb::arg("head"))
      .def_prop_ro("n_past", [](const PySession& s) { return s.session().n_past(); })
      .def_prop_ro("n_ctx", [](const PySession& s) { return s.session().n_ctx(); })
      .def_prop_ro("press", [](const PySession& s) -> std::optional<std::string> {
        if (!s.session().press()) return std::nullopt;
        return s.session().press()->spec();
      })
      .def("describe", [](const PySession& s) { return s.session().cache().describe(); })
      .def("reset", &PySession::reset)
      .def("truncate", &PySession::truncate, nb::arg("pos"));
}

}  // namespace kvtrim::py
