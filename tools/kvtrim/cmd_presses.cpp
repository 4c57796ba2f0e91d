// kvtrim presses: lists every registered press with its description, paper and options
// (name, default, help), and the press-string syntax.
#include <cstdio>

#include "cli.h"
#include "press/press.h"

namespace kvtrim::cli {

void register_presses(CLI::App& app) {
  CLI::App* c = app.add_subcommand("presses", "list the KV-cache compression presses and their options");
  c->callback([] { std::fputs(describe_presses().c_str(), stdout); });
}

}  // namespace kvtrim::cli
