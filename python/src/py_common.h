// The Python module `kvtrim._kvtrim` (nanobind): what its parts share. The Python package
// (python/kvtrim/) wraps it; docs/python.md is the user's guide.
//   module.cpp      the module, error translation, the in-process command line (kvtrim.eval)
//   py_model.cpp    Model: tokenizer, chat template, generate (engine/document_qa.h)
//   py_session.cpp  Session: prefill / decode / compress, the cache as numpy arrays
//   py_press.cpp    the press registry, press objects -> C++ presses, ScorerPress in Python
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/press_runner.h"
#include "engine/session.h"
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

// Python while the engine runs with the GIL released: Ctrl-C, and callbacks (on_token). poll()
// takes the GIL and runs Python's signal handlers (PyErr_CheckSignals); call() runs a callback
// with the GIL. An exception either raises (KeyboardInterrupt, the callback's own) is kept, and
// from then on poll() and call() return false / true = stop: the caller ends its loop cleanly
// and, holding the GIL again, calls rethrow().
class PyInterrupts {
 public:
  bool poll();  // true: stop
  // fn(args...) with the GIL: false (stop) when it returns a false value other than None or
  // raises; true when fn is None.
  template <class... A>
  bool call(const nb::object& fn, A&&... args) {
    if (err_) return false;
    if (fn.is_none()) return true;
    nb::gil_scoped_acquire gil;
    try {
      nb::object keep = fn(std::forward<A>(args)...);
      return keep.is_none() || nb::cast<bool>(keep);
    } catch (nb::python_error& e) {
      err_ = std::make_unique<nb::python_error>(std::move(e));
      return false;
    }
  }
  bool stopped() const { return err_ != nullptr; }
  void rethrow();  // with the GIL held: the kept exception, if any

 private:
  std::unique_ptr<nb::python_error> err_;
};

// numpy arrays owning their data (moved into a capsule).
template <class T>
nb::ndarray<nb::numpy, T> owned_array(std::vector<T> v, const std::vector<size_t>& shape) {
  auto* p = new std::vector<T>(std::move(v));
  nb::capsule owner(p, [](void* x) noexcept { delete static_cast<std::vector<T>*>(x); });
  return nb::ndarray<nb::numpy, T>(p->data(), shape.size(), shape.data(), owner);
}

// A compression's stats (tokens / bytes before and after, seconds, the loss estimate when
// measured) and a cache's bytes by part (KvBytes, its total, dense_f16, per_layer) as dicts.
nb::dict compress_stats_dict(const CompressStats& st);
nb::dict kv_bytes_dict(const KvCache& c);
// A session's parameters: the model's defaults unless given.
SessionParams session_params_for(const PyModel& m, std::optional<int64_t> n_ctx, std::optional<int> threads,
                                 std::optional<std::string> kv_type);

void register_model(nb::module_& m);
void register_session(nb::module_& m);
void register_presses(nb::module_& m);

}  // namespace kvtrim::py
