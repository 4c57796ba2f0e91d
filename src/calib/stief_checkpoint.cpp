// StiefAttention's calibration checkpoint (see stief_checkpoint.h): a GGUF file holding the
// identity string, the number of finished layers, their fits (the calibration file's section)
// and the next layer's inputs.
#include "calib/stief_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <memory>

#include "calib/calibration.h"
#include "calib/hash.h"
#include "calib/stief_train.h"
#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace kvtrim {

namespace {
constexpr const char* kCk = "kvtrim.stief_checkpoint.";
}  // namespace

// Everything the result depends on: the model, the configuration, the sequences (lengths and
// token ids) and the calibration's EigenAttention fits and statistics (warm start, walk).
std::string ck_identity(const Model& model, const Calibration& cal, const StiefTrainConfig& cfg,
                        const std::vector<std::vector<int32_t>>& seqs) {
  const ModelFingerprint fp = model_fingerprint(model);
  Hasher tok, fit;
  for (const auto& s : seqs) {
    const uint64_t n = s.size();
    tok.bytes(&n, sizeof n);
    tok.bytes(s.data(), s.size() * sizeof(int32_t));
  }
  for (int il = 0; il < cal.n_layer(); ++il)
    for (int h = 0; h < cal.n_head_kv(); ++h) {
      const HeadFit& f = cal.fit(BasisMethod::kEigenAttention, il, h);
      fit.bytes(f.k.enc.data(), f.k.enc.size() * sizeof(float));
      fit.bytes(f.v.enc.data(), f.v.enc.size() * sizeof(float));
      fit.bytes(f.k.energy.data(), f.k.energy.size() * sizeof(double));
      fit.bytes(f.v.energy.data(), f.v.energy.size() * sizeof(double));
      const HeadStats& st = cal.stats(il, h);
      fit.bytes(st.gram_k.data(), st.gram_k.size() * sizeof(double));
      fit.bytes(st.gram_q.data(), st.gram_q.size() * sizeof(double));
    }
  return fp.describe() +
         strprintf(" weights=%016llx seqs=%zu tokens=%016llx calib=%016llx ",
                   static_cast<unsigned long long>(fp.weights_hash), seqs.size(),
                   static_cast<unsigned long long>(tok.finish()), static_cast<unsigned long long>(fit.finish())) +
         cfg.describe();
}

void save_checkpoint(const std::string& path, const std::string& identity, const StiefFits& f,
                     const std::vector<std::vector<float>>& X, int64_t n_embd) {
  GgufWriter w;
  w.set_string("general.architecture", "kvtrim-stief-checkpoint");
  w.set_string(std::string(kCk) + "identity", identity);
  w.set_u32(std::string(kCk) + "layers_done", static_cast<uint32_t>(f.n_layer()));
  std::vector<CalibTensor> ts;
  if (f.n_layer() > 0) stief_write(f, w, &ts);
  for (size_t i = 0; i < X.size(); ++i)
    ts.push_back({"x." + std::to_string(i), {n_embd, static_cast<int64_t>(X[i].size()) / n_embd}, X[i]});
  for (const CalibTensor& t : ts)
    w.add_tensor(t.name, GgmlType::F32, t.ne, t.data.data(), t.data.size() * sizeof(float));
  w.write_atomic(path, "StiefAttention checkpoint");
}

// Loads a matching checkpoint into *f and *X; false when there is none or it does not match
// (a mismatch is reported and the run starts over).
bool load_checkpoint(const std::string& path, const std::string& identity, int n_layer,
                     int n_head_kv, int dk, int dv, int64_t n_embd,
                     const std::vector<std::vector<int32_t>>& seqs, StiefFits* f,
                     std::vector<std::vector<float>>* X) {
  const size_t n_seqs = seqs.size();
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return false;
  try {
    const std::unique_ptr<GgufFile> g = GgufFile::open(path);
    if (g->get_string(std::string(kCk) + "identity", "") != identity) {
      std::fprintf(stderr, "stief: checkpoint %s is for another model or configuration; starting over\n",
                   path.c_str());
      return false;
    }
    const int done = static_cast<int>(g->get_int(std::string(kCk) + "layers_done"));
    KVTRIM_CHECK(done >= 0 && done <= n_layer, "layers_done = %d out of range", done);
    StiefFits got;
    if (done > 0) {
      got = stief_read(*g, path, done, n_head_kv, dk, dv);
    }
    std::vector<std::vector<float>> xs(n_seqs);
    for (size_t i = 0; i < n_seqs; ++i) {
      const GgufTensor& t = g->tensor("x." + std::to_string(i));
      KVTRIM_CHECK(t.type == GgmlType::F32 && t.ne.size() == 2 && t.ne[0] == n_embd &&
                       t.ne[1] == static_cast<int64_t>(seqs[i].size()),
                   "tensor x.%zu is mis-shaped", i);
      const float* p = reinterpret_cast<const float*>(t.data);
      xs[i].assign(p, p + t.ne[0] * t.ne[1]);
    }
    *f = std::move(got);
    *X = std::move(xs);
    return true;
  } catch (const Error& e) {
    std::fprintf(stderr, "stief: checkpoint %s is unreadable (%s); starting over\n", path.c_str(),
                 e.what());
    return false;
  }
}

}  // namespace kvtrim
