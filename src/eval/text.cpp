#include "eval/text.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/strings.h"

namespace kvtrim::eval {

namespace fs = std::filesystem;

std::string normalize_space(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool space = false;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = !out.empty();
    } else {
      if (space) out.push_back(' ');
      space = false;
      out.push_back(c);
    }
  }
  return out;
}

std::vector<std::string> split_sentences(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c != '.' && c != '!' && c != '?') continue;
    size_t j = i + 1;
    while (j < n && (text[j] == '"' || text[j] == '\'' || text[j] == ')' || text[j] == ']')) ++j;
    if (j < n && text[j] != ' ') continue;
    out.emplace_back(text.substr(start, j - start));
    start = j + 1;  // skip the space
    i = j;
  }
  if (start < n) out.emplace_back(text.substr(start));
  return out;
}

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t sp = text.find(' ', start);
    if (sp == std::string_view::npos) sp = text.size();
    if (sp > start) out.emplace_back(text.substr(start, sp - start));
    start = sp + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  size_t total = 0;
  for (const auto& p : parts) total += p.size() + sep.size();
  out.reserve(total);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  if (from.empty()) return s;
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

std::string to_lower(std::string_view s) { return ascii_lower(std::string(s)); }

bool contains_ci(std::string_view haystack, std::string_view needle) {
  return to_lower(haystack).find(to_lower(needle)) != std::string::npos;
}

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  KVTRIM_CHECK(f.good(), "cannot read %s '%s'", what, path.c_str());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> load_text_dir(const std::string& dir) {
  std::error_code ec;
  KVTRIM_CHECK(fs::is_directory(dir, ec), "haystack directory '%s' does not exist", dir.c_str());
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path());
  }
  KVTRIM_CHECK(!files.empty(), "haystack directory '%s' has no .txt files", dir.c_str());
  std::sort(files.begin(), files.end());
  std::vector<std::string> out;
  for (const auto& p : files) {
    out.push_back(read_text_file(p.string(), "haystack file"));
  }
  return out;
}

}  // namespace kvtrim::eval
