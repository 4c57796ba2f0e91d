// kvtrim._kvtrim: the compiled part of the Python package (python/kvtrim/ wraps it).
#include <CLI/CLI.hpp>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdio>

#include "../../tools/kvtrim/cli.h"
#include "core/error.h"
#include "ops/matmul.h"
#include "py_common.h"

namespace kvtrim::py {

bool PyInterrupts::poll() {
  if (err_) return true;
  nb::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) err_ = std::make_unique<nb::python_error>();
  return err_ != nullptr;
}

void PyInterrupts::rethrow() {
  if (err_) throw nb::python_error(*err_);
}

namespace {

// The `kvtrim` command line in this process (kvtrim.eval runs `eval ruler` etc. with it):
// arguments as after the program name. Help and --version print and return; a command-line
// mistake or a kvtrim error raises ValueError with the message the program would print.
void run_cli(const std::vector<std::string>& args) {
  CLI::App app{"kvtrim: long-context LLM inference with a compressible KV cache"};
  cli::register_commands(app);
  std::string error;
  {
    nb::gil_scoped_release nogil;
    try {
      cli::parse_command_line(app, args);
    } catch (const CLI::CallForHelp&) {
      std::fputs(app.help().c_str(), stdout);
    } catch (const CLI::CallForAllHelp&) {
      std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    } catch (const CLI::CallForVersion& e) {
      std::fputs((std::string(e.what()) + "\n").c_str(), stdout);
    } catch (const CLI::ParseError& e) {
      error = e.what();
    }
    std::fflush(stdout);
    std::fflush(stderr);
  }
  if (!error.empty()) throw nb::value_error(error.c_str());
}

}  // namespace

}  // namespace kvtrim::py

NB_MODULE(_kvtrim, m) {
  namespace nb = nanobind;
  using namespace kvtrim::py;
  m.doc() = "kvtrim's engine: models, sessions, presses (see the kvtrim package)";
  // kvtrim's errors name the problem (a bad option, a file that is not a model, a context past
  // its limit): ValueError with that message.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const kvtrim::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  // The command line's defaults: 8-bit-activation prefill (Model(f32_prefill=True) turns it off).
  kvtrim::set_int8_prefill(true);
  register_model(m);
  register_session(m);
  register_presses(m);
  m.def("_cli", &run_cli, nb::arg("args"));
}
