// Attribute, item and slice access on Jinja values, and the str / dict methods templates call
// (message.content.strip(), d.items(), ...), as Python and jinja2's getattr / getitem do them;
// the helpers the builtins share (builtins_util.h).
#include <algorithm>
#include <cctype>
#include <functional>

#include "core/error.h"
#include "model/jinja/builtins.h"
#include "model/jinja/builtins_util.h"

namespace kvtrim::jinja {

namespace detail {

void require_defined(const Value& v) {
  if (v.is_undefined()) fail("'%s' is undefined", v.hint().c_str());
}

Value arg(const CallArgs& a, size_t i, const char* name, const Value& def) {
  const Value* v = a.get(i, name);
  return v ? *v : def;
}

const Value* kwarg(const CallArgs& a, const char* name) {
  for (const auto& kv : a.kw)
    if (kv.first == name) return &kv.second;
  return nullptr;
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

size_t length_of(const Value& v) {
  if (v.is_string()) return utf8_chars(v.str_ref()).size();
  if (v.is_sequence()) return v.items().size();
  if (v.kind() == Value::Kind::kDict) return v.dict_ref().items.size();
  if (v.is_undefined()) return 0;
  fail("object of type '%s' has no len()", v.type_name().c_str());
}

}  // namespace detail

namespace {

using namespace detail;

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

}  // namespace kvtrim::jinja
