// The kvtrim command-line tool: one subcommand per verb, each in its own file, all sharing
// the options declared once in CommonOptions.
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "engine/session.h"
#include "model/model.h"

namespace kvtrim::cli {

// Options every model-running verb takes (declared once: name, default, help).
struct CommonOptions {
  std::string model = "smollm2";
  int threads = 0;
  int64_t ctx = 0;
  int batch = 256;
  std::string kv_type = "f16";
};

void add_common_options(CLI::App* app, CommonOptions& o);
// Resolves and loads the model; prints a one-line summary to stderr.
std::unique_ptr<Model> load_model(const CommonOptions& o);
SessionParams session_params(const CommonOptions& o);
// "12.3 MiB"
std::string human_bytes(size_t n);
// One line: KV bytes held vs the uncompressed f16 size of the same positions.
std::string kv_bytes_line(const KvCache& c);
// Reads a whole file; throws Error naming the path if it cannot be read.
std::string read_file(const std::string& path);

void register_run(CLI::App& app);
void register_chat(CLI::App& app);
void register_ppl(CLI::App& app);
void register_inspect(CLI::App& app);
void register_bench(CLI::App& app);

}  // namespace kvtrim::cli
