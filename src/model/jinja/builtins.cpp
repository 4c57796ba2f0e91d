// Jinja's built-in filters and tests, and tojson (see builtins.h). Each follows the Python
// function jinja2 (3.1) runs: jinja2.filters.do_<name>, jinja2.tests.test_<name>, and
// transformers' json.dumps-based tojson. Attribute / item access and str / dict methods:
// access.cpp.
#include "model/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "core/error.h"
#include "model/jinja/builtins_util.h"

namespace kvtrim::jinja {

using namespace detail;

namespace {

void json_string(const std::string& s, std::string* out) {
  *out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          *out += b;
        } else {
          *out += ch;
        }
    }
  }
  *out += '"';
}

void json_dump(const Value& v, int indent, int level, const std::string& isep, const std::string& ksep, bool sort,
               std::string* out) {
  auto newline = [&](int lv) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * lv), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone: *out += "null"; return;
    case Value::Kind::kBool: *out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: *out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      const double f = v.as_double();
      *out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f < 0 ? "-Infinity" : "Infinity") : python_float_repr(f);
      return;
    }
    case Value::Kind::kString: json_string(v.str_ref(), out); return;
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (v.items().empty()) {
        *out += "[]";
        return;
      }
      *out += "[";
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) *out += isep;
        newline(level + 1);
        json_dump(v.items()[i], indent, level + 1, isep, ksep, sort, out);
      }
      newline(level);
      *out += "]";
      return;
    }
    case Value::Kind::kDict: {
      auto items = v.dict_ref().items;
      if (items.empty()) {
        *out += "{}";
        return;
      }
      if (sort) std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      *out += "{";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += isep;
        newline(level + 1);
        json_string(items[i].first, out);
        *out += ksep;
        json_dump(items[i].second, indent, level + 1, isep, ksep, sort, out);
      }
      newline(level);
      *out += "}";
      return;
    }
    default: fail("Object of type %s is not JSON serializable", v.type_name().c_str());
  }
}

// ------------------------------------------------------------------ filters

ValueList filter_by_test(const Value& seq, const CallArgs& a, bool by_attr, bool keep) {
  ValueList out;
  std::string attr;
  if (by_attr) attr = need_string(arg(a, 0, nullptr, Value()), "selectattr()");
  const size_t ti = by_attr ? 1 : 0;
  const Value* test = a.pos.size() > ti ? &a.pos[ti] : nullptr;
  CallArgs targs;
  for (size_t k = ti + 1; k < a.pos.size(); ++k) targs.pos.push_back(a.pos[k]);
  for (const Value& item : seq.iterate()) {
    const Value subject = by_attr ? get_attr(item, attr) : item;
    const bool r = test ? apply_test(need_string(*test, "select()"), subject, targs) : subject.truthy();
    if (r == keep) out.push_back(item);
  }
  return out;
}

Value sorted(const Value& seq, bool reverse, const Value& attribute, bool case_sensitive) {
  ValueList items = seq.iterate();
  auto key = [&](const Value& v) {
    Value k = attribute.is_string() ? get_attr(v, attribute.str_ref()) : v;
    if (!case_sensitive && k.is_string()) k = Value(ascii_map(k.str_ref(), [](int c) { return std::tolower(c); }));
    return k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? less(key(y), key(x)) : less(key(x), key(y));
  });
  return Value::list(std::move(items));
}

}  // namespace

std::string dump_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys) {
  std::string out;
  json_dump(v, indent, 0, item_sep, key_sep, sort_keys, &out);
  return out;
}

// ------------------------------------------------------------------ the tables
// One entry per filter / test: its names (jinja2's aliases share the function, which gets the
// name it was called by) and what it computes. is_filter / is_test and the parser read the
// same tables as apply_filter / apply_test.

namespace {

using FilterFn = Value (*)(const std::string& name, const Value& v, const CallArgs& a);
using TestFn = bool (*)(const std::string& name, const Value& v, const CallArgs& a);

struct Filter {
  FilterFn fn;
  bool defined;  // an undefined subject is an error (every filter but default, safe, string)
};

Value none_value() { return Value::none(); }

Value f_default(const std::string&, const Value& v, const CallArgs& a) {
  const bool boolean = arg(a, 1, "boolean", Value(false)).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return arg(a, 0, "default_value", Value(""));
  return v;
}
Value f_safe(const std::string&, const Value& v, const CallArgs&) { return v; }
Value f_string(const std::string&, const Value& v, const CallArgs&) { return Value(v.to_str()); }
Value f_trim(const std::string&, const Value& v, const CallArgs& a) {
  return Value(py_strip(need_string(v, "trim"), arg(a, 0, "chars", none_value()), true, true));
}
Value f_length(const std::string&, const Value& v, const CallArgs&) { return Value(static_cast<int64_t>(length_of(v))); }
Value f_list(const std::string&, const Value& v, const CallArgs&) { return Value::list(v.iterate()); }
Value f_first_last(const std::string& name, const Value& v, const CallArgs&) {
  const ValueList items = v.iterate();
  if (items.empty()) return Value::undefined(name + " of an empty sequence");
  return name == "first" ? items.front() : items.back();
}
Value f_join(const std::string&, const Value& v, const CallArgs& a) {
  const Value sep = arg(a, 0, "d", Value(""));
  const Value attr = arg(a, 1, "attribute", none_value());
  std::string r;
  const ValueList items = v.iterate();
  for (size_t i = 0; i < items.size(); ++i)
    r += (i ? sep.to_str() : "") + (attr.is_string() ? get_attr(items[i], attr.str_ref()) : items[i]).to_str();
  return Value(std::move(r));
}
Value f_upper(const std::string&, const Value& v, const CallArgs&) {
  return Value(ascii_map(need_string(v, "upper"), [](int c) { return std::toupper(c); }));
}
Value f_lower(const std::string&, const Value& v, const CallArgs&) {
  return Value(ascii_map(need_string(v, "lower"), [](int c) { return std::tolower(c); }));
}
Value f_capitalize(const std::string&, const Value& v, const CallArgs&) { return Value(capitalize(need_string(v, "capitalize"))); }
Value f_title(const std::string&, const Value& v, const CallArgs&) { return Value(title_case(need_string(v, "title"))); }
Value f_replace(const std::string&, const Value& v, const CallArgs& a) {
  const Value count = arg(a, 2, "count", none_value());
  return Value(replace_all(v.to_str(), need_string(arg(a, 0, "old", Value()), "replace"),
                           need_string(arg(a, 1, "new", Value()), "replace"),
                           count.is_none() ? -1 : need_int(count, "replace")));
}
Value f_int_float(const std::string& name, const Value& v, const CallArgs& a) {
  const bool to_int = name == "int";
  const Value def = arg(a, 0, "default", to_int ? Value(0) : Value(0.0));
  if (v.is_number()) return to_int ? Value(v.as_int()) : Value(v.as_double());
  if (v.is_string()) {
    const std::string s = py_strip(v.str_ref(), none_value(), true, true);
    char* end = nullptr;
    if (to_int) {
      const long long r = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end && *end == '\0') return Value(static_cast<int64_t>(r));
    }
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return to_int ? Value(static_cast<int64_t>(d)) : Value(d);
  }
  return def;
}
Value f_abs(const std::string&, const Value& v, const CallArgs&) {
  if (!v.is_number()) fail("abs expects a number, got '%s'", v.type_name().c_str());
  if (v.kind() == Value::Kind::kFloat) return Value(std::fabs(v.as_double()));
  return Value(v.as_int() < 0 ? checked_mul(v.as_int(), -1) : v.as_int());
}
Value f_round(const std::string&, const Value& v, const CallArgs& a) {
  const int64_t prec = need_int(arg(a, 0, "precision", Value(0)), "round");
  const std::string method = arg(a, 1, "method", Value("common")).to_str();
  const double p = std::pow(10.0, static_cast<double>(prec));
  const double x = v.as_double() * p;
  const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
  return Value(r / p);
}
Value f_tojson(const std::string&, const Value& v, const CallArgs& a) {
  const Value ind = arg(a, 0, "indent", none_value());
  const int indent = ind.is_none() ? -1 : static_cast<int>(need_int(ind, "tojson indent"));
  const Value seps = arg(a, 2, "separators", none_value());
  std::string isep = indent >= 0 ? "," : ", ", ksep = ": ";
  if (seps.is_sequence() && seps.items().size() == 2) {
    isep = need_string(seps.items()[0], "tojson separators");
    ksep = need_string(seps.items()[1], "tojson separators");
  }
  return Value(dump_json(v, indent, isep, ksep, arg(a, 3, "sort_keys", Value(false)).truthy()));
}
Value f_items(const std::string&, const Value& v, const CallArgs&) {
  if (!v.is_mapping()) fail("items expects a mapping, got '%s'", v.type_name().c_str());
  return get_attr(Value::dict(v.dict_ref()), "items").fn()(CallArgs{});
}
Value f_dictsort(const std::string&, const Value& v, const CallArgs& a) {
  if (v.kind() != Value::Kind::kDict) fail("dictsort expects a dict, got '%s'", v.type_name().c_str());
  const bool by_value = arg(a, 1, "by", Value("key")).to_str() == "value";
  ValueList pairs = get_attr(v, "items").fn()(CallArgs{}).items();
  const bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
  const bool rev = arg(a, 2, "reverse", Value(false)).truthy();
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    Value kx = x.items()[by_value ? 1 : 0], ky = y.items()[by_value ? 1 : 0];
    if (!cs && kx.is_string()) kx = Value(ascii_map(kx.str_ref(), [](int c) { return std::tolower(c); }));
    if (!cs && ky.is_string()) ky = Value(ascii_map(ky.str_ref(), [](int c) { return std::tolower(c); }));
    return rev ? less(ky, kx) : less(kx, ky);
  });
  return Value::list(std::move(pairs));
}
Value f_selectattr(const std::string& name, const Value& v, const CallArgs& a) {
  return Value::list(filter_by_test(v, a, true, name == "selectattr"));
}
Value f_select(const std::string& name, const Value& v, const CallArgs& a) {
  return Value::list(filter_by_test(v, a, false, name == "select"));
}
Value f_map(const std::string&, const Value& v, const CallArgs& a) {
  ValueList out;
  const Value* attr = kwarg(a, "attribute");
  for (const Value& item : v.iterate()) {
    if (attr) {
      Value r = get_attr(item, need_string(*attr, "map attribute"));
      if (r.is_undefined()) {
        const Value* def = kwarg(a, "default");
        if (def) r = *def;
      }
      out.push_back(r);
    } else {
      if (a.pos.empty()) fail("map needs a filter name or attribute=");
      CallArgs rest;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      rest.kw = a.kw;
      out.push_back(apply_filter(need_string(a.pos[0], "map"), item, rest));
    }
  }
  return Value::list(std::move(out));
}
Value f_unique(const std::string&, const Value& v, const CallArgs&) {
  ValueList out;
  for (const Value& item : v.iterate()) {
    bool seen = false;
    for (const Value& o : out) seen = seen || equals(o, item);
    if (!seen) out.push_back(item);
  }
  return Value::list(std::move(out));
}
Value f_sort(const std::string&, const Value& v, const CallArgs& a) {
  return sorted(v, arg(a, 0, "reverse", Value(false)).truthy(), arg(a, 2, "attribute", none_value()),
                arg(a, 1, "case_sensitive", Value(false)).truthy());
}
Value f_reverse(const std::string&, const Value& v, const CallArgs&) {
  if (v.is_string()) {
    const auto cps = utf8_chars(v.str_ref());
    std::string r;
    for (size_t i = cps.size(); i-- > 0;) r += cps[i];
    return Value(std::move(r));
  }
  ValueList items = v.iterate();
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}
Value f_sum(const std::string&, const Value& v, const CallArgs& a) {
  const Value attr = arg(a, 0, "attribute", none_value());
  Value total = arg(a, 1, "start", Value(0));
  for (const Value& item : v.iterate()) {
    const Value x = attr.is_string() ? get_attr(item, attr.str_ref()) : item;
    if (!x.is_number() || !total.is_number()) fail("sum expects numbers, got '%s'", x.type_name().c_str());
    const bool fl = x.kind() == Value::Kind::kFloat || total.kind() == Value::Kind::kFloat;
    total = fl ? Value(total.as_double() + x.as_double()) : Value(checked_add(total.as_int(), x.as_int()));
  }
  return total;
}
Value f_min_max(const std::string& name, const Value& v, const CallArgs&) {
  const ValueList items = v.iterate();
  if (items.empty()) return Value::undefined("min/max of an empty sequence");
  Value best = items[0];
  for (const Value& x : items)
    if (name == "min" ? less(x, best) : less(best, x)) best = x;
  return best;
}
Value f_indent(const std::string&, const Value& v, const CallArgs& a) {
  const Value w = arg(a, 0, "width", Value(4));
  const std::string pad = w.is_string() ? w.str_ref() : std::string(static_cast<size_t>(need_int(w, "indent")), ' ');
  const bool first = arg(a, 1, "first", Value(false)).truthy();
  const bool blank = arg(a, 2, "blank", Value(false)).truthy();
  const std::string s = v.to_str();
  std::string r;
  size_t at = 0;
  bool line0 = true;
  while (true) {
    const size_t e = s.find('\n', at);
    const std::string line = s.substr(at, e == std::string::npos ? std::string::npos : e - at);
    if ((line0 && first) || (!line0 && (blank || !py_strip(line, none_value(), true, true).empty()))) r += pad;
    r += line;
    if (e == std::string::npos) break;
    r += '\n';
    at = e + 1;
    line0 = false;
  }
  return Value(std::move(r));
}
Value f_escape(const std::string&, const Value& v, const CallArgs&) {
  std::string r;
  for (char c : v.to_str()) {
    switch (c) {
      case '&': r += "&amp;"; break;
      case '<': r += "&lt;"; break;
      case '>': r += "&gt;"; break;
      case '"': r += "&#34;"; break;
      case '\'': r += "&#39;"; break;
      default: r += c;
    }
  }
  return Value(std::move(r));
}
Value f_wordcount(const std::string&, const Value& v, const CallArgs&) {
  return Value(static_cast<int64_t>(py_split(v.to_str(), none_value(), -1).size()));
}
Value f_attr(const std::string&, const Value& v, const CallArgs& a) {
  return get_attr(v, need_string(arg(a, 0, "name", Value()), "attr"));
}

const std::unordered_map<std::string, Filter>& filters() {
  static const std::unordered_map<std::string, Filter> t = {
      {"default", {f_default, false}},  {"d", {f_default, false}},
      {"safe", {f_safe, false}},        {"string", {f_string, false}},
      {"trim", {f_trim, true}},         {"length", {f_length, true}},
      {"count", {f_length, true}},      {"list", {f_list, true}},
      {"first", {f_first_last, true}},  {"last", {f_first_last, true}},
      {"join", {f_join, true}},         {"upper", {f_upper, true}},
      {"lower", {f_lower, true}},       {"capitalize", {f_capitalize, true}},
      {"title", {f_title, true}},       {"replace", {f_replace, true}},
      {"int", {f_int_float, true}},     {"float", {f_int_float, true}},
      {"abs", {f_abs, true}},           {"round", {f_round, true}},
      {"tojson", {f_tojson, true}},     {"items", {f_items, true}},
      {"dictsort", {f_dictsort, true}}, {"selectattr", {f_selectattr, true}},
      {"rejectattr", {f_selectattr, true}}, {"select", {f_select, true}},
      {"reject", {f_select, true}},     {"map", {f_map, true}},
      {"unique", {f_unique, true}},     {"sort", {f_sort, true}},
      {"reverse", {f_reverse, true}},   {"sum", {f_sum, true}},
      {"min", {f_min_max, true}},       {"max", {f_min_max, true}},
      {"indent", {f_indent, true}},     {"escape", {f_escape, true}},
      {"e", {f_escape, true}},          {"forceescape", {f_escape, true}},
      {"wordcount", {f_wordcount, true}}, {"attr", {f_attr, true}},
  };
  return t;
}

// ------------------------------------------------------------------ tests

using K = Value::Kind;

// The comparison tests' other operand (jinja2's `x is eq y`).
Value other_of(const CallArgs& a) { return arg(a, 0, nullptr, Value::undefined("test argument")); }

bool t_odd_even(const std::string& name, const Value& v, const CallArgs&) {
  require_defined(v);
  const int64_t i = need_int(v, name.c_str());
  return name == "odd" ? (i % 2 != 0) : (i % 2 == 0);
}
bool t_divisibleby(const std::string&, const Value& v, const CallArgs& a) {
  const int64_t d = need_int(arg(a, 0, "num", Value()), "divisibleby");
  if (d == 0) fail("divisibleby 0");
  return need_int(v, "divisibleby") % d == 0;
}
bool t_sameas(const std::string&, const Value& v, const CallArgs& a) {
  const Value other = other_of(a);
  if (v.is_mapping() || v.is_sequence())
    return v.kind() == other.kind() && equals(v, other) && v.is_mapping() && &v.dict_ref() == &other.dict_ref();
  return v.kind() == other.kind() && equals(v, other);
}
bool t_in(const std::string&, const Value& v, const CallArgs& a) {
  const Value other = other_of(a);
  if (other.is_string()) return v.is_string() && other.str_ref().find(v.str_ref()) != std::string::npos;
  if (other.is_mapping()) return v.is_string() && other.dict_ref().find(v.str_ref()) != nullptr;
  for (const Value& x : other.iterate())
    if (equals(v, x)) return true;
  return false;
}
bool t_case(const std::string& name, const Value& v, const CallArgs&) {
  const std::string& s = need_string(v, name.c_str());
  return s == ascii_map(s, name == "lower" ? [](int c) { return std::tolower(c); } : [](int c) { return std::toupper(c); });
}
bool iterable(const Value& v) { return v.is_undefined() || v.is_sequence() || v.is_string() || v.kind() == K::kDict; }

const std::unordered_map<std::string, TestFn>& tests() {
  using S = const std::string&;
  using V = const Value&;
  using A = const CallArgs&;
  static const std::unordered_map<std::string, TestFn> t = {
      {"defined", [](S, V v, A) { return !v.is_undefined(); }},
      {"undefined", [](S, V v, A) { return v.is_undefined(); }},
      {"none", [](S, V v, A) { return v.is_none(); }},
      {"boolean", [](S, V v, A) { return v.kind() == K::kBool; }},
      {"true", [](S, V v, A) { return v.kind() == K::kBool && v.as_bool(); }},
      {"false", [](S, V v, A) { return v.kind() == K::kBool && !v.as_bool(); }},
      {"integer", [](S, V v, A) { return v.kind() == K::kInt; }},
      {"float", [](S, V v, A) { return v.kind() == K::kFloat; }},
      {"number", [](S, V v, A) { return v.is_number(); }},
      {"string", [](S, V v, A) { return v.is_string(); }},
      {"mapping", [](S, V v, A) { return v.kind() == K::kDict; }},
      {"iterable", [](S, V v, A) { return iterable(v); }},
      {"sequence", [](S, V v, A) { return iterable(v); }},
      {"callable", [](S, V v, A) { return v.is_callable(); }},
      {"escaped", [](S, V, A) { return false; }},
      {"odd", t_odd_even},
      {"even", t_odd_even},
      {"divisibleby", t_divisibleby},
      {"eq", [](S, V v, A a) { return equals(v, other_of(a)); }},
      {"equalto", [](S, V v, A a) { return equals(v, other_of(a)); }},
      {"==", [](S, V v, A a) { return equals(v, other_of(a)); }},
      {"ne", [](S, V v, A a) { return !equals(v, other_of(a)); }},
      {"!=", [](S, V v, A a) { return !equals(v, other_of(a)); }},
      {"lt", [](S, V v, A a) { return less(v, other_of(a)); }},
      {"lessthan", [](S, V v, A a) { return less(v, other_of(a)); }},
      {"<", [](S, V v, A a) { return less(v, other_of(a)); }},
      {"le", [](S, V v, A a) { return !less(other_of(a), v); }},
      {"<=", [](S, V v, A a) { return !less(other_of(a), v); }},
      {"gt", [](S, V v, A a) { return less(other_of(a), v); }},
      {"greaterthan", [](S, V v, A a) { return less(other_of(a), v); }},
      {">", [](S, V v, A a) { return less(other_of(a), v); }},
      {"ge", [](S, V v, A a) { return !less(v, other_of(a)); }},
      {">=", [](S, V v, A a) { return !less(v, other_of(a)); }},
      {"sameas", t_sameas},
      {"in", t_in},
      {"lower", t_case},
      {"upper", t_case},
  };
  return t;
}

}  // namespace

bool is_filter(const std::string& name) { return filters().count(name) != 0; }
bool is_test(const std::string& name) { return tests().count(name) != 0; }

Value apply_filter(const std::string& name, const Value& v, const CallArgs& a) {
  const auto it = filters().find(name);
  if (it == filters().end()) fail("unknown filter '%s'", name.c_str());
  if (it->second.defined) require_defined(v);
  return it->second.fn(name, v, a);
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& a) {
  const auto it = tests().find(name);
  if (it == tests().end()) fail("unknown test '%s'", name.c_str());
  return it->second(name, v, a);
}

}  // namespace kvtrim::jinja
