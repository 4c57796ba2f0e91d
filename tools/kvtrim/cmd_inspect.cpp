// kvtrim inspect: a GGUF file's metadata, tensor types, and whether kvtrim can run it (with the
// hyper-parameters it reads) or exactly why not (exit 1, the loader's error naming the key or tensor).
#include <cstdio>
#include <map>

#include "calib/calibration.h"
#include "cli.h"
#include "core/error.h"
#include "model/gguf.h"
#include "model/model.h"
#include "ops/weight_pack.h"

namespace kvtrim::cli {

namespace {
struct InspectOptions {
  std::string model = "smollm2";
  bool tensors = false;
  int max_elems = 8;
};

// Metadata, tensor types, and with --tensors every tensor.
void print_file(const InspectOptions& o, const std::string& path, const GgufFile& f) {
  std::printf("file: %s\n  GGUF v%u, %zu bytes, alignment %llu, %zu metadata keys, %zu tensors\n", path.c_str(),
              f.version(), f.file_size(), static_cast<unsigned long long>(f.alignment()), f.metadata().size(),
              f.tensors().size());
  std::printf("\nmetadata:\n");
  for (const auto& [k, v] : f.metadata())
    std::printf("  %-44s %s\n", k.c_str(), v.to_string(static_cast<size_t>(o.max_elems)).c_str());
  struct TypeCount {
    bool supported;  // kvtrim has kernels for the type (core/ggml_type.cpp)
    int n_tensors;
    size_t n_bytes;
  };
  std::map<std::string, TypeCount> by_type;
  size_t total = 0;
  for (const auto& t : f.tensors()) {
    const GgmlTypeTraits& tr = ggml_traits(t.type);
    const auto it = by_type.try_emplace(std::string(tr.name), TypeCount{tr.supported, 0, 0}).first;
    it->second.n_tensors++;
    it->second.n_bytes += t.n_bytes;
    total += t.n_bytes;
  }
  std::printf("\ntensor types:\n  %-8s %7s  %10s  %s\n", "type", "tensors", "bytes", "kvtrim");
  for (const auto& [name, e] : by_type)
    std::printf("  %-8s %7d  %10s  %s\n", name.c_str(), e.n_tensors, human_bytes(e.n_bytes).c_str(),
                e.supported ? "supported" : "NOT SUPPORTED");
  std::printf("  %-8s %7zu  %10s\n", "total", f.tensors().size(), human_bytes(total).c_str());
  if (!o.tensors) return;
  std::printf("\ntensors:\n");
  for (const auto& t : f.tensors()) {
    std::string shape;
    for (size_t i = 0; i < t.ne.size(); ++i) shape += (i ? " x " : "") + std::to_string(t.ne[i]);
    std::printf("  %-36s %-5s [%s] %zu bytes @ %llu\n", t.name.c_str(), std::string(ggml_type_name(t.type)).c_str(),
                shape.c_str(), t.n_bytes, static_cast<unsigned long long>(t.offset));
  }
}

void inspect(const InspectOptions& o) {
  const std::string path = resolve_model_path(o.model);
  auto f = GgufFile::open(path);
  print_file(o, path, *f);
  if (f->get_string("general.architecture", "") == "kvtrim-calibration") {
    // Not a model: a file `kvtrim calibrate` wrote for the presses that need one, checked as they
    // load it (Calibration::from_gguf: format version, every section, the checksum).
    const Calibration cal = Calibration::from_gguf(*f);
    const ModelFingerprint& fp = cal.fingerprint();
    std::printf("\nkvtrim calibration file for %s (%s, %d layers): the presses that need one read it with "
                "--calib (docs/calibration.md)\n",
                fp.name.c_str(), fp.arch.c_str(), fp.n_layer);
    return;
  }
  // Whether kvtrim can run it: the loader's every check (architecture, keys, tensors, shapes,
  // types, tokenizer) on the same opened file, without packing the weights.
  set_weight_packing(false);
  std::unique_ptr<Model> m;
  try {
    m = Model::load(std::move(f));
  } catch (const Error& e) {
    std::printf("\nkvtrim can run this file: no\n");
    fail("%s", e.what());
  }
  const HParams& hp = m->hparams();
  int n_swa = 0;
  for (int w : hp.sliding_window) n_swa += w > 0;
  const std::string ffn = hp.n_expert > 0 ? strprintf("%d experts of %d, %d per token", hp.n_expert, hp.n_ff_exp, hp.n_expert_used)
                                          : strprintf("n_ff %d", hp.n_ff);
  std::printf("\nkvtrim can run this file: yes\n  %s: %d layers (%d with a sliding window), %d heads / %d kv heads, "
              "head_dim %d/%d, n_embd %d, %s, vocab %d, context %d\n  %s\n",
              arch_name(hp.arch), hp.n_layer, n_swa, hp.n_head, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, hp.n_embd,
              ffn.c_str(), hp.n_vocab, hp.n_ctx_train, rope_description(hp).c_str());
  // The chat template: rendered once on a two-turn conversation, so that a template kvtrim cannot
  // run is reported here rather than at the first chat request.
  const ChatTemplate& ct = m->chat_template();
  try {
    (void)ct.render({{"system", "s"}, {"user", "u"}}, true);
    std::printf("  chat template: %s (renders)\n", ct.description().c_str());
  } catch (const Error& e) {
    // a template may refuse a system message (Gemma 2's raise_exception): try without it
    try {
      (void)ct.render({{"user", "u"}}, true);
      std::printf("  chat template: %s (renders; refuses a system message: %s)\n", ct.description().c_str(), e.what());
    } catch (const Error& e2) {
      std::printf("  chat template: %s — cannot render: %s (give one with --chat-template)\n", ct.description().c_str(),
                  e2.what());
    }
  }
}
}  // namespace

void register_inspect(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* c = app.add_subcommand("inspect", "show a GGUF file's metadata and tensors, and whether kvtrim can run it");
  c->add_option("-m,--model", o->model, "installed model name or .gguf path")->capture_default_str();
  c->add_option("file", o->model, "GGUF file (same as -m)");
  c->add_flag("--tensors", o->tensors, "list every tensor");
  c->add_option("--max-elems", o->max_elems, "array elements shown per metadata value")->capture_default_str();
  c->callback([o] { inspect(*o); });
}

}  // namespace kvtrim::cli
