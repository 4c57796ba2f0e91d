// Jinja values with Python semantics (see value.h).
#include "model/jinja/value.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace kvtrim::jinja {

const Value* Dict::find(const std::string& key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& kv : items)
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t i, const char* name) const {
  if (name != nullptr)
    for (const auto& kv : kw)
      if (kv.first == name) return &kv.second;
  return i < pos.size() ? &pos[i] : nullptr;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value::Value(bool b) : kind_(Kind::kBool), b_(b), i_(b ? 1 : 0) {}
Value::Value(int v) : kind_(Kind::kInt), i_(v) {}
Value::Value(int64_t v) : kind_(Kind::kInt), i_(v) {}
Value::Value(double v) : kind_(Kind::kFloat), f_(v) {}
Value::Value(const char* s) : kind_(Kind::kString), s_(std::make_shared<const std::string>(s)) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}

Value Value::list(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}

Value Value::dict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::ns(Dict d) {
  Value v = dict(std::move(d));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::function(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<const NativeFn>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), from_json(it.value()));
      return dict(std::move(d));
    }
    default: return undefined();
  }
}

int64_t Value::as_int() const {
  if (kind_ == Kind::kFloat) {
    if (!(f_ > -9.2e18 && f_ < 9.2e18)) fail("cannot convert float %g to a 64-bit integer", f_);
    return static_cast<int64_t>(f_);
  }
  return i_;
}

double Value::as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0.0;
    case Kind::kString: return !s_->empty();
    case Kind::kList:
    case Kind::kTuple: return !list_->empty();
    case Kind::kDict: return !dict_->items.empty();
    case Kind::kNamespace:
    case Kind::kFunction: return true;
  }
  return false;
}

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail("integer overflow (kvtrim's template integers are 64-bit)");
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail("integer overflow (kvtrim's template integers are 64-bit)");
  return r;
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // The shortest %.Ne that reads back as v: its digits and decimal exponent.
  char buf[64];
  for (int p = 0; p < 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*e", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s(buf);
  const size_t e = s.find('e');
  const int exp10 = std::atoi(s.c_str() + e + 1);
  std::string mant = s.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp10 >= 16 || exp10 < -4) {  // Python's repr switches to exponent notation here
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out + eb;
  }
  if (exp10 < 0) {
    out += "0.";
    out.append(static_cast<size_t>(-exp10 - 1), '0');
    return out + digits;
  }
  const size_t int_len = static_cast<size_t>(exp10) + 1;
  if (digits.size() <= int_len) return out + digits + std::string(int_len - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

bool is_python_space(const std::string& ch) {
  if (ch.size() == 1) {
    const unsigned char c = static_cast<unsigned char>(ch[0]);
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
  }
  static const char* const kSpaces[] = {"\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002",
                                        "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008",
                                        "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f",
                                        "\u3000"};
  for (const char* sp : kSpaces)
    if (ch == sp) return true;
  return false;
}

namespace {

// Python's repr of a str: single quotes unless the text has ' and no "; control characters
// escaped (other non-printable code points, which Python also escapes, are kept: templates
// print reprs of ASCII data).
std::string repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == q || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += ch;
    }
  }
  return out + q;
}

}  // namespace

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kString: return repr_string(*s_);
    case Kind::kList:
    case Kind::kTuple: {
      std::string out = kind_ == Kind::kList ? "[" : "(";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      if (kind_ == Kind::kTuple && list_->size() == 1) out += ",";
      return out + (kind_ == Kind::kList ? "]" : ")");
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->items.size(); ++i)
        out += (i ? ", " : "") + repr_string(dict_->items[i].first) + ": " + dict_->items[i].second.repr();
      return out + "}";
    }
    case Kind::kNamespace: {
      std::string out = "<Namespace {";
      for (size_t i = 0; i < dict_->items.size(); ++i)
        out += (i ? ", " : "") + repr_string(dict_->items[i].first) + ": " + dict_->items[i].second.repr();
      return out + "}>";
    }
    default: return to_str();
  }
}

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return python_float_repr(f_);
    case Kind::kString: return *s_;
    case Kind::kFunction: return "<function " + *s_ + ">";
    default: return repr();
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kFunction: return "function";
  }
  return "?";
}

ValueList Value::iterate() const {
  switch (kind_) {
    case Kind::kUndefined: return {};
    case Kind::kList:
    case Kind::kTuple: return *list_;
    case Kind::kDict: {
      ValueList keys;
      for (const auto& kv : dict_->items) keys.emplace_back(kv.first);
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      for (auto& c : utf8_chars(*s_)) chars.emplace_back(std::move(c));
      return chars;
    }
    default: fail("'%s' object is not iterable", type_name().c_str());
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.is_sequence() && b.is_sequence()) {
    if (a.kind() != b.kind() || a.items().size() != b.items().size()) return false;
    for (size_t i = 0; i < a.items().size(); ++i)
      if (!equals(a.items()[i], b.items()[i])) return false;
    return true;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.str_ref() == b.str_ref();
    case Value::Kind::kDict: {
      const Dict& x = a.dict_ref();
      const Dict& y = b.dict_ref();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& kv : x.items) {
        const Value* o = y.find(kv.first);
        if (o == nullptr || !equals(kv.second, *o)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return &a.dict_ref() == &b.dict_ref();  // identity
    case Value::Kind::kFunction: return &a.fn() == &b.fn();
    default: return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str_ref() < b.str_ref();  // UTF-8 byte order = code point order
  if (a.is_sequence() && b.is_sequence() && a.kind() == b.kind()) {
    const ValueList& x = a.items();
    const ValueList& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less(x[i], y[i])) return true;
      if (less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '%s' and '%s'", a.type_name().c_str(), b.type_name().c_str());
}

}  // namespace kvtrim::jinja
