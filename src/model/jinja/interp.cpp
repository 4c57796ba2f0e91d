// The Jinja interpreter: runs the syntax tree of parser.cpp over Values (see jinja.h).
// Scopes follow jinja2: a for loop's body has its own scope (a set inside it is gone after the
// loop; templates carry state out of loops in a namespace()), if blocks do not; a macro runs in
// a scope of its own over the template's top level.
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "model/jinja/builtins.h"
#include "model/jinja/jinja.h"
#include "model/jinja/lexer.h"
#include "model/jinja/parser.h"

namespace kvtrim::jinja {

namespace {

// raise_exception(message): carried to Template::render, which names the template.
struct RaisedError {
  std::string message;
};

enum class Flow { kNormal, kBreak, kContinue };

class Interp {
 public:
  Interp(const std::string& name, const RenderOptions& opt) : name_(name), opt_(opt) {}

  void push(std::unordered_map<std::string, Value> frame = {}) { scopes_.push_back(std::move(frame)); }
  void pop() { scopes_.pop_back(); }
  void set(const std::string& k, Value v) { scopes_.back()[k] = std::move(v); }

  Value lookup(const std::string& k) const {
    for (size_t i = scopes_.size(); i-- > 0;) {
      auto it = scopes_[i].find(k);
      if (it != scopes_[i].end()) return it->second;
    }
    return Value::undefined(k);
  }

  Flow exec(const Body& body, std::string* out) {
    for (const auto& n : body) {
      const Flow f = exec(*n, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  [[noreturn]] void error(int line, const std::string& what) const {
    fail("%s:%d: %s", name_.c_str(), line, what.c_str());
  }

 private:
  // Bounds on what a template may do (a template is data from a file or a request): statements
  // run, output and value sizes, macro recursion. Real chat templates stay far below them.
  static constexpr size_t kMaxOutput = size_t{1} << 26;  // 64 MiB
  static constexpr int kMaxCallDepth = 100;

  Flow exec(const Node& n, std::string* out) {
    if (++steps_ > opt_.max_steps) too_long(n.line);
    if (out->size() > kMaxOutput) error(n.line, "the template's output passes 64 MiB");
    try {
      switch (n.kind) {
        case Node::Kind::kText: *out += n.text; return Flow::kNormal;
        case Node::Kind::kOutput: *out += eval(*n.expr).to_str(); return Flow::kNormal;
        case Node::Kind::kIf:
          for (const auto& br : n.branches)
            if (eval(*br.first).truthy()) return exec(br.second, out);
          return exec(n.else_body, out);
        case Node::Kind::kFor: return exec_for(n, out);
        case Node::Kind::kSet: exec_set(n); return Flow::kNormal;
        case Node::Kind::kSetBlock: {
          std::string text;
          exec(n.body, &text);
          Value v(std::move(text));
          for (const auto& f : n.filters) v = filter(*f, v);
          set(n.targets[0], std::move(v));
          return Flow::kNormal;
        }
        case Node::Kind::kMacro: set(n.targets[0], make_macro(n)); return Flow::kNormal;
        case Node::Kind::kFilterBlock: {
          std::string text;
          exec(n.body, &text);
          Value v(std::move(text));
          for (const auto& f : n.filters) v = filter(*f, v);
          *out += v.to_str();
          return Flow::kNormal;
        }
        case Node::Kind::kBreak: return Flow::kBreak;
        case Node::Kind::kContinue: return Flow::kContinue;
        case Node::Kind::kBlock: return exec(n.body, out);
      }
    } catch (const RaisedError&) {
      throw;
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.rfind(name_ + ":", 0) == 0) throw;  // already located
      error(n.line, what);
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Node& n, std::string* out) {
    const Value seq = eval(*n.expr);
    if (!seq.is_undefined() && !seq.is_sequence() && !seq.is_mapping() && !seq.is_string())
      error(n.line, "'" + seq.type_name() + "' object is not iterable");
    ValueList items = seq.kind() == Value::Kind::kNamespace ? ValueList{} : seq.iterate();
    // The "if" filter runs before the loop variables (loop.index counts the kept items).
    if (n.cond) {
      ValueList kept;
      for (const Value& it : items) {
        if (++steps_ > opt_.max_steps) too_long(n.line);
        push();
        bind_targets(n, it);
        if (eval(*n.cond).truthy()) kept.push_back(it);
        pop();
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body, out);
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      if (++steps_ > opt_.max_steps) too_long(n.line);
      push();
      bind_targets(n, items[static_cast<size_t>(i)]);
      Dict loop;
      loop.set("index", Value(i + 1));
      loop.set("index0", Value(i));
      loop.set("revindex", Value(len - i));
      loop.set("revindex0", Value(len - i - 1));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == len - 1));
      loop.set("length", Value(len));
      loop.set("depth", Value(1));
      loop.set("depth0", Value(0));
      loop.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("loop.previtem"));
      loop.set("nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::undefined("loop.nextitem"));
      loop.set("cycle", Value::function("loop.cycle", [i](const CallArgs& a) {
                 if (a.pos.empty()) fail("loop.cycle() needs at least one argument");
                 return a.pos[static_cast<size_t>(i) % a.pos.size()];
               }));
      set("loop", Value::dict(std::move(loop)));
      const Flow f = exec(n.body, out);
      pop();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void bind_targets(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      set(n.targets[0], item);
      return;
    }
    if (!item.is_sequence() || item.items().size() != n.targets.size())
      error(n.line, "cannot unpack " + item.repr() + " into " + std::to_string(n.targets.size()) + " names");
    for (size_t k = 0; k < n.targets.size(); ++k) set(n.targets[k], item.items()[k]);
  }

  void exec_set(const Node& n) {
    Value v = eval(*n.expr);
    if (!n.attr.empty()) {
      const Value ns = lookup(n.targets[0]);
      if (ns.kind() != Value::Kind::kNamespace)
        error(n.line, "cannot assign attribute on a non-namespace object '" + n.targets[0] + "'");
      if (!n.attr.empty() && n.attr[0] == '_') error(n.line, "namespace attributes cannot start with '_'");
      ns.ns_mut().set(n.attr, std::move(v));
      return;
    }
    if (n.targets.size() == 1) {
      set(n.targets[0], std::move(v));
      return;
    }
    Node tmp;
    tmp.targets = n.targets;
    tmp.line = n.line;
    bind_targets(tmp, v);
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    return Value::function(n.targets[0], [this, node](const CallArgs& a) {
      if (a.pos.size() > node->params.size())
        fail("macro '%s' takes %zu arguments, %zu given", node->targets[0].c_str(), node->params.size(), a.pos.size());
      if (call_depth_ >= kMaxCallDepth) fail("macro '%s': calls nested too deeply", node->targets[0].c_str());
      ++call_depth_;
      struct Depth {
        int* d;
        ~Depth() { --*d; }
      } depth{&call_depth_};
      std::unordered_map<std::string, Value> frame;
      for (size_t k = 0; k < node->params.size(); ++k) {
        const auto& p = node->params[k];
        const Value* given = a.get(k, p.first.c_str());
        frame[p.first] = given ? *given : p.second ? eval(*p.second) : Value::undefined(p.first);
      }
      for (const auto& kw : a.kw) {
        bool known = false;
        for (const auto& p : node->params) known = known || p.first == kw.first;
        if (!known) fail("macro '%s' has no parameter '%s'", node->targets[0].c_str(), kw.first.c_str());
      }
      // The macro sees the template's top level (scope 0 and 1: globals and variables), not
      // the caller's loop scopes.
      std::vector<std::unordered_map<std::string, Value>> saved(scopes_.begin() + 2, scopes_.end());
      scopes_.resize(2);
      push(std::move(frame));
      std::string text;
      try {
        exec(node->body, &text);
      } catch (...) {
        scopes_.resize(2);
        scopes_.insert(scopes_.end(), saved.begin(), saved.end());
        throw;
      }
      scopes_.resize(2);
      scopes_.insert(scopes_.end(), saved.begin(), saved.end());
      return Value(std::move(text));
    });
  }

  // ---------------------------------------------------------------- expressions
  CallArgs args_of(const Expr& e, size_t first) {
    CallArgs a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k]));
    for (const auto& kw : e.kwargs) a.kw.emplace_back(kw.first, eval(*kw.second));
    return a;
  }

  Value filter(const Expr& f, const Value& subject) { return apply_filter(f.name, subject, args_of(f, 1)); }

  static void require_defined(const Value& v) {
    if (v.is_undefined()) fail("'%s' is undefined", v.hint().c_str());
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return e.kind == Expr::Kind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k]);
          if (!key.is_string()) error(e.line, "dict literal keys must be strings, got " + key.type_name());
          d.set(key.str_ref(), eval(*e.args[k + 1]));
        }
        return Value::dict(std::move(d));
      }
      case Expr::Kind::kAttr: return get_attr(eval(*e.args[0]), e.name);
      case Expr::Kind::kItem: return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::Kind::kSlice: {
        const Value obj = eval(*e.args[0]);
        auto part = [&](size_t k) { return e.args[k] ? eval(*e.args[k]) : Value::none(); };
        return get_slice(obj, part(1), part(2), part(3));
      }
      case Expr::Kind::kCall: {
        const Value callee = eval(*e.args[0]);
        require_defined(callee);
        if (!callee.is_callable()) error(e.line, "'" + callee.type_name() + "' object is not callable");
        CallArgs a = args_of(e, 1);
        if (callee.hint() == "raise_exception") {
          const Value* m = a.get(0, "message");
          throw RaisedError{m ? m->to_str() : std::string()};
        }
        return callee.fn()(a);
      }
      case Expr::Kind::kFilter: return filter(e, eval(*e.args[0]));
      case Expr::Kind::kTest: {
        const Value subject = eval(*e.args[0]);
        const bool r = apply_test(e.name, subject, args_of(e, 1));
        return Value(e.negated ? !r : r);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.args[0]);
        if (e.name == "not") return Value(!v.truthy());
        require_defined(v);
        if (!v.is_number()) error(e.line, "bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
        if (e.name == "+") return v.kind() == Value::Kind::kFloat ? Value(v.as_double()) : Value(v.as_int());
        return v.kind() == Value::Kind::kFloat ? Value(-v.as_double()) : Value(checked_mul(v.as_int(), -1));
      }
      case Expr::Kind::kBinary: return binary(e);
      case Expr::Kind::kCond:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("conditional without else");
    }
    return Value();
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    const Value a = eval(*e.args[0]);
    if (op == "and") return a.truthy() ? eval(*e.args[1]) : a;
    if (op == "or") return a.truthy() ? a : eval(*e.args[1]);
    const Value b = eval(*e.args[1]);
    if (op == "==") return Value(equals(a, b));
    if (op == "!=") return Value(!equals(a, b));
    if (op == "in" || op == "notin") {
      bool found = false;
      if (b.is_string()) {
        require_defined(a);
        if (!a.is_string()) error(e.line, "'in <string>' requires string as left operand, not " + a.type_name());
        found = b.str_ref().find(a.str_ref()) != std::string::npos;
      } else if (b.is_mapping()) {
        found = a.is_string() && b.dict_ref().find(a.str_ref()) != nullptr;
      } else if (b.is_sequence()) {
        for (const Value& x : b.items()) found = found || equals(a, x);
      } else if (!b.is_undefined()) {
        error(e.line, "argument of type '" + b.type_name() + "' is not iterable");
      }
      return Value(op == "in" ? found : !found);
    }
    if (op == "~") return Value(checked_concat(e, a.to_str(), b.to_str()));
    require_defined(a);
    require_defined(b);
    if (op == "<") return Value(less(a, b));
    if (op == ">") return Value(less(b, a));
    if (op == "<=") return Value(!less(b, a));
    if (op == ">=") return Value(!less(a, b));
    return arith(e, op, a, b);
  }

  [[noreturn]] void too_long(int line) const {
    error(line, "the template runs too long (more than " + std::to_string(opt_.max_steps) + " steps)");
  }

  std::string checked_concat(const Expr& e, const std::string& a, const std::string& b) const {
    if (a.size() + b.size() > kMaxOutput) error(e.line, "string result passes 64 MiB");
    return a + b;
  }

  Value arith(const Expr& e, const std::string& op, const Value& a, const Value& b) {
    auto bad = [&]() {
      error(e.line, "unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
    };
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(checked_concat(e, a.str_ref(), b.str_ref()));
      if (a.is_sequence() && b.is_sequence() && a.kind() == b.kind()) {
        ValueList x = a.items();
        x.insert(x.end(), b.items().begin(), b.items().end());
        return a.kind() == Value::Kind::kList ? Value::list(std::move(x)) : Value::tuple(std::move(x));
      }
    }
    if (op == "*" && (a.is_string() || a.is_sequence() || b.is_string() || b.is_sequence())) {
      const Value& s = a.is_number() ? b : a;
      const Value& n = a.is_number() ? a : b;
      if (!n.is_number() || n.kind() == Value::Kind::kFloat) bad();
      const int64_t k = n.as_int();
      const size_t unit = s.is_string() ? s.str_ref().size() : s.items().size() * 16;
      if (k > 0 && unit > 0 && static_cast<size_t>(k) > kMaxOutput / unit) error(e.line, "repetition result too large");
      if (s.is_string()) {
        std::string r;
        for (int64_t i = 0; i < k; ++i) r += s.str_ref();
        return Value(std::move(r));
      }
      ValueList r;
      for (int64_t i = 0; i < k; ++i) r.insert(r.end(), s.items().begin(), s.items().end());
      return s.kind() == Value::Kind::kList ? Value::list(std::move(r)) : Value::tuple(std::move(r));
    }
    if (!a.is_number() || !b.is_number()) {
      if (op == "%" && a.is_string()) error(e.line, "string % formatting is not supported");
      bad();
    }
    const bool fl = a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat;
    const double x = a.as_double(), y = b.as_double();
    const int64_t i = a.as_int(), j = b.as_int();
    if (op == "+") return fl ? Value(x + y) : Value(checked_add(i, j));
    if (op == "-") return fl ? Value(x - y) : Value(checked_add(i, checked_mul(j, -1)));
    if (op == "*") return fl ? Value(x * y) : Value(checked_mul(i, j));
    if (op == "/") {
      if (y == 0) error(e.line, "division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (fl ? y == 0 : j == 0) error(e.line, "integer division or modulo by zero");
      if (fl) {
        const double q = std::floor(x / y);
        return op == "//" ? Value(q) : Value(x - q * y);
      }
      if (j == -1) return op == "//" ? Value(checked_mul(i, -1)) : Value(0);  // INT64_MIN // -1
      int64_t q = i / j;
      if ((i % j != 0) && ((i < 0) != (j < 0))) --q;
      return op == "//" ? Value(q) : Value(i - q * j);
    }
    if (op == "**") {
      if (!fl && j >= 0) {
        int64_t r = 1;
        if (i == 0 || i == 1) {
          r = j == 0 ? 1 : i;
        } else if (i == -1) {
          r = j % 2 ? -1 : 1;
        } else {
          for (int64_t k = 0; k < j; ++k) r = checked_mul(r, i);  // overflows within 63 steps
        }
        return Value(r);
      }
      return Value(std::pow(x, y));
    }
    bad();
    return Value();
  }

  std::vector<std::unordered_map<std::string, Value>> scopes_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  const std::string& name_;
  const RenderOptions& opt_;
};

Value global_range(const CallArgs& a) {
  int64_t start = 0, stop = 0, step = 1;
  auto num = [](const Value& v) {
    if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool)
      fail("range() takes integers, got '%s'", v.type_name().c_str());
    return v.as_int();
  };
  if (a.pos.size() == 1) {
    stop = num(a.pos[0]);
  } else if (a.pos.size() == 2 || a.pos.size() == 3) {
    start = num(a.pos[0]);
    stop = num(a.pos[1]);
    if (a.pos.size() == 3) step = num(a.pos[2]);
  } else {
    fail("range() takes 1 to 3 arguments, %zu given", a.pos.size());
  }
  if (step == 0) fail("range() step must not be zero");
  ValueList out;
  for (int64_t v = start; step > 0 ? v < stop : v > stop;) {
    if (out.size() >= 1000000) fail("range() too large");
    out.emplace_back(v);
    if (__builtin_add_overflow(v, step, &v)) break;  // past INT64's end: past stop too
  }
  return Value::list(std::move(out));
}

Value global_dict(const CallArgs& a) {
  Dict d;
  if (!a.pos.empty()) {
    if (!a.pos[0].is_mapping()) fail("dict() takes a mapping, got '%s'", a.pos[0].type_name().c_str());
    d = a.pos[0].dict_ref();
  }
  for (const auto& kw : a.kw) d.set(kw.first, kw.second);
  return Value::dict(std::move(d));
}

Value global_namespace(const CallArgs& a) {
  Dict d;
  if (!a.pos.empty()) {
    if (!a.pos[0].is_mapping()) fail("namespace() takes a mapping, got '%s'", a.pos[0].type_name().c_str());
    d = a.pos[0].dict_ref();
  }
  for (const auto& kw : a.kw) {
    if (!kw.first.empty() && kw.first[0] == '_') fail("namespace attributes cannot start with '_'");
    d.set(kw.first, kw.second);
  }
  return Value::ns(std::move(d));
}

}  // namespace

struct Template::Impl {
  Body body;
};

Template::Template(const std::string& source, std::string name) : impl_(std::make_unique<Impl>()), name_(std::move(name)) {
  impl_->body = parse(lex(source, name_), name_);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Dict& vars, const RenderOptions& opt) const {
  Interp in(name_, opt);
  std::unordered_map<std::string, Value> globals;
  globals["range"] = Value::function("range", global_range);
  globals["dict"] = Value::function("dict", global_dict);
  globals["namespace"] = Value::function("namespace", global_namespace);
  globals["raise_exception"] = Value::function("raise_exception", [](const CallArgs&) { return Value(); });
  globals["strftime_now"] = Value::function("strftime_now", [&opt](const CallArgs& a) {
    const Value* f = a.get(0, "format");
    if (f == nullptr || !f->is_string()) fail("strftime_now() takes a format string");
    const std::time_t t = opt.now != 0 ? opt.now : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, f->str_ref().c_str(), &tm);
    return Value(std::string(buf, n));
  });
  in.push(std::move(globals));
  std::unordered_map<std::string, Value> top;
  for (const auto& kv : vars.items) top[kv.first] = kv.second;
  in.push(std::move(top));
  std::string out;
  try {
    in.exec(impl_->body, &out);
  } catch (const RaisedError& r) {
    fail("%s: %s", name_.c_str(), r.message.c_str());
  }
  return out;
}

}  // namespace kvtrim::jinja
