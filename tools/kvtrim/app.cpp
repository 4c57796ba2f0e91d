// The command line as a library (kvtrim_cli): every subcommand registered on one CLI::App, and
// the argument spellings CLI11 cannot take itself. main.cpp runs it as the `kvtrim` program; the
// Python module runs it in-process (kvtrim.eval).
#include <cstring>

#include "cli.h"

namespace kvtrim::cli {

void register_commands(CLI::App& app) {
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvtrim 0.1.0");
  register_run(app);
  register_chat(app);
  register_ppl(app);
  register_inspect(app);
  register_bench(app);
  register_presses(app);
  register_eval(app);
  register_calibrate(app);
  register_serve(app);
}

void parse_command_line(CLI::App& app, const std::vector<std::string>& args) {
  // llama.cpp's spellings -ctk / -ctv / -np (CLI11 takes only one-letter short options);
  // CLI11's parse(vector) takes the arguments last first.
  std::vector<std::string> rev;
  for (auto it = args.rbegin(); it != args.rend(); ++it) {
    const std::string& a = *it;
    rev.push_back(a == "-ctk" ? "--cache-type-k" : a == "-ctv" ? "--cache-type-v" : a == "-np" ? "--parallel" : a);
  }
  app.parse(rev);
}

}  // namespace kvtrim::cli
