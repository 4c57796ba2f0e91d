// Jinja lexer (see lexer.h).
#include "model/jinja/lexer.h"

#include <cctype>
#include <cstring>

#include "core/error.h"
#include "core/utf8.h"

namespace kvtrim::jinja {

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string normalise(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name) : s_(normalise(src)), name_(name) {}

  std::vector<Token> run() {
    bool line_starting = true;  // the previous match ended with a newline (or this is the start)
    while (pos_ < s_.size()) {
      size_t at = find_tag(pos_);
      std::string text = s_.substr(pos_, at - pos_);
      if (at == s_.size()) {
        emit_text(text);
        break;
      }
      const char kind = s_[at + 1];  // '{', '%' or '#'
      const char sign = at + 2 < s_.size() ? s_[at + 2] : '\0';
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && is_ws(text[e - 1])) --e;
        text.resize(e);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        const size_t l = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l > 0 || line_starting) {
          bool blank = l < text.size();
          for (size_t i = l; i < text.size() && blank; ++i) blank = is_ws(text[i]);
          if (blank) text.resize(l);
        }
      }
      emit_text(text);
      line_ += count_lines(pos_, at);
      pos_ = at + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        line_starting = comment();
      } else if (kind == '%' && is_raw_begin()) {
        line_starting = raw();
      } else {
        line_starting = tag(kind);
      }
    }
    out_.push_back({Tok::kEnd, "", line_});
    return std::move(out_);
  }

 private:
  [[noreturn]] void error(const char* what) const { fail("%s:%d: %s", name_.c_str(), line_, what); }

  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < s_.size(); ++i)
      if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    return s_.size();
  }

  int count_lines(size_t a, size_t b) const {
    int n = 0;
    for (size_t i = a; i < b && i < s_.size(); ++i) n += s_[i] == '\n';
    return n;
  }

  void emit_text(const std::string& t) {
    if (!t.empty()) out_.push_back({Tok::kText, t, line_});
  }

  // After a tag's closing delimiter at pos_ (already past it): "-" stripped all whitespace,
  // trim_blocks removes one newline after block and comment tags. Returns line_starting.
  bool after_close(bool minus, bool block_like) {
    const size_t start = pos_;
    if (minus) {
      while (pos_ < s_.size() && is_ws(s_[pos_])) ++pos_;
    } else if (block_like && pos_ < s_.size() && s_[pos_] == '\n') {
      ++pos_;
    }
    line_ += count_lines(start, pos_);
    return pos_ > start && s_[pos_ - 1] == '\n';
  }

  bool comment() {
    const size_t e = s_.find("#}", pos_);
    if (e == std::string::npos) error("unterminated comment");
    const bool minus = e > pos_ && s_[e - 1] == '-';
    line_ += count_lines(pos_, e);
    pos_ = e + 2;
    return after_close(minus, true);
  }

  // "{% raw %}" (with optional '-' on either side) at pos_ (just past "{%" and its sign)?
  bool is_raw_begin() const {
    size_t p = pos_;
    while (p < s_.size() && is_ws(s_[p])) ++p;
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < s_.size() && is_ws(s_[p])) ++p;
    return s_.compare(p, 2, "%}") == 0 || s_.compare(p, 3, "-%}") == 0;
  }

  bool raw() {
    size_t p = s_.find("%}", pos_);
    const bool minus_open = s_[p - 1] == '-';
    pos_ = p + 2;
    after_close(minus_open, true);
    // The text up to "{% endraw %}" (with its own whitespace control).
    for (size_t q = s_.find("{%", pos_); q != std::string::npos; q = s_.find("{%", q + 2)) {
      size_t r = q + 2;
      const char sign = r < s_.size() ? s_[r] : '\0';
      if (sign == '-' || sign == '+') ++r;
      while (r < s_.size() && is_ws(s_[r])) ++r;
      if (s_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < s_.size() && is_ws(s_[r])) ++r;
      const bool minus_close = s_.compare(r, 3, "-%}") == 0;
      if (!minus_close && s_.compare(r, 2, "%}") != 0) continue;
      std::string text = s_.substr(pos_, q - pos_);
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && is_ws(text[e - 1])) --e;
        text.resize(e);
      }
      emit_text(text);
      line_ += count_lines(pos_, q);
      pos_ = r + (minus_close ? 3 : 2);
      return after_close(minus_close, true);
    }
    error("{% raw %} without {% endraw %}");
  }

  // The tokens of a {{ … }} or {% … %} tag, pos_ just past the opening delimiter.
  bool tag(char kind) {
    const bool var = kind == '{';
    out_.push_back({var ? Tok::kVarBegin : Tok::kBlockBegin, "", line_});
    const char close = var ? '}' : '%';
    int depth = 0;  // open brackets: a '}' inside {{ {'a': 1} }} does not close the tag
    while (true) {
      while (pos_ < s_.size() && is_ws(s_[pos_])) {
        line_ += s_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= s_.size()) error(var ? "unterminated '{{'" : "unterminated '{%'");
      const char c = s_[pos_];
      // The closing delimiter, with its optional '-' (or '+' for blocks).
      const bool signed_close = (c == '-' || c == '+') && s_.compare(pos_ + 1, 2, std::string(1, close) + "}") == 0;
      if (depth == 0 && (signed_close || s_.compare(pos_, 2, std::string(1, close) + "}") == 0)) {
        const bool minus = signed_close && c == '-';
        pos_ += signed_close ? 3 : 2;
        out_.push_back({var ? Tok::kVarEnd : Tok::kBlockEnd, "", line_});
        return after_close(minus, !var && !(signed_close && c == '+'));
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        out_.push_back({Tok::kName, s_.substr(pos_, e - pos_), line_});
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (c == '\'' || c == '"') {
        string(c);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                           ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|", ";"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (s_.compare(pos_, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        if (op == nullptr) error(("unexpected character '" + std::string(1, c) + "'").c_str());
        if (*op == '(' || *op == '[' || *op == '{') ++depth;
        if ((*op == ')' || *op == ']' || *op == '}') && depth > 0) --depth;
        out_.push_back({Tok::kOp, op, line_});
        pos_ += std::strlen(op);
      }
    }
  }

  void number() {
    size_t e = pos_;
    bool is_float = false;
    while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      is_float = true;
      ++e;
      while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t f = e + 1;
      if (f < s_.size() && (s_[f] == '+' || s_[f] == '-')) ++f;
      if (f < s_.size() && std::isdigit(static_cast<unsigned char>(s_[f]))) {
        is_float = true;
        e = f;
        while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
      }
    }
    std::string v;
    for (size_t i = pos_; i < e; ++i)
      if (s_[i] != '_') v += s_[i];
    out_.push_back({is_float ? Tok::kFloat : Tok::kInt, v, line_});
    pos_ = e;
  }

  // A string literal; escapes as Python's unicode-escape codec reads them (jinja2 decodes
  // literals that way): unknown escapes keep their backslash.
  void string(char q) {
    std::string v;
    size_t i = pos_ + 1;
    const int start_line = line_;
    for (;; ++i) {
      if (i >= s_.size()) error("unterminated string literal");
      const char c = s_[i];
      if (c == q) break;
      if (c == '\n') ++line_;
      if (c != '\\' || i + 1 >= s_.size()) {
        v += c;
        continue;
      }
      const char n = s_[++i];
      switch (n) {
        case 'n': v += '\n'; break;
        case 't': v += '\t'; break;
        case 'r': v += '\r'; break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case 'a': v += '\a'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'v': v += '\v'; break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t nd = n == 'x' ? 2 : n == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 1; k <= nd; ++k) {
            const char h = i + k < s_.size() ? s_[i + k] : '\0';
            if (!std::isxdigit(static_cast<unsigned char>(h))) error("truncated \\x / \\u escape in a string literal");
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          i += nd;
          utf8_append(cp, &v);
          break;
        }
        default:
          if (n >= '0' && n <= '7') {
            uint32_t cp = static_cast<uint32_t>(n - '0');
            for (int k = 0; k < 2 && i + 1 < s_.size() && s_[i + 1] >= '0' && s_[i + 1] <= '7'; ++k)
              cp = cp * 8 + static_cast<uint32_t>(s_[++i] - '0');
            utf8_append(cp, &v);
          } else {
            v += '\\';
            v += n;
          }
      }
    }
    out_.push_back({Tok::kString, v, start_line});
    pos_ = i + 1;
  }

  std::string s_;
  std::string name_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& name) { return Lexer(source, name).run(); }

}  // namespace kvtrim::jinja
