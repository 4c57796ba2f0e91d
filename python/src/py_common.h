// The Python module `kvtrim._kvtrim` (nanobind): what its parts share. The Python package
// (python/kvtrim/) wraps it; docs/python.md is the user's guide.
//   module.cpp      the module, error translation, the in-process command line (kvtrim.eval)
//   py_model.cpp    Model: tokenizer, chat template, generate (engine/document_qa.h)
//   py_session.cpp  Session: prefill / decode / compress, the cache as numpy arrays
//   py_press.cpp    the press registry, press objects -> C++ presses, ScorerPress in Python
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "model/model.h"
#include "press/press.h"

namespace kvtrim::py {

namespace nb = nanobind;

// A loaded model and the defaults its sessions take.
struct PyModel {
  std::unique_ptr<Model> model;
  std::string path;
  int threads = 0;         // 0 = all hardware threads
  int64_t n_ctx = 0;       // 0 = the model's training context
  std::string kv_type = "f16";
};

// A C++ press from a Python press: None or "none" / "" -> nullptr; a press string; or an object
// with `_parts()` (kvtrim.presses.Press) returning a list of press strings and ScorerPress
// instances (a custom press written in Python), composed in order. Throws ValueError naming
// the problem.
std::unique_ptr<Press> press_from_object(nb::handle obj);

// Ctrl-C while the engine runs (with the GIL released): poll() takes the GIL and runs Python's
// signal handlers (PyErr_CheckSignals); when one raised (KeyboardInterrupt), the exception is
// kept and poll() returns true from then on: the caller stops its loop cleanly and, holding the
// GIL again, calls rethrow().
class InterruptCheck {
 public:
  bool poll();
  bool interrupted() const { return err_ != nullptr; }
  void rethrow_if_interrupted();  // with the GIL held

 private:
  std::unique_ptr<nb::python_error> err_;
};

void register_model(nb::module_& m);
void register_session(nb::module_& m);
void register_presses(nb::module_& m);

}  // namespace kvtrim::py
