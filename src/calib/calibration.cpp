// The calibration file (docs/calibration.md "File format"): a GGUF v3 file written with
// kvtrim's own writer, general.architecture = "kvtrim-calibration", the format version, the
// model fingerprint, provenance strings, and per layer f32 tensors:
//   blk.<il>.<method>.{k,v}_enc     [n_head_kv, d, d]  (ne = {d, d, n_head_kv}; row-major [d, d]
//   per head) blk.<il>.<method>.{k,v}_dec     [n_head_kv, d, d]  (oblique fits only)
//   blk.<il>.<method>.{k,v}_energy  [n_head_kv, d]
//   blk.<il>.stats.<gram_k|gram_q|gram_v|gram_k_pre|gram_q_pre|gram_vo>  [n_head_kv, d, d]
//   blk.<il>.stats.<sum_k|sum_v|sum_k_pre>                              [n_head_kv, d]
//   blk.<il>.io.{x_in,x_out}        [R, n_embd]
//   blk.<il>.stief.*, blk.<il>.lexico.*  (stief_fits.h, lexico.h)
// A 64-bit checksum of every tensor's bytes (in file order) is stored as a key, so a bit flip
// inside tensor data, which the GGUF structure cannot notice, is reported as damage.
#include "calib/calibration.h"

#include "calib/hash.h"
#include "calib/lexico.h"
#include "calib/stief_fits.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model.h"

namespace kvtrim {

namespace {

constexpr const char* kArch = "kvtrim-calibration";
constexpr const char* kPrefix = "kvtrim.calibration.";
constexpr const char* kMetaPrefix = "kvtrim.calibration.meta.";


std::string hex64(uint64_t v) {
  return strprintf("%016llx", static_cast<unsigned long long>(v));
}

std::string shape_str(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

std::string tname(int il, const std::string& what) {
  return "blk." + std::to_string(il) + "." + what;
}

// Reads f32 tensors of an opened calibration file with shape checks naming the file.
struct Reader {
  const GgufFile& f;
  const std::string& path;
  const GgufTensor& get(const std::string& name, const std::vector<int64_t>& ne) const {
    const GgufTensor* t = f.find_tensor(name);
    KVTRIM_CHECK(t, "calibration file '%s' is incomplete: missing tensor '%s'", path.c_str(),
                 name.c_str());
    KVTRIM_CHECK(t->type == GgmlType::F32 && t->ne == ne,
                 "calibration file '%s': tensor '%s' is %s %s, expected f32 %s", path.c_str(),
                 name.c_str(), std::string(ggml_type_name(t->type)).c_str(),
                 shape_str(t->ne).c_str(), shape_str(ne).c_str());
    return *t;
  }
  // Head ih's slice of `per_head` floats, as float or double.
  std::vector<float> slice_f(const GgufTensor& t, int ih, size_t per_head) const {
    const float* p = reinterpret_cast<const float*>(t.data) + ih * per_head;
    return std::vector<float>(p, p + per_head);
  }
  std::vector<double> slice_d(const GgufTensor& t, int ih, size_t per_head) const {
    const float* p = reinterpret_cast<const float*>(t.data) + ih * per_head;
    return std::vector<double>(p, p + per_head);
  }
};

}  // namespace

const char* basis_method_name(BasisMethod m) {
  switch (m) {
    case BasisMethod::kKSvd:
      return "ksvd";
    case BasisMethod::kEigenAttention:
      return "eigenattention";
    case BasisMethod::kKqSvd:
      return "kqsvd";
    case BasisMethod::kStaticPca:
      return "staticpca";
    case BasisMethod::kSwan:
      return "swan";
  }
  return "?";
}

std::vector<BasisMethod> all_basis_methods() {
  return {BasisMethod::kKSvd, BasisMethod::kEigenAttention, BasisMethod::kKqSvd,
          BasisMethod::kStaticPca, BasisMethod::kSwan};
}

BasisMethod parse_basis_method(const std::string& name) {
  std::string valid;
  for (BasisMethod m : all_basis_methods()) {
    if (name == basis_method_name(m)) return m;
    valid += std::string(valid.empty() ? "" : ", ") + basis_method_name(m);
  }
  fail("unknown basis method '%s' (valid: %s)", name.c_str(), valid.c_str());
}

int SideFit::rank_for_energy(double frac) const {
  KVTRIM_CHECK(frac > 0 && frac <= 1, "energy fraction must be in (0, 1] (got %g)", frac);
  KVTRIM_CHECK(d > 0 && energy.size() == static_cast<size_t>(d), "rank_for_energy on an empty fit");
  double total = 0;
  for (double e : energy) total += e;
  if (total <= 0) return 1;
  double acc = 0;
  for (int r = 1; r <= d; ++r) {
    acc += energy[r - 1];
    // relative slack so frac = 1 is reached despite rounding in the sum
    if (acc >= frac * total * (1 - 1e-12)) return r;
  }
  return d;
}

std::vector<float> SideFit::enc_cols(int r) const {
  KVTRIM_CHECK(r >= 1 && r <= d, "rank %d out of range [1, %d]", r, d);
  std::vector<float> out(static_cast<size_t>(d) * r);
  for (int i = 0; i < d; ++i)
    std::copy(enc.begin() + i * d, enc.begin() + i * d + r, out.begin() + i * r);
  return out;
}

std::vector<float> SideFit::dec_cols(int r) const {
  if (dec.empty()) return enc_cols(r);
  KVTRIM_CHECK(r >= 1 && r <= d, "rank %d out of range [1, %d]", r, d);
  std::vector<float> out(static_cast<size_t>(d) * r);
  for (int i = 0; i < d; ++i)
    std::copy(dec.begin() + i * d, dec.begin() + i * d + r, out.begin() + i * r);
  return out;
}

int rank_for_ratio(double ratio, int d) {
  KVTRIM_CHECK(ratio > 0 && ratio <= 1, "KV ratio must be in (0, 1] (got %g)", ratio);
  return std::clamp(static_cast<int>(std::lround(ratio * d)), 1, d);
}

std::string ModelFingerprint::describe() const {
  return strprintf(
      "%s '%s': %d layers, %d heads / %d kv heads, head_dim %d/%d, n_embd %d, attention weights %s",
      arch.c_str(), name.c_str(), n_layer, n_head, n_head_kv, head_dim_k, head_dim_v, n_embd,
      hex64(weights_hash).c_str());
}

ModelFingerprint model_fingerprint(const Model& model) {
  const HParams& hp = model.hparams();
  ModelFingerprint fp;
  fp.arch = arch_name(hp.arch);
  fp.name = hp.name;
  fp.n_layer = hp.n_layer;
  fp.n_head = hp.n_head;
  fp.n_head_kv = hp.n_head_kv;
  fp.head_dim_k = hp.head_dim_k;
  fp.head_dim_v = hp.head_dim_v;
  fp.n_embd = hp.n_embd;
  // Every byte of the attention projections (a few tens of MB at most: word-wise hashing
  // costs well under a second), with types and shapes.
  Hasher h;
  for (const LayerWeights& lw : model.layers()) {
    for (const WeightView* w : {&lw.wq, &lw.wk, &lw.wv, &lw.wo}) {
      h.word(static_cast<uint64_t>(w->type));
      h.word(static_cast<uint64_t>(w->n_rows));
      h.word(static_cast<uint64_t>(w->n_cols));
      if (w->data) h.bytes(w->data, static_cast<size_t>(w->n_rows) * w->row_bytes);
    }
  }
  fp.weights_hash = h.finish();
  return fp;
}

Calibration::Calibration(ModelFingerprint fp, int n_layer, int n_head_kv)
    : fp_(std::move(fp)), n_layer_(n_layer), n_head_kv_(n_head_kv) {}

void Calibration::check_model(const Model& model, const std::string& path) const {
  const ModelFingerprint want = model_fingerprint(model);
  KVTRIM_CHECK(fp_ == want,
               "calibration file '%s' was made for another model:\n  file:  %s\n  model: %s",
               path.c_str(), fp_.describe().c_str(), want.describe().c_str());
}

const HeadFit& Calibration::fit(BasisMethod m, int il, int ih) const {
  auto it = fits_.find(m);
  if (it == fits_.end()) {
    std::string have;
    for (BasisMethod x : methods())
      have += std::string(have.empty() ? "" : ", ") + basis_method_name(x);
    fail("the calibration holds no %s fit (it has: %s)", basis_method_name(m),
         have.empty() ? "none" : have.c_str());
  }
  KVTRIM_CHECK(il >= 0 && il < n_layer_ && ih >= 0 && ih < n_head_kv_,
               "calibration fit (%d, %d) out of range (%d layers, %d kv heads)", il, ih, n_layer_,
               n_head_kv_);
  return it->second[static_cast<size_t>(il) * n_head_kv_ + ih];
}

void Calibration::set_fits(BasisMethod m, std::vector<HeadFit> fits) {
  KVTRIM_CHECK(fits.size() == static_cast<size_t>(n_layer_) * n_head_kv_,
               "set_fits: %zu fits for %d layers x %d kv heads", fits.size(), n_layer_, n_head_kv_);
  fits_[m] = std::move(fits);
}

const HeadStats& Calibration::stats(int il, int ih) const {
  KVTRIM_CHECK(has_stats(), "the calibration holds no statistics");
  KVTRIM_CHECK(il >= 0 && il < n_layer_ && ih >= 0 && ih < n_head_kv_,
               "calibration stats (%d, %d) out of range", il, ih);
  return stats_[static_cast<size_t>(il) * n_head_kv_ + ih];
}

void Calibration::set_stats(std::vector<HeadStats> stats) {
  KVTRIM_CHECK(stats.empty() || stats.size() == static_cast<size_t>(n_layer_) * n_head_kv_,
               "set_stats: %zu entries for %d layers x %d kv heads", stats.size(), n_layer_,
               n_head_kv_);
  stats_ = std::move(stats);
}

const LayerIoSample& Calibration::layer_io(int il) const {
  KVTRIM_CHECK(
      has_layer_io(),
      "the calibration holds no layer input/output samples (calibrate with --layer-io-rows > 0)");
  KVTRIM_CHECK(il >= 0 && il < n_layer_, "layer %d out of range", il);
  return layer_io_[il];
}

void Calibration::set_layer_io(std::vector<LayerIoSample> io) {
  KVTRIM_CHECK(io.empty() || io.size() == static_cast<size_t>(n_layer_),
               "set_layer_io: %zu entries for %d layers", io.size(), n_layer_);
  layer_io_ = std::move(io);
}

const StiefFits& Calibration::stief() const {
  KVTRIM_CHECK(stief_, "the calibration holds no StiefAttention bases (run `kvtrim calibrate "
               "--stief`; see docs/stiefattention.md)");
  return *stief_;
}

const LexicoDicts& Calibration::lexico() const {
  KVTRIM_CHECK(lexico_, "the calibration holds no Lexico dictionaries (run `kvtrim calibrate --lexico`; see "
               "docs/presses-lexico.md)");
  return *lexico_;
}

void Calibration::set_lexico(std::shared_ptr<const LexicoDicts> d) {
  if (d) {
    d->validate(n_layer_);
    KVTRIM_CHECK(d->dk == fp_.head_dim_k && d->dv == fp_.head_dim_v,
                 "Lexico dictionaries of head dims %d / %d for a model with %d / %d", d->dk, d->dv,
                 fp_.head_dim_k, fp_.head_dim_v);
  }
  lexico_ = std::move(d);
}

void Calibration::set_stief(std::shared_ptr<const StiefFits> s) {
  if (s) s->validate(n_layer_);
  stief_ = std::move(s);
}

std::vector<BasisMethod> Calibration::methods() const {
  std::vector<BasisMethod> out;
  for (const auto& [m, f] : fits_) out.push_back(m);
  return out;
}

void Calibration::save(const std::string& path) const {
  const int L = n_layer_, H = n_head_kv_, dk = fp_.head_dim_k, dv = fp_.head_dim_v;
  GgufWriter w;
  w.set_string("general.architecture", kArch);
  w.set_string("general.name", "kvtrim calibration for " + fp_.name);
  w.set_u32(std::string(kPrefix) + "version", kFormatVersion);
  w.set_string(std::string(kPrefix) + "model.arch", fp_.arch);
  w.set_string(std::string(kPrefix) + "model.name", fp_.name);
  w.set_u32(std::string(kPrefix) + "model.n_layer", static_cast<uint32_t>(fp_.n_layer));
  w.set_u32(std::string(kPrefix) + "model.n_head", static_cast<uint32_t>(fp_.n_head));
  w.set_u32(std::string(kPrefix) + "model.n_head_kv", static_cast<uint32_t>(fp_.n_head_kv));
  w.set_u32(std::string(kPrefix) + "model.head_dim_k", static_cast<uint32_t>(dk));
  w.set_u32(std::string(kPrefix) + "model.head_dim_v", static_cast<uint32_t>(dv));
  w.set_u32(std::string(kPrefix) + "model.n_embd", static_cast<uint32_t>(fp_.n_embd));
  w.set_string(std::string(kPrefix) + "model.weights_hash", hex64(fp_.weights_hash));
  w.set_u32(std::string(kPrefix) + "n_layer", static_cast<uint32_t>(L));
  w.set_u32(std::string(kPrefix) + "n_head_kv", static_cast<uint32_t>(H));
  std::vector<std::string> mnames;
  for (BasisMethod m : methods()) mnames.push_back(basis_method_name(m));
  w.set_array_string(std::string(kPrefix) + "methods", mnames);
  w.set_bool(std::string(kPrefix) + "has_stats", has_stats());
  w.set_u32(std::string(kPrefix) + "layer_io_rows",
            has_layer_io() ? static_cast<uint32_t>(layer_io_[0].n_rows) : 0u);
  if (has_stats()) {
    w.set_u64(std::string(kPrefix) + "stats.n_tokens", static_cast<uint64_t>(stats_[0].n_tokens));
    w.set_u32(std::string(kPrefix) + "stats.n_group", static_cast<uint32_t>(stats_[0].n_group));
  }
  for (const auto& [k, v] : meta) w.set_string(kMetaPrefix + k, v);

  // Tensors are gathered first, so the checksum (a key, written before the data) covers them.
  using T = CalibTensor;
  std::vector<T> ts;
  auto per_head = [&](const std::string& name, int d, bool square, auto get) {
    T t{name, square ? std::vector<int64_t>{d, d, H} : std::vector<int64_t>{d, H}, {}};
    const size_t n = square ? static_cast<size_t>(d) * d : static_cast<size_t>(d);
    t.data.reserve(n * H);
    for (int ih = 0; ih < H; ++ih) {
      const auto& src = get(ih);
      KVTRIM_CHECK(src.size() == n, "calibration save: %s head %d has %zu values, expected %zu",
                   name.c_str(), ih, src.size(), n);
      for (auto x : src) t.data.push_back(static_cast<float>(x));
    }
    ts.push_back(std::move(t));
  };
  for (int il = 0; il < L; ++il) {
    for (const auto& [m, fits] : fits_) {
      const std::string mn = basis_method_name(m);
      auto at = [&, &fits = fits](int ih) -> const HeadFit& {
        return fits[static_cast<size_t>(il) * H + ih];
      };
      const bool oblique = !at(0).k.orthonormal() || !at(0).v.orthonormal();
      per_head(tname(il, mn + ".k_enc"), dk, true,
               [&](int ih) -> const std::vector<float>& { return at(ih).k.enc; });
      per_head(tname(il, mn + ".v_enc"), dv, true,
               [&](int ih) -> const std::vector<float>& { return at(ih).v.enc; });
      if (oblique) {
        per_head(tname(il, mn + ".k_dec"), dk, true, [&](int ih) -> const std::vector<float>& {
          return at(ih).k.dec.empty() ? at(ih).k.enc : at(ih).k.dec;
        });
        per_head(tname(il, mn + ".v_dec"), dv, true, [&](int ih) -> const std::vector<float>& {
          return at(ih).v.dec.empty() ? at(ih).v.enc : at(ih).v.dec;
        });
      }
      per_head(tname(il, mn + ".k_energy"), dk, false,
               [&](int ih) -> const std::vector<double>& { return at(ih).k.energy; });
      per_head(tname(il, mn + ".v_energy"), dv, false,
               [&](int ih) -> const std::vector<double>& { return at(ih).v.energy; });
    }
    if (has_stats()) {
      auto st = [&](int ih) -> const HeadStats& {
        return stats_[static_cast<size_t>(il) * H + ih];
      };
      per_head(tname(il, "stats.gram_k"), dk, true,
               [&](int ih) -> const std::vector<double>& { return st(ih).gram_k; });
      per_head(tname(il, "stats.gram_q"), dk, true,
               [&](int ih) -> const std::vector<double>& { return st(ih).gram_q; });
      per_head(tname(il, "stats.gram_v"), dv, true,
               [&](int ih) -> const std::vector<double>& { return st(ih).gram_v; });
      per_head(tname(il, "stats.gram_k_pre"), dk, true,
               [&](int ih) -> const std::vector<double>& { return st(ih).gram_k_pre; });
      per_head(tname(il, "stats.gram_q_pre"), dk, true,
               [&](int ih) -> const std::vector<double>& { return st(ih).gram_q_pre; });
      per_head(tname(il, "stats.gram_vo"), dv, true,
               [&](int ih) -> const std::vector<double>& { return st(ih).gram_vo; });
      per_head(tname(il, "stats.sum_k"), dk, false,
               [&](int ih) -> const std::vector<double>& { return st(ih).sum_k; });
      per_head(tname(il, "stats.sum_v"), dv, false,
               [&](int ih) -> const std::vector<double>& { return st(ih).sum_v; });
      per_head(tname(il, "stats.sum_k_pre"), dk, false,
               [&](int ih) -> const std::vector<double>& { return st(ih).sum_k_pre; });
    }
    if (has_layer_io() && layer_io_[il].n_rows > 0) {
      const LayerIoSample& s = layer_io_[il];
      KVTRIM_CHECK(s.n_embd == fp_.n_embd &&
                       s.x_in.size() == static_cast<size_t>(s.n_rows) * s.n_embd &&
                       s.x_out.size() == s.x_in.size(),
                   "calibration save: layer %d io sample is mis-shaped", il);
      ts.push_back({tname(il, "io.x_in"), {s.n_embd, s.n_rows}, s.x_in});
      ts.push_back({tname(il, "io.x_out"), {s.n_embd, s.n_rows}, s.x_out});
    }
  }
  if (stief_) stief_write(*stief_, w, &ts);
  if (lexico_) lexico_write(*lexico_, w, &ts);
  Hasher h;
  for (const T& t : ts) h.bytes(t.data.data(), t.data.size() * sizeof(float));
  w.set_string(std::string(kPrefix) + "checksum", hex64(h.finish()));
  for (const T& t : ts)
    w.add_tensor(t.name, GgmlType::F32, t.ne, t.data.data(), t.data.size() * sizeof(float));

  w.write_atomic(path, "calibration file");
}

Calibration Calibration::load(const std::string& path, const Model* model) {
  std::error_code ec;
  KVTRIM_CHECK(std::filesystem::is_regular_file(path, ec),
               "calibration file '%s' does not exist (run `kvtrim calibrate`)", path.c_str());
  std::unique_ptr<GgufFile> fp;
  try {
    fp = GgufFile::open(path);
  } catch (const Error& e) {
    fail("calibration file '%s' is not a readable GGUF file (truncated or damaged?): %s",
         path.c_str(), e.what());
  }
  return from_gguf(*fp, model);
}

Calibration Calibration::from_gguf(const GgufFile& f, const Model* model, bool verify_checksum) {
  const std::string& path = f.path();
  const std::string arch = f.get_string("general.architecture", "");
  KVTRIM_CHECK(arch == kArch,
               "'%s' is not a kvtrim calibration file (general.architecture = '%s', expected '%s')",
               path.c_str(), arch.c_str(), kArch);
  const std::string P = kPrefix;
  try {
    const int64_t version = f.get_int(P + "version", -1);
    KVTRIM_CHECK(version >= kOldestFormatVersion && version <= kFormatVersion,
                 "calibration file '%s' has format version %lld; this kvtrim reads versions %d "
                 "to %d (re-run `kvtrim calibrate`)",
                 path.c_str(), static_cast<long long>(version), kOldestFormatVersion,
                 kFormatVersion);
    ModelFingerprint mf;
    mf.arch = f.get_string(P + "model.arch");
    mf.name = f.get_string(P + "model.name");
    mf.n_layer = static_cast<int>(f.get_int(P + "model.n_layer"));
    mf.n_head = static_cast<int>(f.get_int(P + "model.n_head"));
    mf.n_head_kv = static_cast<int>(f.get_int(P + "model.n_head_kv"));
    mf.head_dim_k = static_cast<int>(f.get_int(P + "model.head_dim_k"));
    mf.head_dim_v = static_cast<int>(f.get_int(P + "model.head_dim_v"));
    mf.n_embd = static_cast<int>(f.get_int(P + "model.n_embd"));
    const std::string wh = f.get_string(P + "model.weights_hash");
    mf.weights_hash = std::strtoull(wh.c_str(), nullptr, 16);
    if (model) Calibration(mf, 0, 0).check_model(*model, path);
    Hasher h;
    for (const GgufTensor& t : f.tensors()) h.bytes(t.data, t.n_bytes);
    KVTRIM_CHECK(!verify_checksum || hex64(h.finish()) == f.get_string(P + "checksum"),
                 "calibration file '%s' is damaged: its tensor data does not match the stored "
                 "checksum (re-run `kvtrim calibrate`)",
                 path.c_str());

    const int L = static_cast<int>(f.get_int(P + "n_layer")),
              H = static_cast<int>(f.get_int(P + "n_head_kv"));
    KVTRIM_CHECK(L == mf.n_layer && H == mf.n_head_kv && L > 0 && H > 0 && mf.head_dim_k > 0 &&
                     mf.head_dim_v > 0 && mf.head_dim_k <= 4096 && mf.head_dim_v <= 4096,
                 "calibration file '%s' has inconsistent dimensions", path.c_str());
    const int dk = mf.head_dim_k, dv = mf.head_dim_v;
    const size_t kk = static_cast<size_t>(dk) * dk, vv = static_cast<size_t>(dv) * dv;
    Calibration c(mf, L, H);
    c.checksum_ = f.get_string(P + "checksum", "");
    Reader rd{f, path};
    for (const GgufValue& mv : f.get_array(P + "methods").values) {
      const BasisMethod m = parse_basis_method(mv.as_string());
      const std::string mn = basis_method_name(m);
      std::vector<HeadFit> fits(static_cast<size_t>(L) * H);
      for (int il = 0; il < L; ++il) {
        const GgufTensor& ke = rd.get(tname(il, mn + ".k_enc"), {dk, dk, H});
        const GgufTensor& ve = rd.get(tname(il, mn + ".v_enc"), {dv, dv, H});
        const GgufTensor& kn = rd.get(tname(il, mn + ".k_energy"), {dk, H});
        const GgufTensor& vn = rd.get(tname(il, mn + ".v_energy"), {dv, H});
        const bool oblique = f.find_tensor(tname(il, mn + ".k_dec")) != nullptr;
        for (int ih = 0; ih < H; ++ih) {
          HeadFit& hf = fits[static_cast<size_t>(il) * H + ih];
          hf.k.d = dk;
          hf.v.d = dv;
          hf.k.enc = rd.slice_f(ke, ih, kk);
          hf.v.enc = rd.slice_f(ve, ih, vv);
          hf.k.energy = rd.slice_d(kn, ih, dk);
          hf.v.energy = rd.slice_d(vn, ih, dv);
          if (oblique) {
            hf.k.dec = rd.slice_f(rd.get(tname(il, mn + ".k_dec"), {dk, dk, H}), ih, kk);
            hf.v.dec = rd.slice_f(rd.get(tname(il, mn + ".v_dec"), {dv, dv, H}), ih, vv);
          }
        }
      }
      c.set_fits(m, std::move(fits));
    }
    if (f.get_bool(P + "has_stats", false)) {
      const int64_t n_tokens = f.get_int(P + "stats.n_tokens");
      const int n_group = static_cast<int>(f.get_int(P + "stats.n_group"));
      std::vector<HeadStats> stats(static_cast<size_t>(L) * H);
      for (int il = 0; il < L; ++il) {
        struct Field {
          const char* name;
          int d;
          bool square;
          std::vector<double> HeadStats::*member;
        };
        const Field fields[] = {
            {"gram_k", dk, true, &HeadStats::gram_k},
            {"gram_q", dk, true, &HeadStats::gram_q},
            {"gram_v", dv, true, &HeadStats::gram_v},
            {"gram_k_pre", dk, true, &HeadStats::gram_k_pre},
            {"gram_q_pre", dk, true, &HeadStats::gram_q_pre},
            {"gram_vo", dv, true, &HeadStats::gram_vo},
            {"sum_k", dk, false, &HeadStats::sum_k},
            {"sum_v", dv, false, &HeadStats::sum_v},
            {"sum_k_pre", dk, false, &HeadStats::sum_k_pre},
        };
        for (const Field& fd : fields) {
          const GgufTensor& t = rd.get(
              tname(il, std::string("stats.") + fd.name),
              fd.square ? std::vector<int64_t>{fd.d, fd.d, H} : std::vector<int64_t>{fd.d, H});
          const size_t n = fd.square ? static_cast<size_t>(fd.d) * fd.d : static_cast<size_t>(fd.d);
          for (int ih = 0; ih < H; ++ih)
            stats[static_cast<size_t>(il) * H + ih].*fd.member = rd.slice_d(t, ih, n);
        }
        for (int ih = 0; ih < H; ++ih) {
          stats[static_cast<size_t>(il) * H + ih].n_tokens = n_tokens;
          stats[static_cast<size_t>(il) * H + ih].n_group = n_group;
        }
      }
      c.set_stats(std::move(stats));
    }
    const int rows = static_cast<int>(f.get_int(P + "layer_io_rows", 0));
    if (rows > 0) {
      std::vector<LayerIoSample> io(L);
      for (int il = 0; il < L; ++il) {
        const GgufTensor* probe = f.find_tensor(tname(il, "io.x_in"));
        KVTRIM_CHECK(probe && probe->ne.size() == 2 && probe->ne[1] >= 1 && probe->ne[1] <= rows,
                     "calibration file '%s' is incomplete: missing or mis-shaped tensor '%s'",
                     path.c_str(), tname(il, "io.x_in").c_str());
        const int n = static_cast<int>(probe->ne[1]);
        const GgufTensor& xi = rd.get(tname(il, "io.x_in"), {mf.n_embd, n});
        const GgufTensor& xo = rd.get(tname(il, "io.x_out"), {mf.n_embd, n});
        io[il].n_rows = n;
        io[il].n_embd = mf.n_embd;
        io[il].x_in = rd.slice_f(xi, 0, static_cast<size_t>(n) * mf.n_embd);
        io[il].x_out = rd.slice_f(xo, 0, static_cast<size_t>(n) * mf.n_embd);
      }
      c.set_layer_io(std::move(io));
    }
    if (version >= 2 && stief_present(f))
      c.set_stief(std::make_shared<StiefFits>(
          stief_read(f, path, L, H, mf.head_dim_k, mf.head_dim_v)));
    if (version >= 3 && lexico_present(f))
      c.set_lexico(std::make_shared<LexicoDicts>(lexico_read(f, path, L, mf.head_dim_k, mf.head_dim_v)));
    const std::string mp = kMetaPrefix;
    for (const auto& [k, v] : f.metadata())
      if (k.starts_with(mp) && v.type == GgufValueType::STRING)
        c.meta[k.substr(mp.size())] = v.as_string();
    return c;
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find(path) != std::string::npos) throw;
    fail("calibration file '%s': %s", path.c_str(), msg.c_str());
  }
}

}  // namespace kvtrim
