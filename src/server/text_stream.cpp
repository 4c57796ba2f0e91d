#include "server/text_stream.h"

#include <algorithm>

namespace kvtrim::server {

size_t utf8_complete_prefix(const std::string& s, size_t n) {
  // Walk back over at most 3 continuation bytes to the last lead byte.
  size_t i = n;
  int cont = 0;
  while (i > 0 && cont < 3 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++cont;
  }
  if (i == 0) return n;  // only continuation bytes: nothing to wait for
  const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  int len = 1;
  if ((lead & 0xE0) == 0xC0) len = 2;
  else if ((lead & 0xF0) == 0xE0) len = 3;
  else if ((lead & 0xF8) == 0xF0) len = 4;
  else if ((lead & 0x80) != 0) return n;  // a stray continuation run / invalid lead: pass it on
  if (len == 1) return n;                  // ASCII lead: complete (cont bytes after it are invalid)
  return cont + 1 >= len ? n : i - 1;      // the last character is complete, or cut before it
}

TextStream::TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string TextStream::release(size_t n) {
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  text_ += out;
  return out;
}

std::string TextStream::push(const std::string& piece) {
  if (stopped_) return {};
  pending_ += piece;
  // A stop sequence can only lie within pending_ (text that could start one is never released).
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = release(first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop sequence.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return release(utf8_complete_prefix(pending_, pending_.size() - hold));
}

std::string TextStream::flush() {
  if (stopped_) return {};
  return release(pending_.size());
}

}  // namespace kvtrim::server
