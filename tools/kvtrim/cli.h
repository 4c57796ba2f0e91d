// The kvtrim command-line tool: one subcommand per verb, each in its own file, all sharing
// the options declared once in CommonOptions.
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "engine/context_question.h"
#include "engine/press_runner.h"
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
  std::string cache_type_k, cache_type_v;  // -ctk / -ctv ("": kv_type)
  bool no_kv_rotate = false;                // --no-kv-rotate: quantized rows unrotated
  std::string mem_limit;                    // --mem-limit: "" = available memory, "off", or a size
  bool int8_prefill = false;                // --int8-prefill: the default, accepted for scripts
  bool f32_prefill = false;                 // --f32-prefill: set_int8_prefill(false) (ops/matmul.h)
  bool no_repack = false;                   // --no-repack: set_weight_packing(false) (ops/weight_pack.h)
  std::string chat_template;                // --chat-template NAME|FILE ("": the file's own)
};

void add_common_options(CLI::App* app, CommonOptions& o);
// The cache types as recorded in results files: "f16", or "k=q8,v=q4" when they differ, with
// "+hadamard" when the cache rotates a side's rows (the default, for the types and head widths
// kv_rotation_applies accepts: the same rule as the cache's).
std::string kv_tag(const CommonOptions& o, const HParams& hp);
// The prefill precision as recorded in results files: "int8" (the default) or "" (--f32-prefill:
// f32 activations times the dequantized weights).
std::string prefill_tag(const CommonOptions& o);

// KV-cache compression options (run, chat, ppl, eval).
struct PressOptions {
  std::string spec;           // --press: "" (or "none" on the command line) = no compression
  int decode_every = 0;       // --press-every: while decoding, compress every N steps ...
  int64_t decode_target = 0;  // --press-target: ... down to this many tokens per (layer, kv head)
  // --press-min-tokens (run, chat): a context shorter than this is not compressed
  // (ContextCompressOptions::min_tokens, src/engine/context_question.h)
  int64_t min_tokens = 32;
  // --press-max-loss (run, chat, serve's default): the quality guard's limit on the loss
  // estimate, in [0, 1]; 1 = off (ContextCompressOptions::max_loss)
  double max_loss = 1;
  // --no-loss-estimate: no loss estimate (SessionParams::press_loss), so no guard either
  bool no_loss_estimate = false;
};
void add_press_options(CLI::App* app, PressOptions& o);
// --press-min-tokens (run, chat: the commands that keep a question apart from its context).
void add_press_min_tokens_option(CLI::App* app, PressOptions& o);
// --press-max-loss and --no-loss-estimate (run, chat, serve: the commands that compress a
// context before its question).
void add_press_guard_options(CLI::App* app, PressOptions& o);
// The estimate is not turned off (--no-loss-estimate); throws Error for --press-max-loss below 1
// with --no-loss-estimate.
bool loss_estimate_on(const PressOptions& o);
// SessionParams::press_loss for these options: a press is set and loss_estimate_on.
bool press_loss_on(const PressOptions& o);
// "loss estimate 0.0312 (attention output error over the question's last 14 queries, mean of
// the layers; max 0.1204 at layer 2), evicted attention mass 0.187" (or "the context's last 32
// queries" when measured on the window; "" when not measured).
std::string loss_text(const PressLoss& l);
// Parses --press and installs it on the session (no-op when empty); prints the press to stderr.
// after_prefill = false: generate() does not compress after its prompt (the caller compresses the
// context with compress_context before the question).
void install_press(Session& s, const PressOptions& o, bool after_prefill = true);
// "press snapkv:ratio=0.5: 2790 -> 1395 tokens (all layers and kv heads, 50.0% removed), KV 645 KiB -> 323 KiB in
// 0.012 s; ..."; `part` (e.g. "context 93 positions: ") goes after the press's name.
std::string compress_line(const Press& p, const CompressStats& st, const std::string& part = "");
// The compression of a context before its question (compress_context): the context's tokens
// before / after (or why nothing ran) and the protected tail, e.g. "press snapkv:ratio=0.5:
// context 93 positions: 2790 -> 1395 tokens (...); protected: 14 tokens (the question ...), all kept".
std::string context_compress_line(const Press& p, const ContextCompression& c, int64_t n_protected,
                                  const std::string& protected_what);
// Resolves and loads the model; prints a one-line summary to stderr.
std::unique_ptr<Model> load_model(const CommonOptions& o);
SessionParams session_params(const CommonOptions& o);
// "12.3 MiB"
std::string human_bytes(size_t n);
// "512MiB", "2G", "1.5GiB", "1000000" (bytes) -> bytes; throws Error for anything else.
size_t parse_byte_size(const std::string& s);
// One line: KV bytes held vs the uncompressed f16 size of the same positions.
std::string kv_bytes_line(const KvCache& c);
// Reads a whole file; throws Error naming the path if it cannot be read.
std::string read_file(const std::string& path);

// Every subcommand on `app` (app.cpp), and the parse of a command line (arguments in order,
// without the program name) with llama.cpp's -ctk / -ctv / -np spellings.
void register_commands(CLI::App& app);
void parse_command_line(CLI::App& app, const std::vector<std::string>& args);

void register_run(CLI::App& app);
void register_chat(CLI::App& app);
void register_ppl(CLI::App& app);
void register_inspect(CLI::App& app);
void register_bench(CLI::App& app);
void register_eval(CLI::App& app);
void register_presses(CLI::App& app);
void register_calibrate(CLI::App& app);
void register_serve(CLI::App& app);

}  // namespace kvtrim::cli
