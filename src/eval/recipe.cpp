#include "eval/recipe.h"

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "eval/rng.h"

namespace kvtrim::eval {

namespace fs = std::filesystem;

std::string file_identity(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  return fs::path(path).filename().string() + ":" + std::to_string(ec ? 0 : size);
}

std::string shared_data_path(const std::string& rel, const char* option) {
  std::vector<std::string> tried;
  if (const char* d = std::getenv("KVTRIM_SHARED_DATA")) {
    tried.push_back((fs::path(d) / rel).string());
    if (fs::exists(tried.back())) return tried.back();
  }
  std::vector<fs::path> bases = {fs::current_path()};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) bases.push_back(exe.parent_path());
  for (fs::path b : bases) {
    for (int up = 0; up < 6 && !b.empty(); ++up, b = b.parent_path()) {
      const fs::path p = b / "shared" / "data" / rel;
      tried.push_back(p.string());
      if (fs::exists(p)) return p.lexically_normal().string();
      if (b == b.parent_path()) break;
    }
  }
  throw Error(strprintf("no %s found (give %s or set KVTRIM_SHARED_DATA); looked in %s%s", rel.c_str(), option,
                        tried.empty() ? "" : tried.front().c_str(),
                        tried.size() > 1 ? " and the parents of the working and executable directories" : ""));
}

std::string ruler_data_source(const std::string& file_text) {
  return strprintf("data=%016llx", static_cast<unsigned long long>(fnv1a64(file_text)));
}

std::string gsm8k_source(const std::string& data_file, int shots, int max_new_tokens) {
  // the shots and the items are in each sample's content hash; this names the set
  return strprintf("gsm8k=%s,shots=%d,max_new=%d", file_identity(data_file).c_str(), shots, max_new_tokens);
}

std::string mc_source(const std::string& bench, const std::string& data, size_t n_items, int shots) {
  if (bench == "hellaswag") return "data=" + file_identity(data);
  if (bench == "piqa")
    return "data=" + file_identity((fs::path(data) / "valid.jsonl").string()) + "," +
           file_identity((fs::path(data) / "valid-labels.lst").string());
  // order=rr: items in round robin over the subjects (load_mmlu); a results file of the earlier
  // subject-by-subject order gets another config and is not resumed with the new items
  return strprintf("data=%s:%zu,shots=%d,order=rr", data.c_str(), n_items, shots);
}

namespace {

std::string model_part(const RunIdentity& id) { return "model=" + file_identity(id.model_file); }
// (the prefill precision joins the kv part only when it is not f32, the default of every run before
// 8-bit prefill became the CLI's default, so the hashes of those runs stay as they were)
std::string kv_part(const RunIdentity& id) { return "kv=" + id.kv + (id.prefill.empty() ? "" : ";prefill=" + id.prefill); }
std::string batch_part(const RunIdentity& id) { return "batch=" + std::to_string(id.batch); }
std::string format_part(PromptFormat f) { return "format=" + std::string(prompt_format_name(f)); }

// ppl's parts after the model: the text, the storage and the window recipe (press and
// protocol added by the caller).
std::vector<std::string> ppl_window_parts(const RunIdentity& id, const std::string& data_file, const PplConfig& c,
                                          const std::string* press_desc) {
  std::vector<std::string> p = {model_part(id), "data=" + file_identity(data_file), kv_part(id), batch_part(id)};
  if (press_desc) append_press_parts(&p, *press_desc, id.calib);
  p.push_back(std::string("mode=") + ppl_mode_name(c.mode));
  p.push_back("ctx=" + std::to_string(c.ctx));
  p.push_back("prefix=" + std::to_string(c.first_row()));
  p.push_back("chunk=" + std::to_string(c.mode == PplMode::kThroughout ? c.chunk : 0));
  return p;
}

}  // namespace

std::string generation_config(const RunIdentity& id, PromptFormat format, const std::string& press_desc,
                              const std::string& source) {
  std::vector<std::string> p = {model_part(id), format_part(format), kv_part(id), batch_part(id)};
  append_press_parts(&p, press_desc, id.calib);
  p.insert(p.end(), {"protocol=kvpress-v1", source});
  return config_hash(p);
}

std::string mc_config(const RunIdentity& id, const std::string& bench, const std::string& press_desc,
                      const std::string& source) {
  std::vector<std::string> p = {model_part(id), "bench=" + bench, kv_part(id), batch_part(id)};
  append_press_parts(&p, press_desc, id.calib);
  p.insert(p.end(), {"protocol=mc-loglik-v1", source});
  return config_hash(p);
}

std::string ppl_config(const RunIdentity& id, const std::string& data_file, const PplConfig& c,
                       const std::string& press_desc) {
  std::vector<std::string> p = ppl_window_parts(id, data_file, c, &press_desc);
  p.push_back("protocol=ppl-v1");
  return config_hash(p);
}

void set_generation_sweep_configs(std::vector<SweepCell>* cells, const RunIdentity& id, PromptFormat format,
                                  const std::string& source, const std::string& bench, bool query_aware) {
  KVTRIM_ASSERT(bench == "ruler" || bench == "gsm8k");
  set_cell_configs(cells, {model_part(id), kv_part(id), batch_part(id), format_part(format), source},
                   "sweep-" + bench + (query_aware ? "-query-aware-v1" : "-v1"));
}

void set_mc_sweep_configs(std::vector<SweepCell>* cells, const RunIdentity& id, const std::string& bench,
                          const std::string& source) {
  set_cell_configs(cells, {model_part(id), kv_part(id), batch_part(id), "bench=" + bench, source},
                   "sweep-mc-loglik-v1");
}

void set_ppl_sweep_configs(std::vector<SweepCell>* cells, const RunIdentity& id, const std::string& data_file,
                           const PplConfig& c) {
  set_cell_configs(cells, ppl_window_parts(id, data_file, c, nullptr), "sweep-ppl-v1");
}

}  // namespace kvtrim::eval
