// Generated text as a client may see it while it is being produced: token pieces are joined,
// and what is released never ends inside a UTF-8 character and never contains text that could
// still turn out to be the start of a stop sequence (llama-server's partial-stop hold-back).
// Stop sequences are matched on the text, across token boundaries; the text from the stop on is
// never released (OpenAI semantics).
#pragma once
#include <string>
#include <vector>

namespace kvtrim::server {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops = {});
  // Adds a token's piece; returns the text released by it (maybe empty). After a stop
  // sequence appeared, stopped() is true and later pieces are ignored.
  std::string push(const std::string& piece);
  // At the end of generation: whatever is still held (a partial stop sequence that did not
  // complete, or an unfinished UTF-8 character) is released; nothing after a stop.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }  // everything released so far

 private:
  std::string release(size_t n);
  std::vector<std::string> stops_;
  std::string pending_, text_;
  bool stopped_ = false;
};

// Length of the longest prefix of s[0, n) that does not end inside a UTF-8 sequence (an
// incomplete lead byte and its continuation bytes at the end are excluded).
size_t utf8_complete_prefix(const std::string& s, size_t n);

}  // namespace kvtrim::server
