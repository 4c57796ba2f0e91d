// The non-template parts of ResultsFile (results_file.h): writing a line, the changed-input error.
#include "eval/results_file.h"

#include <fstream>

#include "core/error.h"

namespace kvtrim::eval {

void append_results_line(const std::string& path, const std::string& line) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  KVTRIM_CHECK(f.good(), "cannot write results file '%s'", path.c_str());
  f << line << "\n";
  f.flush();
  KVTRIM_CHECK(f.good(), "error writing results file '%s'", path.c_str());
}

void fail_changed_input(const std::string& path, const std::string& item, const char* changed,
                        const std::string& was, const std::string& now, const char* out_flag) {
  fail("%s: %s %s (hash %s, now %s) under the same config: use a new %s", path.c_str(), item.c_str(), changed,
       was.c_str(), now.c_str(), out_flag);
}

}  // namespace kvtrim::eval
