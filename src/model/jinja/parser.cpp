// Jinja parser (see parser.h).
#include "model/jinja/parser.h"

#include <cerrno>
#include <cstdlib>
#include <initializer_list>

#include "core/error.h"
#include "model/jinja/builtins.h"
#include "model/jinja/parser_cursor.h"

namespace kvtrim::jinja {

namespace {

class Parser : TokenCursor {
 public:
  Parser(const std::vector<Token>& t, const std::string& name) : TokenCursor(t, name) {}

  Body run() {
    std::string end;
    Body b = body({}, &end);
    return b;
  }

 private:
  // ---------------------------------------------------------------- statements
  // Parses nodes until a block tag whose name is in `ends` (consumed up to the name; *end
  // receives it) or the end of the template (only allowed when ends is empty).
  Body body(std::initializer_list<const char*> ends, std::string* end) {
    Body out;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::kEnd) {
        if (ends.size() != 0) {
          std::string want;
          for (const char* e : ends) want += std::string(want.empty() ? "" : " or ") + "'" + e + "'";
          error("unexpected end of template, expected " + want);
        }
        *end = "";
        return out;
      }
      if (tk.type == Tok::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->text = tk.value;
        n->line = tk.line;
        out.push_back(std::move(n));
        next();
      } else if (tk.type == Tok::kVarBegin) {
        next();
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = tk.line;
        n->expr = tuple_expr(true);
        if (cur().type != Tok::kVarEnd) error("expected '}}', got " + describe());
        next();
        out.push_back(std::move(n));
      } else if (tk.type == Tok::kBlockBegin) {
        next();
        const std::string tag = cur().type == Tok::kName ? cur().value : "";
        for (const char* e : ends)
          if (tag == e) {
            next();
            *end = tag;
            return out;
          }
        out.push_back(statement());
      } else {
        error("unexpected " + describe());
      }
    }
  }

  std::unique_ptr<Node> statement() {
    DepthGuard guard(this);  // nested blocks count too
    const int line = cur().line;
    const std::string tag = expect_name();
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string end;
    if (tag == "if") {
      n->kind = Node::Kind::kIf;
      ExprP c = expression(true);
      expect_block_end();
      while (true) {
        Body b = body({"elif", "else", "endif"}, &end);
        n->branches.emplace_back(std::move(c), std::move(b));
        if (end != "elif") break;
        c = expression(true);
        expect_block_end();
      }
      if (end == "else") {
        expect_block_end();
        n->else_body = body({"endif"}, &end);
      }
      expect_block_end();
    } else if (tag == "for") {
      n->kind = Node::Kind::kFor;
      n->targets = assign_targets();
      if (!skip_name("in")) error("expected 'in' in a for loop, got " + describe());
      n->expr = tuple_expr(false);
      if (skip_name("if")) n->cond = expression(true);
      if (is_name("recursive")) error("recursive for loops are not supported");
      expect_block_end();
      n->body = body({"else", "endfor"}, &end);
      if (end == "else") {
        expect_block_end();
        n->else_body = body({"endfor"}, &end);
      }
      expect_block_end();
    } else if (tag == "set") {
      const std::string first = expect_name();
      if (skip_op(".")) {  // namespace attribute
        n->kind = Node::Kind::kSet;
        n->targets = {first};
        n->attr = expect_name();
        expect_op("=");
        n->expr = tuple_expr(true);
        expect_block_end();
      } else {
        n->targets = {first};
        while (skip_op(",")) n->targets.push_back(expect_name());
        if (skip_op("=")) {
          n->kind = Node::Kind::kSet;
          n->expr = tuple_expr(true);
          expect_block_end();
        } else {
          if (n->targets.size() != 1) error("a block set takes one name");
          n->kind = Node::Kind::kSetBlock;
          while (skip_op("|")) n->filters.push_back(filter(nullptr));
          expect_block_end();
          n->body = body({"endset"}, &end);
          expect_block_end();
        }
      }
    } else if (tag == "macro") {
      n->kind = Node::Kind::kMacro;
      n->targets = {expect_name()};
      expect_op("(");
      while (!skip_op(")")) {
        if (!n->params.empty()) expect_op(",");
        std::string p = expect_name();
        ExprP def;
        if (skip_op("=")) def = expression(true);
        n->params.emplace_back(std::move(p), std::move(def));
      }
      expect_block_end();
      n->body = body({"endmacro"}, &end);
      if (cur().type == Tok::kName) next();  // {% endmacro name %}
      expect_block_end();
    } else if (tag == "filter") {
      n->kind = Node::Kind::kFilterBlock;
      n->filters.push_back(filter(nullptr));
      while (skip_op("|")) n->filters.push_back(filter(nullptr));
      expect_block_end();
      n->body = body({"endfilter"}, &end);
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      n->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_block_end();
    } else if (tag == "generation") {
      n->kind = Node::Kind::kBlock;
      expect_block_end();
      n->body = body({"endgeneration"}, &end);
      expect_block_end();
    } else {
      error("unknown or unsupported tag '" + tag + "'");
    }
    return n;
  }

  std::vector<std::string> assign_targets() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    names.push_back(expect_name());
    while (skip_op(",")) names.push_back(expect_name());
    if (paren) expect_op(")");
    return names;
  }

  // ---------------------------------------------------------------- expressions
  // An expression, or a tuple of them when separated by commas (jinja2's parse_tuple).
  ExprP tuple_expr(bool with_cond) {
    const int line = cur().line;
    ExprP first = expression(with_cond);
    if (!is_op(",")) return first;
    ExprP t = make(Expr::Kind::kTuple, line);
    t->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::kBlockEnd || cur().type == Tok::kVarEnd || is_op(")")) break;
      t->args.push_back(expression(with_cond));
    }
    return t;
  }

  // Nesting depth of expressions being parsed: a bound, so that "((((…" cannot exhaust the stack.
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxDepth) p_->error("expression nested too deeply");
    }
    ~DepthGuard() { --p_->depth_; }
    Parser* p_;
  };
  static constexpr int kMaxDepth = 200;

  ExprP expression(bool with_cond) {
    DepthGuard guard(this);
    ExprP e = or_expr();
    if (!with_cond) return e;
    while (is_name("if")) {
      const int line = cur().line;
      next();
      ExprP c = make(Expr::Kind::kCond, line);
      ExprP test = or_expr();
      ExprP other;
      if (skip_name("else")) other = expression(true);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(test));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprP binary(const char* op, ExprP a, ExprP b, int line) {
    ExprP e = make(Expr::Kind::kBinary, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprP or_expr() {
    ExprP e = and_expr();
    while (is_name("or")) {
      const int line = cur().line;
      next();
      e = binary("or", std::move(e), and_expr(), line);
    }
    return e;
  }

  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) {
      const int line = cur().line;
      next();
      e = binary("and", std::move(e), not_expr(), line);
    }
    return e;
  }

  ExprP not_expr() {
    DepthGuard guard(this);
    if (is_name("not")) {
      const int line = cur().line;
      next();
      ExprP e = make(Expr::Kind::kUnary, line);
      e->name = "not";
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }

  ExprP compare() {
    const int line = cur().line;
    ExprP e = math1();
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == ">" ||
           cur().value == "<=" || cur().value == ">=")) {
        op = cur().value;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Tok::kName && peek().value == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      e = binary(op.c_str(), std::move(e), math1(), line);
      if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">=") || is_name("in"))
        error("chained comparisons (a < b < c) are not supported");
    }
    return e;
  }

  ExprP math1() {
    ExprP e = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().value;
      const int line = cur().line;
      next();
      e = binary(op.c_str(), std::move(e), concat(), line);
    }
    return e;
  }

  ExprP concat() {
    ExprP e = math2();
    while (is_op("~")) {
      const int line = cur().line;
      next();
      e = binary("~", std::move(e), math2(), line);
    }
    return e;
  }

  ExprP math2() {
    ExprP e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().value;
      const int line = cur().line;
      next();
      e = binary(op.c_str(), std::move(e), power(), line);
    }
    return e;
  }

  ExprP power() {
    ExprP e = unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      next();
      e = binary("**", std::move(e), unary(true), line);
    }
    return e;
  }

  ExprP unary(bool with_filter) {
    DepthGuard guard(this);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      const int line = cur().line;
      ExprP u = make(Expr::Kind::kUnary, line);
      u->name = cur().value;
      next();
      u->args.push_back(unary(false));
      e = std::move(u);
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filter_expr(std::move(e));
    return e;
  }

  ExprP primary() {
    const Token& tk = cur();
    const int line = tk.line;
    if (tk.type == Tok::kName) {
      ExprP e = make(Expr::Kind::kLiteral, line);
      if (tk.value == "true" || tk.value == "True") {
        e->literal = Value(true);
      } else if (tk.value == "false" || tk.value == "False") {
        e->literal = Value(false);
      } else if (tk.value == "none" || tk.value == "None") {
        e->literal = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = tk.value;
      }
      next();
      return e;
    }
    if (tk.type == Tok::kString) {
      std::string s;
      while (cur().type == Tok::kString) {  // adjacent literals concatenate
        s += cur().value;
        next();
      }
      ExprP e = make(Expr::Kind::kLiteral, line);
      e->literal = Value(std::move(s));
      return e;
    }
    if (tk.type == Tok::kInt || tk.type == Tok::kFloat) {
      ExprP e = make(Expr::Kind::kLiteral, line);
      errno = 0;
      e->literal = tk.type == Tok::kInt ? Value(static_cast<int64_t>(std::strtoll(tk.value.c_str(), nullptr, 10)))
                                        : Value(std::strtod(tk.value.c_str(), nullptr));
      if (errno == ERANGE && tk.type == Tok::kInt) error("integer literal " + tk.value + " does not fit 64 bits");
      next();
      return e;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make(Expr::Kind::kTuple, line);
      ExprP first = expression(true);
      if (skip_op(")")) return first;
      ExprP t = make(Expr::Kind::kTuple, line);
      t->args.push_back(std::move(first));
      while (skip_op(",")) {
        if (is_op(")")) break;
        t->args.push_back(expression(true));
      }
      expect_op(")");
      return t;
    }
    if (skip_op("[")) {
      ExprP l = make(Expr::Kind::kList, line);
      while (!skip_op("]")) {
        if (!l->args.empty()) {
          expect_op(",");
          if (skip_op("]")) break;
        }
        l->args.push_back(expression(true));
      }
      return l;
    }
    if (skip_op("{")) {
      ExprP d = make(Expr::Kind::kDict, line);
      while (!skip_op("}")) {
        if (!d->args.empty()) {
          expect_op(",");
          if (skip_op("}")) break;
        }
        d->args.push_back(expression(true));
        expect_op(":");
        d->args.push_back(expression(true));
      }
      return d;
    }
    error("unexpected " + describe());
  }

  ExprP postfix(ExprP e) {
    while (true) {
      const int line = cur().line;
      if (skip_op(".")) {
        if (cur().type == Tok::kInt) {  // x.0 is x[0]
          ExprP it = make(Expr::Kind::kItem, line);
          ExprP key = make(Expr::Kind::kLiteral, line);
          key->literal = Value(static_cast<int64_t>(std::strtoll(cur().value.c_str(), nullptr, 10)));
          next();
          it->args.push_back(std::move(e));
          it->args.push_back(std::move(key));
          e = std::move(it);
          continue;
        }
        ExprP a = make(Expr::Kind::kAttr, line);
        a->name = expect_name();
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (skip_op("[")) {
        e = subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprP subscript(ExprP obj, int line) {
    ExprP parts[3];
    bool slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!is_op(":") && !is_op("]")) parts[k] = expression(true);
      if (k < 2 && skip_op(":")) {
        slice = true;
        continue;
      }
      break;
    }
    if (!slice && is_op(",")) {  // x[a, b] is x[(a, b)]
      ExprP t = make(Expr::Kind::kTuple, line);
      t->args.push_back(std::move(parts[0]));
      while (skip_op(",")) t->args.push_back(expression(true));
      parts[0] = std::move(t);
    }
    expect_op("]");
    if (!slice) {
      if (!parts[0]) error("empty subscript");
      ExprP it = make(Expr::Kind::kItem, line);
      it->args.push_back(std::move(obj));
      it->args.push_back(std::move(parts[0]));
      return it;
    }
    ExprP s = make(Expr::Kind::kSlice, line);
    s->args.push_back(std::move(obj));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  // "(" args ")" into e->args (after any already there) and e->kwargs.
  void call_args(Expr* e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) {
        expect_op(",");
        if (skip_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**")) error("*args / **kwargs in calls are not supported");
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().value == "=") {
        std::string k = cur().value;
        next();
        next();
        e->kwargs.emplace_back(std::move(k), expression(true));
      } else {
        if (!e->kwargs.empty()) error("a positional argument after a keyword argument");
        e->args.push_back(expression(true));
      }
    }
  }

  ExprP call(ExprP callee) {
    ExprP c = make(Expr::Kind::kCall, cur().line);
    c->args.push_back(std::move(callee));
    call_args(c.get());
    return c;
  }

  // "| name[(args)]" with the "|" already consumed; subject may be null (filter blocks).
  ExprP filter(ExprP subject) {
    ExprP f = make(Expr::Kind::kFilter, cur().line);
    f->name = expect_name();
    while (skip_op(".")) {
      f->name += '.';
      f->name += expect_name();
    }
    if (!is_filter(f->name)) error("no filter named '" + f->name + "'");
    f->args.push_back(std::move(subject));
    if (is_op("(")) call_args(f.get());
    return f;
  }

  ExprP filter_expr(ExprP e) {
    while (true) {
      if (skip_op("|")) {
        e = filter(std::move(e));
      } else if (is_name("is")) {
        const int line = cur().line;
        next();
        ExprP t = make(Expr::Kind::kTest, line);
        t->negated = skip_name("not");
        t->name = expect_name();
        while (skip_op(".")) {
          t->name += '.';
          t->name += expect_name();
        }
        if (!is_test(t->name)) error("no test named '" + t->name + "'");
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          call_args(t.get());
        } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                    cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) error("you cannot chain multiple tests with is");
          t->args.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  int depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& name) { return Parser(tokens, name).run(); }

}  // namespace kvtrim::jinja
