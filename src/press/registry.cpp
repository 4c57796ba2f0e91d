// The press registry, option parsing and the press-string parser (grammar in press.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "press/builtin_presses.h"
#include "press/press.h"

namespace kvtrim {

namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<PressInfo>& registry_storage() {
  static std::vector<PressInfo> r;
  return r;
}

std::once_flag g_builtins_once;

void ensure_builtins() {
  std::call_once(g_builtins_once, [] {
    for (PressInfo& info : builtin_press_infos()) register_press(std::move(info));
  });
}

std::string known_names() {
  std::string s;
  for (const auto& p : registry_storage()) s += (s.empty() ? "" : ", ") + p.name;
  return s;
}

std::string option_names(const PressInfo& info) {
  std::string s;
  for (const auto& o : info.options) s += (s.empty() ? "" : ", ") + o.name;
  return s.empty() ? "none" : s;
}

// Splits at `sep` outside parentheses; throws on unbalanced parentheses.
std::vector<std::string> split_top(const std::string& s, char sep, const std::string& whole) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    if (s[i] == ')') {
      --depth;
      KVTRIM_CHECK(depth >= 0, "press string '%s': unbalanced ')'", whole.c_str());
    }
    if (s[i] == sep && depth == 0) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  KVTRIM_CHECK(depth == 0, "press string '%s': unbalanced '('", whole.c_str());
  out.push_back(s.substr(start));
  return out;
}

std::unique_ptr<Press> make_one(const std::string& item_raw, const std::string& whole) {
  const std::string item = trim(item_raw);
  KVTRIM_CHECK(!item.empty(), "press string '%s': empty press (a stray '+'?)", whole.c_str());
  // name [ '(' inner ')' ] [ ':' options ]
  size_t i = 0;
  while (i < item.size() && item[i] != '(' && item[i] != ':') ++i;
  const std::string name = lower(trim(item.substr(0, i)));
  KVTRIM_CHECK(!name.empty(), "press string '%s': missing press name in '%s'", whole.c_str(), item.c_str());
  const PressInfo* info = find_press(name);
  KVTRIM_CHECK(info != nullptr, "unknown press '%s' (known presses: %s; `kvtrim presses` lists them with their options)",
               name.c_str(), known_names().c_str());
  std::string inner_spec;
  bool has_inner = false;
  if (i < item.size() && item[i] == '(') {
    int depth = 0;
    size_t j = i;
    for (; j < item.size(); ++j) {
      if (item[j] == '(') ++depth;
      if (item[j] == ')' && --depth == 0) break;
    }
    KVTRIM_CHECK(j < item.size(), "press string '%s': unbalanced '(' after '%s'", whole.c_str(), name.c_str());
    inner_spec = item.substr(i + 1, j - i - 1);
    has_inner = true;
    i = j + 1;
    while (i < item.size() && std::isspace(static_cast<unsigned char>(item[i]))) ++i;
    KVTRIM_CHECK(i == item.size() || item[i] == ':', "press string '%s': unexpected '%s' after '%s(...)'",
                 whole.c_str(), item.substr(i).c_str(), name.c_str());
  }
  KVTRIM_CHECK(!has_inner || info->wrapper,
               "press '%s' does not wrap another press: '(...)' is only for wrappers (e.g. adakv(snapkv))",
               name.c_str());
  // Options.
  std::map<std::string, std::string> given;
  if (i < item.size() && item[i] == ':') {
    const std::string opts = item.substr(i + 1);
    const auto parts = split_top(opts, ',', whole);
    for (size_t k = 0; k < parts.size(); ++k) {
      const std::string part = trim(parts[k]);
      KVTRIM_CHECK(!part.empty(), "press '%s': empty option in '%s'", name.c_str(), opts.c_str());
      const size_t eq = part.find('=');
      std::string key, value;
      if (eq == std::string::npos) {
        KVTRIM_CHECK(k == 0 && !info->options.empty(),
                     "press '%s': option '%s' has no value (write name=value; options: %s)", name.c_str(),
                     part.c_str(), option_names(*info).c_str());
        key = info->options[0].name;  // a bare first value sets the first option (ratio)
        value = part;
      } else {
        key = lower(trim(part.substr(0, eq)));
        value = trim(part.substr(eq + 1));
      }
      const bool known = std::any_of(info->options.begin(), info->options.end(),
                                     [&](const PressOption& o) { return o.name == key; });
      if (!known && info->wrapper && key == "press" && !has_inner) {
        inner_spec = value;  // adakv:press=snapkv (the inner press with its defaults)
        has_inner = true;
        continue;
      }
      KVTRIM_CHECK(known, "press '%s' has no option '%s' (options: %s)", name.c_str(), key.c_str(),
                   option_names(*info).c_str());
      KVTRIM_CHECK(!value.empty(), "press '%s': option '%s' has an empty value", name.c_str(), key.c_str());
      KVTRIM_CHECK(given.count(key) == 0, "press '%s': option '%s' given twice", name.c_str(), key.c_str());
      given[key] = value;
    }
  }
  std::map<std::string, std::string> values;
  for (const auto& o : info->options) values[o.name] = o.default_value;
  for (const auto& [k, v] : given) values[k] = v;
  PressArgs args(name, values);
  std::string canon = name;
  if (info->wrapper) {
    KVTRIM_CHECK(has_inner, "press '%s' wraps another press: write %s(snapkv:ratio=0.5) or %s:press=snapkv",
                 name.c_str(), name.c_str(), name.c_str());
    auto inner = make_press(inner_spec);
    canon += "(" + inner->spec() + ")";
    args.set_inner(std::move(inner));
  }
  std::string opt_str;
  for (const auto& o : info->options)
    if (given.count(o.name)) opt_str += (opt_str.empty() ? "" : ",") + o.name + "=" + given[o.name];
  if (!opt_str.empty()) canon += ":" + opt_str;
  std::unique_ptr<Press> p = info->make(args);
  KVTRIM_ASSERT(p != nullptr);
  p->set_spec(canon);
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// PressArgs

const std::string& PressArgs::raw(const std::string& name) const {
  auto it = values_.find(name);
  KVTRIM_CHECK(it != values_.end(), "press '%s': internal error: option '%s' is not declared", press_.c_str(),
               name.c_str());
  return it->second;
}

std::string PressArgs::get_string(const std::string& name) const { return raw(name); }

double PressArgs::get_double(const std::string& name) const {
  const std::string& s = raw(name);
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  KVTRIM_CHECK(!s.empty() && end == s.c_str() + s.size() && errno == 0 && std::isfinite(v),
               "press '%s': option '%s' = '%s' is not a number", press_.c_str(), name.c_str(), s.c_str());
  return v;
}

int64_t PressArgs::get_int(const std::string& name) const {
  const std::string& s = raw(name);
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  KVTRIM_CHECK(!s.empty() && end == s.c_str() + s.size() && errno == 0,
               "press '%s': option '%s' = '%s' is not an integer", press_.c_str(), name.c_str(), s.c_str());
  return v;
}

bool PressArgs::get_bool(const std::string& name) const {
  const std::string s = lower(raw(name));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  fail("press '%s': option '%s' = '%s' is not a boolean (true/false/1/0)", press_.c_str(), name.c_str(),
       raw(name).c_str());
}

double PressArgs::get_double_in(const std::string& name, double lo, double hi, bool hi_inclusive) const {
  const double v = get_double(name);
  KVTRIM_CHECK(v >= lo && (hi_inclusive ? v <= hi : v < hi), "press '%s': option '%s' = %g is out of range [%g, %g%s",
               press_.c_str(), name.c_str(), v, lo, hi, hi_inclusive ? "]" : ")");
  return v;
}

int64_t PressArgs::get_int_min(const std::string& name, int64_t lo) const {
  const int64_t v = get_int(name);
  KVTRIM_CHECK(v >= lo, "press '%s': option '%s' = %lld must be >= %lld", press_.c_str(), name.c_str(),
               static_cast<long long>(v), static_cast<long long>(lo));
  return v;
}

void PressArgs::bad_choice(const std::string& name, const std::string& v, const std::string& valid) const {
  fail("press '%s': option '%s' = '%s' is not one of: %s", press_.c_str(), name.c_str(), v.c_str(), valid.c_str());
}

uint32_t PressArgs::get_uint32(const std::string& name) const {
  const int64_t v = get_int(name);
  KVTRIM_CHECK(v >= 0 && v <= 0xffffffffLL, "press '%s': option '%s' = %lld must be in [0, 2^32)", press_.c_str(),
               name.c_str(), static_cast<long long>(v));
  return static_cast<uint32_t>(v);
}

Budget PressArgs::get_budget() const {
  Budget b;
  const double r = get_double("ratio");
  KVTRIM_CHECK(r >= 0 && r < 1,
               "press '%s': ratio = %g is out of range [0, 1) (ratio is the fraction of tokens removed)",
               press_.c_str(), r);
  b.ratio = r;
  b.n_keep = get_int_min("budget", 0);
  return b;
}

std::vector<PressOption> budget_options(const std::string& ratio_default) {
  return {{"ratio", ratio_default, "fraction of tokens removed, in [0, 1) (kvpress compression_ratio)"},
          {"budget", "0", "tokens kept per (layer, kv head); > 0 overrides ratio"}};
}

PressOption query_aware_option() {
  return {"query_aware", "false", "score with the question's queries instead of the context's last ones"};
}

// ---------------------------------------------------------------------------------------
// Registry

const std::vector<PressInfo>& press_registry() {
  ensure_builtins();
  return registry_storage();
}

const PressInfo* find_press(const std::string& name) {
  ensure_builtins();
  const std::string n = lower(name);
  for (const auto& p : registry_storage())
    if (p.name == n) return &p;
  return nullptr;
}

void register_press(PressInfo info) {
  KVTRIM_CHECK(!info.name.empty() && info.make, "register_press: a press needs a name and a factory");
  info.name = lower(info.name);
  for (const auto& p : registry_storage())
    KVTRIM_CHECK(p.name != info.name, "register_press: press '%s' is already registered", info.name.c_str());
  registry_storage().push_back(std::move(info));
}

std::unique_ptr<Press> make_press(const std::string& spec) {
  ensure_builtins();
  const std::string s = trim(spec);
  KVTRIM_CHECK(!s.empty(), "empty press string (e.g. --press snapkv:ratio=0.5; `kvtrim presses` lists them)");
  const auto items = split_top(s, '+', s);
  if (items.size() == 1) return make_one(items[0], s);
  std::vector<std::unique_ptr<Press>> ps;
  std::string canon;
  for (const auto& it : items) {
    ps.push_back(make_one(it, s));
    canon += (canon.empty() ? "" : "+") + ps.back()->spec();
  }
  auto c = std::make_unique<ComposedPress>(std::move(ps));
  c->set_spec(canon);
  return c;
}

std::string describe_presses() {
  const auto& reg = press_registry();
  std::string s;
  s += "Presses (--press NAME[:opt=value,...][+NAME...]; '+' applies presses in sequence, each on what the\n"
       "previous one left; a bare first value sets the first option, e.g. snapkv:0.5).\n";
  for (const auto& p : reg) {
    s += "\n" + p.name + (p.wrapper ? "(PRESS)" : "") + "  " + p.description + "\n";
    if (!p.paper.empty()) s += "    paper: " + p.paper + "\n";
    for (const auto& o : p.options) s += strprintf("    %-18s = %-8s %s\n", o.name.c_str(), o.default_value.c_str(), o.help.c_str());
  }
  return s;
}

}  // namespace kvtrim
