// kvtrim: run, chat, ppl, inspect, bench, eval, calibrate, serve. Library errors (kvtrim::Error) are printed as
// "kvtrim: error: ..." with exit code 1; command-line mistakes exit with code 2.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli.h"
#include "core/error.h"

namespace {

// Models and calibration files are memory-mapped (model/gguf.h). Truncating or rewriting one in
// place while kvtrim runs turns the next read of a dropped page into SIGBUS; say so instead of
// dying with "Bus error". (Replacing a file by renaming a new copy over it is safe: the mapping
// keeps the old file.) Only async-signal-safe calls here.
void on_sigbus(int) {
  static const char kMsg[] =
      "kvtrim: error: bus error reading a memory-mapped file: a model or calibration file was truncated or "
      "rewritten while kvtrim was using it (replace such files by renaming a new copy over them)\n";
  ssize_t w = ::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
  (void)w;
  ::_exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_handler = on_sigbus;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, nullptr);
  CLI::App app{"kvtrim: long-context LLM inference with a compressible KV cache"};
  kvtrim::cli::register_commands(app);
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    kvtrim::cli::parse_command_line(app, args);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const kvtrim::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvtrim: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvtrim: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kvtrim: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
