// The parser's cursor over the lexer's tokens (parser.cpp's Parser reads through it): where it
// is, lookahead, matching and consuming operators, names and block ends, and the syntax error
// that names the template and the line.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/jinja/ast.h"
#include "model/jinja/lexer.h"

namespace kvtrim::jinja {

class TokenCursor {
 protected:
  TokenCursor(const std::vector<Token>& t, const std::string& name) : t_(t), name_(name) {}

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[i_ + k < t_.size() ? i_ + k : t_.size() - 1]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  [[noreturn]] void error(const std::string& what) const {
    fail("%s:%d: %s", name_.c_str(), cur().line, what.c_str());
  }
  std::string describe() const {
    switch (cur().type) {
      case Tok::kEnd:
        return "end of template";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kText:
        return "template text";
      default:
        return "'" + cur().value + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(std::string("expected '") + op + "', got " + describe());
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) error("expected a name, got " + describe());
    std::string n = cur().value;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) error("expected '%}', got " + describe());
    next();
  }
  ExprP make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  const std::vector<Token>& t_;
  const std::string& name_;
  size_t i_ = 0;
};

}  // namespace kvtrim::jinja
