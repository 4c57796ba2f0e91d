// Jinja's built-in filters and tests, str / dict methods, tojson (see builtins.h). Each follows
// the Python function jinja2 (3.1) runs: jinja2.filters.do_<name>, jinja2.tests.test_<name>,
// Python's str / dict methods, and transformers' json.dumps-based tojson.
#include "model/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace kvtrim::jinja {

namespace {

void require_defined(const Value& v) {
  if (v.is_undefined()) fail("'%s' is undefined", v.hint().c_str());
}

// The argument at position i or named `name`, else `def` (a copy: values share their data).
Value arg(const CallArgs& a, size_t i, const char* name, const Value& def) {
  const Value* v = a.get(i, name);
  return v ? *v : def;
}

const std::string& need_string(const Value& v, const char* what) {
  require_defined(v);
  if (!v.is_string()) fail("%s expects a string, got '%s'", what, v.type_name().c_str());
  return v.str_ref();
}

int64_t need_int(const Value& v, const char* what) {
  if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool)
    fail("%s expects an integer, got '%s'", what, v.type_name().c_str());
  return v.as_int();
}

std::string ascii_map(const std::string& s, int (*f)(int)) {
  std::string r = s;
  for (char& c : r)
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(f(static_cast<unsigned char>(c)));
  return r;
}

std::string title_case(const std::string& s) {  // str.title(): a letter after a non-letter is upper
  std::string r = s;
  bool prev_alpha = false;
  for (char& c : r) {
    const auto u = static_cast<unsigned char>(c);
    const bool alpha = std::isalpha(u) != 0 || u >= 0x80;
    if (u < 0x80 && std::isalpha(u)) c = static_cast<char>(prev_alpha ? std::tolower(u) : std::toupper(u));
    prev_alpha = alpha;
  }
  return r;
}

std::string capitalize(const std::string& s) {
  std::string r = ascii_map(s, [](int c) { return std::tolower(c); });
  if (!r.empty() && static_cast<unsigned char>(r[0]) < 0x80) r[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(r[0])));
  return r;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {  // Python inserts `to` between code points (and at both ends)
    std::string r;
    int64_t n = 0;
    for (const auto& ch : utf8_chars(s)) {
      if (count < 0 || n < count) {
        r += to;
        ++n;
      }
      r += ch;
    }
    if (count < 0 || n < count) r += to;
    return r;
  }
  std::string r;
  size_t at = 0;
  int64_t n = 0;
  for (size_t f; (count < 0 || n < count) && (f = s.find(from, at)) != std::string::npos; ++n) {
    r += s.substr(at, f - at) + to;
    at = f + from.size();
  }
  return r + s.substr(at);
}

ValueList py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  ValueList out;
  if (sep.is_none() || sep.is_undefined()) {  // runs of whitespace, no empty strings
    const auto chars = utf8_chars(s);
    size_t i = 0;
    while (true) {
      while (i < chars.size() && is_python_space(chars[i])) ++i;
      if (i == chars.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {  // the rest as it is
        std::string rest;
        for (size_t k = i; k < chars.size(); ++k) rest += chars[k];
        out.emplace_back(std::move(rest));
        break;
      }
      std::string w;
      while (i < chars.size() && !is_python_space(chars[i])) w += chars[i++];
      out.emplace_back(std::move(w));
    }
    return out;
  }
  const std::string& d = need_string(sep, "split()");
  if (d.empty()) fail("split(): empty separator");
  size_t at = 0;
  for (size_t f; (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) && (f = s.find(d, at)) != std::string::npos;) {
    out.emplace_back(s.substr(at, f - at));
    at = f + d.size();
  }
  out.emplace_back(s.substr(at));
  return out;
}

bool prefix_match(const std::string& s, const Value& what, bool suffix) {
  auto one = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return suffix ? s.compare(s.size() - p.size(), p.size(), p) == 0 : s.compare(0, p.size(), p) == 0;
  };
  if (what.is_sequence()) {
    for (const Value& v : what.items())
      if (one(need_string(v, suffix ? "endswith()" : "startswith()"))) return true;
    return false;
  }
  return one(need_string(what, suffix ? "endswith()" : "startswith()"));
}

size_t length_of(const Value& v) {
  if (v.is_string()) return utf8_chars(v.str_ref()).size();
  if (v.is_sequence()) return v.items().size();
  if (v.kind() == Value::Kind::kDict) return v.dict_ref().items.size();
  if (v.is_undefined()) return 0;
  fail("object of type '%s' has no len()", v.type_name().c_str());
}

Value bound(const std::string& name, std::function<Value(const CallArgs&)> fn) {
  return Value::function(name, std::move(fn));
}

Value string_method(const Value& obj, const std::string& m) {
  const std::string s = obj.str_ref();
  if (m == "strip" || m == "lstrip" || m == "rstrip")
    return bound(m, [s, m](const CallArgs& a) {
      return Value(py_strip(s, arg(a, 0, "chars", Value::none()), m != "rstrip", m != "lstrip"));
    });
  if (m == "split")
    return bound(m, [s](const CallArgs& a) {
      return Value::list(py_split(s, arg(a, 0, "sep", Value::none()), need_int(arg(a, 1, "maxsplit", Value(-1)), "split()")));
    });
  if (m == "startswith" || m == "endswith")
    return bound(m, [s, m](const CallArgs& a) {
      return Value(prefix_match(s, arg(a, 0, nullptr, Value::undefined("prefix")), m == "endswith"));
    });
  if (m == "upper") return bound(m, [s](const CallArgs&) { return Value(ascii_map(s, [](int c) { return std::toupper(c); })); });
  if (m == "lower") return bound(m, [s](const CallArgs&) { return Value(ascii_map(s, [](int c) { return std::tolower(c); })); });
  if (m == "title") return bound(m, [s](const CallArgs&) { return Value(title_case(s)); });
  if (m == "capitalize") return bound(m, [s](const CallArgs&) { return Value(capitalize(s)); });
  if (m == "replace")
    return bound(m, [s](const CallArgs& a) {
      return Value(replace_all(s, need_string(arg(a, 0, "old", Value()), "replace()"), need_string(arg(a, 1, "new", Value()), "replace()"),
                               need_int(arg(a, 2, "count", Value(-1)), "replace()")));
    });
  if (m == "find" || m == "rfind" || m == "count" || m == "index")
    return bound(m, [s, m](const CallArgs& a) {
      const std::string& sub = need_string(arg(a, 0, nullptr, Value()), m.c_str());
      if (m == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(utf8_chars(s).size() + 1));
        int64_t n = 0;
        for (size_t f = s.find(sub); f != std::string::npos; f = s.find(sub, f + sub.size())) ++n;
        return Value(n);
      }
      const size_t f = m == "rfind" ? s.rfind(sub) : s.find(sub);
      if (f == std::string::npos) {
        if (m == "index") fail("substring not found");
        return Value(-1);
      }
      return Value(static_cast<int64_t>(utf8_chars(s.substr(0, f)).size()));
    });
  if (m == "join")
    return bound(m, [s](const CallArgs& a) {
      std::string r;
      const ValueList items = arg(a, 0, nullptr, Value()).iterate();
      for (size_t i = 0; i < items.size(); ++i) r += (i ? s : "") + need_string(items[i], "join()");
      return Value(std::move(r));
    });
  if (m == "splitlines")
    return bound(m, [s](const CallArgs&) {
      ValueList out;
      size_t at = 0;
      while (at < s.size()) {
        size_t e = s.find('\n', at);
        if (e == std::string::npos) e = s.size();
        out.emplace_back(s.substr(at, e - at));
        at = e + 1;
      }
      return Value::list(std::move(out));
    });
  if (m == "removeprefix" || m == "removesuffix")
    return bound(m, [s, m](const CallArgs& a) {
      const std::string& p = need_string(arg(a, 0, nullptr, Value()), m.c_str());
      if (m == "removeprefix") return Value(s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s);
      if (p.size() <= s.size() && s.compare(s.size() - p.size(), p.size(), p) == 0) return Value(s.substr(0, s.size() - p.size()));
      return Value(s);
    });
  if (m == "isspace" || m == "isdigit" || m == "isalpha" || m == "isalnum" || m == "isupper" || m == "islower")
    return bound(m, [s, m](const CallArgs&) {
      if (s.empty()) return Value(false);
      bool ok = true, cased = false;
      for (const auto& ch : utf8_chars(s)) {
        const auto c = static_cast<unsigned char>(ch[0]);
        if (m == "isspace") ok = ok && is_python_space(ch);
        else if (m == "isdigit") ok = ok && ch.size() == 1 && std::isdigit(c);
        else if (m == "isalpha") ok = ok && ch.size() == 1 && std::isalpha(c);
        else if (m == "isalnum") ok = ok && ch.size() == 1 && std::isalnum(c);
        else if (m == "isupper") { ok = ok && !(ch.size() == 1 && std::islower(c)); cased = cased || (ch.size() == 1 && std::isupper(c)); }
        else { ok = ok && !(ch.size() == 1 && std::isupper(c)); cased = cased || (ch.size() == 1 && std::islower(c)); }
      }
      return Value(ok && (m == "isupper" || m == "islower" ? cased : true));
    });
  return Value::undefined("str." + m);
}

Value dict_method(const Value& obj, const std::string& m) {
  const Dict d = obj.dict_ref();
  if (m == "items")
    return bound(m, [d](const CallArgs&) {
      ValueList out;
      for (const auto& kv : d.items) out.push_back(Value::tuple({Value(kv.first), kv.second}));
      return Value::list(std::move(out));
    });
  if (m == "keys")
    return bound(m, [d](const CallArgs&) {
      ValueList out;
      for (const auto& kv : d.items) out.emplace_back(kv.first);
      return Value::list(std::move(out));
    });
  if (m == "values")
    return bound(m, [d](const CallArgs&) {
      ValueList out;
      for (const auto& kv : d.items) out.push_back(kv.second);
      return Value::list(std::move(out));
    });
  if (m == "get")
    return bound(m, [d](const CallArgs& a) {
      const Value k = arg(a, 0, nullptr, Value());
      const Value* v = k.is_string() ? d.find(k.str_ref()) : nullptr;
      return v ? *v : arg(a, 1, nullptr, Value::none());
    });
  return Value::undefined("dict." + m);
}

// ------------------------------------------------------------------ json

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

ValueList filter_by_test(const Value& seq, const CallArgs& a, size_t first, bool by_attr, bool keep) {
  ValueList out;
  std::string attr;
  if (by_attr) attr = need_string(arg(a, 0, nullptr, Value()), "selectattr()");
  const size_t ti = by_attr ? 1 : 0;
  const Value* test = a.pos.size() > ti ? &a.pos[ti] : nullptr;
  CallArgs targs;
  for (size_t k = ti + 1; k < a.pos.size(); ++k) targs.pos.push_back(a.pos[k]);
  (void)first;
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

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto cps = utf8_chars(s);
  std::vector<std::string> set;
  const bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) set = utf8_chars(need_string(chars, "strip()"));
  auto strip_it = [&](const std::string& c) {
    return ws ? is_python_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  std::string r;
  for (size_t i = b; i < e; ++i) r += cps[i];
  return r;
}

std::string dump_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys) {
  std::string out;
  json_dump(v, indent, 0, item_sep, key_sep, sort_keys, &out);
  return out;
}

Value get_attr(const Value& obj, const std::string& name) {
  require_defined(obj);
  if (obj.kind() == Value::Kind::kNamespace) {
    const Value* v = obj.dict_ref().find(name);
    return v ? *v : Value::undefined(name);
  }
  if (obj.kind() == Value::Kind::kDict) {
    const Value m = dict_method(obj, name);  // jinja2 tries the attribute before the key
    if (!m.is_undefined()) return m;
    const Value* v = obj.dict_ref().find(name);
    return v ? *v : Value::undefined(name);
  }
  if (obj.is_string()) return string_method(obj, name);
  return Value::undefined(name);
}

Value get_item(const Value& obj, const Value& key) {
  require_defined(obj);
  if (obj.is_mapping()) {
    if (!key.is_string()) return Value::undefined(key.repr());
    const Value* v = obj.dict_ref().find(key.str_ref());
    if (v) return *v;
    return obj.kind() == Value::Kind::kDict ? dict_method(obj, key.str_ref()) : Value::undefined(key.str_ref());
  }
  if (obj.is_sequence() || obj.is_string()) {
    if (key.is_string()) return get_attr(obj, key.str_ref());
    if (key.kind() != Value::Kind::kInt && key.kind() != Value::Kind::kBool) return Value::undefined(key.repr());
    int64_t i = key.as_int();
    if (obj.is_string()) {
      const auto cps = utf8_chars(obj.str_ref());
      const auto n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      return i >= 0 && i < n ? Value(cps[static_cast<size_t>(i)]) : Value::undefined("string index");
    }
    const auto n = static_cast<int64_t>(obj.items().size());
    if (i < 0) i += n;
    return i >= 0 && i < n ? obj.items()[static_cast<size_t>(i)] : Value::undefined("list index " + key.repr());
  }
  return Value::undefined(key.to_str());
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  require_defined(obj);
  std::vector<std::string> cps;
  if (obj.is_string()) cps = utf8_chars(obj.str_ref());
  else if (!obj.is_sequence()) fail("'%s' object is not subscriptable", obj.type_name().c_str());
  const auto n = static_cast<int64_t>(obj.is_string() ? cps.size() : obj.items().size());
  auto given = [](const Value& v) { return !v.is_none() && !v.is_undefined(); };
  const int64_t st = given(step) ? need_int(step, "slice step") : 1;
  if (st == 0) fail("slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, int64_t def) {
    if (!given(v)) return def;
    int64_t i = need_int(v, "slice index");
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t b = adjust(start, st < 0 ? n - 1 : 0);
  const int64_t e = adjust(stop, st < 0 ? -1 : n);
  std::string s;
  ValueList l;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (obj.is_string()) s += cps[static_cast<size_t>(i)];
    else l.push_back(obj.items()[static_cast<size_t>(i)]);
  }
  if (obj.is_string()) return Value(std::move(s));
  return obj.kind() == Value::Kind::kList ? Value::list(std::move(l)) : Value::tuple(std::move(l));
}

bool is_filter(const std::string& name) {
  static const char* const kNames[] = {
      "default", "d", "safe", "string", "trim", "length", "count", "list", "first", "last", "join", "upper",
      "lower", "capitalize", "title", "replace", "int", "float", "abs", "round", "tojson", "items", "dictsort",
      "selectattr", "rejectattr", "select", "reject", "map", "unique", "sort", "reverse", "sum", "min", "max",
      "indent", "escape", "e", "forceescape", "wordcount", "attr"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

bool is_test(const std::string& name) {
  static const char* const kNames[] = {
      "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number", "string",
      "mapping", "iterable", "sequence", "callable", "escaped", "odd", "even", "divisibleby", "eq", "equalto",
      "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "sameas",
      "in", "lower", "upper"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& a) {
  const Value none = Value::none();
  if (name == "default" || name == "d") {
    const bool boolean = arg(a, 1, "boolean", Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return arg(a, 0, "default_value", Value(""));
    return v;
  }
  if (name == "safe") return v;
  if (name == "string") return Value(v.to_str());
  require_defined(v);
  if (name == "trim") return Value(py_strip(need_string(v, "trim"), arg(a, 0, "chars", none), true, true));
  if (name == "length" || name == "count") return Value(static_cast<int64_t>(length_of(v)));
  if (name == "list") return Value::list(v.iterate());
  if (name == "first" || name == "last") {
    const ValueList items = v.iterate();
    if (items.empty()) return Value::undefined(name + " of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const Value sep = arg(a, 0, "d", Value(""));
    const Value attr = arg(a, 1, "attribute", none);
    std::string r;
    const ValueList items = v.iterate();
    for (size_t i = 0; i < items.size(); ++i)
      r += (i ? sep.to_str() : "") + (attr.is_string() ? get_attr(items[i], attr.str_ref()) : items[i]).to_str();
    return Value(std::move(r));
  }
  if (name == "upper") return Value(ascii_map(need_string(v, "upper"), [](int c) { return std::toupper(c); }));
  if (name == "lower") return Value(ascii_map(need_string(v, "lower"), [](int c) { return std::tolower(c); }));
  if (name == "capitalize") return Value(capitalize(need_string(v, "capitalize")));
  if (name == "title") return Value(title_case(need_string(v, "title")));
  if (name == "replace")
    return Value(replace_all(v.to_str(), need_string(arg(a, 0, "old", Value()), "replace"),
                             need_string(arg(a, 1, "new", Value()), "replace"),
                             arg(a, 2, "count", none).is_none() ? -1 : need_int(arg(a, 2, "count", none), "replace")));
  if (name == "int" || name == "float") {
    const Value def = arg(a, 0, "default", name == "int" ? Value(0) : Value(0.0));
    if (v.is_number()) return name == "int" ? Value(v.as_int()) : Value(v.as_double());
    if (v.is_string()) {
      const std::string s = py_strip(v.str_ref(), none, true, true);
      char* end = nullptr;
      if (name == "int") {
        const long long r = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end && *end == '\0') return Value(static_cast<int64_t>(r));
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value(static_cast<int64_t>(d));
      } else {
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value(d);
      }
    }
    return def;
  }
  if (name == "abs") {
    if (!v.is_number()) fail("abs expects a number, got '%s'", v.type_name().c_str());
    return v.kind() == Value::Kind::kFloat ? Value(std::fabs(v.as_double())) : Value(v.as_int() < 0 ? checked_mul(v.as_int(), -1) : v.as_int());
  }
  if (name == "round") {
    const int64_t prec = need_int(arg(a, 0, "precision", Value(0)), "round");
    const std::string method = arg(a, 1, "method", Value("common")).to_str();
    const double p = std::pow(10.0, static_cast<double>(prec));
    const double x = v.as_double() * p;
    const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
    return Value(r / p);
  }
  if (name == "tojson") {
    const Value ind = arg(a, 0, "indent", none);
    const int indent = ind.is_none() ? -1 : static_cast<int>(need_int(ind, "tojson indent"));
    const Value seps = arg(a, 2, "separators", none);
    std::string isep = indent >= 0 ? "," : ", ", ksep = ": ";
    if (seps.is_sequence() && seps.items().size() == 2) {
      isep = need_string(seps.items()[0], "tojson separators");
      ksep = need_string(seps.items()[1], "tojson separators");
    }
    return Value(dump_json(v, indent, isep, ksep, arg(a, 3, "sort_keys", Value(false)).truthy()));
  }
  if (name == "items") {
    if (!v.is_mapping()) fail("items expects a mapping, got '%s'", v.type_name().c_str());
    return get_attr(Value::dict(v.dict_ref()), "items").fn()(CallArgs{});
  }
  if (name == "dictsort") {
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
  if (name == "selectattr" || name == "rejectattr")
    return Value::list(filter_by_test(v, a, 0, true, name == "selectattr"));
  if (name == "select" || name == "reject") return Value::list(filter_by_test(v, a, 0, false, name == "select"));
  if (name == "map") {
    ValueList out;
    const Value* attr = a.get(99, "attribute");
    for (const Value& item : v.iterate()) {
      if (attr) {
        Value r = get_attr(item, need_string(*attr, "map attribute"));
        if (r.is_undefined()) {
          const Value* def = a.get(99, "default");
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
  if (name == "unique") {
    ValueList out;
    for (const Value& item : v.iterate()) {
      bool seen = false;
      for (const Value& o : out) seen = seen || equals(o, item);
      if (!seen) out.push_back(item);
    }
    return Value::list(std::move(out));
  }
  if (name == "sort")
    return sorted(v, arg(a, 0, "reverse", Value(false)).truthy(), arg(a, 2, "attribute", none),
                  arg(a, 1, "case_sensitive", Value(false)).truthy());
  if (name == "reverse") {
    if (v.is_string()) {
      auto cps = utf8_chars(v.str_ref());
      std::string r;
      for (size_t i = cps.size(); i-- > 0;) r += cps[i];
      return Value(std::move(r));
    }
    ValueList items = v.iterate();
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "sum") {
    const Value attr = arg(a, 0, "attribute", none);
    Value total = arg(a, 1, "start", Value(0));
    for (const Value& item : v.iterate()) {
      const Value x = attr.is_string() ? get_attr(item, attr.str_ref()) : item;
      if (!x.is_number() || !total.is_number()) fail("sum expects numbers, got '%s'", x.type_name().c_str());
      total = (x.kind() == Value::Kind::kFloat || total.kind() == Value::Kind::kFloat) ? Value(total.as_double() + x.as_double())
                                                                                         : Value(checked_add(total.as_int(), x.as_int()));
    }
    return total;
  }
  if (name == "min" || name == "max") {
    const ValueList items = v.iterate();
    if (items.empty()) return Value::undefined("min/max of an empty sequence");
    Value best = items[0];
    for (const Value& x : items)
      if (name == "min" ? less(x, best) : less(best, x)) best = x;
    return best;
  }
  if (name == "indent") {
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
      if ((line0 && first) || (!line0 && (blank || !py_strip(line, none, true, true).empty()))) r += pad;
      r += line;
      if (e == std::string::npos) break;
      r += '\n';
      at = e + 1;
      line0 = false;
    }
    return Value(std::move(r));
  }
  if (name == "escape" || name == "e" || name == "forceescape") {
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
  if (name == "wordcount") return Value(static_cast<int64_t>(py_split(v.to_str(), none, -1).size()));
  if (name == "attr") return get_attr(v, need_string(arg(a, 0, "name", Value()), "attr"));
  fail("unknown filter '%s'", name.c_str());
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& a) {
  const Value none = Value::none();
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "true") return v.kind() == K::kBool && v.as_bool();
  if (name == "false") return v.kind() == K::kBool && !v.as_bool();
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == K::kDict;
  if (name == "iterable") return v.is_undefined() || v.is_sequence() || v.is_string() || v.kind() == K::kDict;
  if (name == "sequence") return v.is_undefined() || v.is_sequence() || v.is_string() || v.kind() == K::kDict;
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "odd" || name == "even") {
    require_defined(v);
    const int64_t i = need_int(v, name.c_str());
    return name == "odd" ? (i % 2 != 0) : (i % 2 == 0);
  }
  if (name == "divisibleby") {
    const int64_t d = need_int(arg(a, 0, "num", Value()), "divisibleby");
    if (d == 0) fail("divisibleby 0");
    return need_int(v, "divisibleby") % d == 0;
  }
  const Value other = arg(a, 0, nullptr, Value::undefined("test argument"));
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, other);
  if (name == "ne" || name == "!=") return !equals(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, other);
  if (name == "le" || name == "<=") return !less(other, v);
  if (name == "gt" || name == "greaterthan" || name == ">") return less(other, v);
  if (name == "ge" || name == ">=") return !less(v, other);
  if (name == "sameas") {
    if (v.is_mapping() || v.is_sequence()) return v.kind() == other.kind() && equals(v, other) && v.is_mapping() &&
                                                  &v.dict_ref() == &other.dict_ref();
    return v.kind() == other.kind() && equals(v, other);
  }
  if (name == "in") {
    if (other.is_string()) return v.is_string() && other.str_ref().find(v.str_ref()) != std::string::npos;
    if (other.is_mapping()) return v.is_string() && other.dict_ref().find(v.str_ref()) != nullptr;
    for (const Value& x : other.iterate())
      if (equals(v, x)) return true;
    return false;
  }
  if (name == "lower" || name == "upper") {
    const std::string& s = need_string(v, name.c_str());
    return s == ascii_map(s, name == "lower" ? [](int c) { return std::tolower(c); } : [](int c) { return std::toupper(c); });
  }
  (void)none;
  fail("unknown test '%s'", name.c_str());
}

}  // namespace kvtrim::jinja
