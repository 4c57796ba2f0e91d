// One results JSONL with resume, for every evaluation (ruler / gsm8k questions, multiple choice
// items, perplexity windows, and the sweeps' rows): ResultsFile<Row, Key>.
//
// Each line is one row plus "config" (the hash of everything that determines the result: model,
// prompt format, cache settings, press, data). Opening an existing file keeps the rows of this
// run's configs and counts the others, which stay in the file untouched; a torn last line (an
// interrupted write) is cut off and runs again; a line that is not a row of this kind is an error
// naming the file and line. A row is identified by its key (config included where a file holds
// several) and carries a hash of its input (sample text, item, window tokens): resuming a key whose
// input changed under the same config is an error, never a silent mix. append() writes one line and
// flushes, so an interruption loses at most the row being made.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "eval/jsonl.h"

namespace kvtrim::eval {

// What a row type needs to live in a results file.
template <class Row, class Key>
struct ResultsFormat {
  const char* what;      // a row in words, for the torn-line warning ("question", "window")
  const char* kind;      // a line in words, for errors ("results line", "sweep results line")
  const char* out_flag;  // the option that names the file ("--out", "--out-dir")
  Row (*parse)(const nlohmann::json& j);                    // throws json::exception
  std::string (*line)(const Row& r, const std::string& config);  // one JSON object, no newline
  Key (*key)(const Row& r);
  const std::string& (*input_hash)(const Row& r);
};

// Appends one line and a newline to path and flushes; Error if it cannot.
void append_results_line(const std::string& path, const std::string& line);
// The error for a key resumed on other input: "<path>: <item> <changed> (hash <was>, now <now>)
// under the same config: use a new <out_flag>".
[[noreturn]] void fail_changed_input(const std::string& path, const std::string& item, const char* changed,
                                     const std::string& was, const std::string& now, const char* out_flag);

template <class Row, class Key>
class ResultsFile {
 public:
  using Format = ResultsFormat<Row, Key>;
  // Rows of the configs in `configs` are this run's (every_config: every row is, whatever its
  // config: a summary of a file as it stands). append() writes `configs`' only member as the
  // row's config when the format's line takes it from the file (one config per file).
  ResultsFile(std::string path, const Format& format, std::set<std::string> configs, bool every_config = false)
      : path_(std::move(path)), f_(format), configs_(std::move(configs)) {
    bool torn = false;
    read_results_rows(
        path_, f_.what, f_.kind, f_.out_flag,
        [&](const std::string& c) { return every_config || configs_.count(c) != 0; },
        [&](const nlohmann::json& j) { add(f_.parse(j)); }, &n_other_, &torn);
    n_torn_ = torn ? 1 : 0;
  }

  // The row of key k, or nullptr.
  const Row* find(const Key& k) const {
    auto it = index_.find(k);
    return it == index_.end() ? nullptr : &rows_[it->second];
  }
  // True if key k is there. Throws Error (fail_changed_input) if it is there with another input
  // hash: `item` and `changed` word the error ("window 3", "was scored on other tokens").
  bool done(const Key& k, const std::string& input_hash, const std::string& item, const char* changed) const {
    const Row* r = find(k);
    if (!r) return false;
    if (f_.input_hash(*r) != input_hash)
      fail_changed_input(path_, item, changed, f_.input_hash(*r), input_hash, f_.out_flag);
    return true;
  }
  void append(const Row& r) {
    append_results_line(path_, f_.line(r, configs_.size() == 1 ? *configs_.begin() : std::string()));
    add(r);
  }
  const std::vector<Row>& rows() const { return rows_; }  // this run's configs' rows, in file order
  int64_t n_other_config() const { return n_other_; }
  int64_t n_dropped_torn() const { return n_torn_; }
  const std::string& path() const { return path_; }

 private:
  void add(Row r) {
    const Key k = f_.key(r);
    if (index_.count(k)) return;  // a duplicate line: the first one counts
    index_.emplace(k, rows_.size());
    rows_.push_back(std::move(r));
  }

  std::string path_;
  Format f_;
  std::set<std::string> configs_;
  std::vector<Row> rows_;
  std::map<Key, size_t> index_;
  int64_t n_other_ = 0, n_torn_ = 0;
};

}  // namespace kvtrim::eval
