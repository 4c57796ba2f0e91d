// The press registry, option values, and presses built from a parsed press string (press_spec.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "core/strings.h"
#include "press/builtin_presses.h"
#include "press/press.h"
#include "press/press_spec.h"

namespace kvtrim {

namespace {

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

std::unique_ptr<Press> build(const PressSpec& spec);

std::unique_ptr<Press> build_item(const PressSpecItem& item) {
  std::map<std::string, std::string> values;
  for (const auto& o : item.info->options) values[o.name] = o.default_value;
  for (const PressSpecOption& o : item.options) values[o.name] = o.value;
  PressArgs args(item.name, values);
  if (!item.inner.empty()) args.set_inner(build(item.inner[0]));
  std::unique_ptr<Press> p = item.info->make(args);
  KVTRIM_ASSERT(p != nullptr);
  p->set_spec(canonical_press_spec(item));
  return p;
}

std::unique_ptr<Press> build(const PressSpec& spec) {
  KVTRIM_ASSERT(!spec.items.empty());
  if (spec.items.size() == 1) return build_item(spec.items[0]);
  std::vector<std::unique_ptr<Press>> ps;
  for (const PressSpecItem& item : spec.items) ps.push_back(build_item(item));
  auto c = std::make_unique<ComposedPress>(std::move(ps));
  c->set_spec(canonical_press_spec(spec));
  return c;
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
  const std::string s = ascii_lower(raw(name));
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

const char* press_axis_name(PressAxis axis) {
  switch (axis) {
    case PressAxis::kToken:
      return "token";
    case PressAxis::kBasis:
      return "basis";
    case PressAxis::kChannel:
      return "channel";
    case PressAxis::kPrecision:
      return "precision";
  }
  return "?";
}

const std::vector<PressInfo>& press_registry() {
  ensure_builtins();
  return registry_storage();
}

const PressInfo* find_press(const std::string& name) {
  ensure_builtins();
  const std::string n = ascii_lower(name);
  for (const auto& p : registry_storage())
    if (p.name == n) return &p;
  return nullptr;
}

void register_press(PressInfo info) {
  KVTRIM_CHECK(!info.name.empty() && info.make, "register_press: a press needs a name and a factory");
  info.name = ascii_lower(info.name);
  for (const auto& p : registry_storage())
    KVTRIM_CHECK(p.name != info.name, "register_press: press '%s' is already registered", info.name.c_str());
  const bool has_ratio = std::any_of(info.options.begin(), info.options.end(),
                                     [](const PressOption& o) { return o.name == "ratio"; });
  if (!info.wrapper && has_ratio) {  // the sweeps' default settings (PressInfo::test_easy)
    if (info.test_easy.empty()) info.test_easy = info.name + ":ratio=0.25";
    if (info.test_hard.empty()) info.test_hard = info.name + ":ratio=0.9";
  }
  registry_storage().push_back(std::move(info));
}

std::unique_ptr<Press> make_press(const std::string& spec) { return build(parse_press_spec(spec)); }

std::unique_ptr<Press> make_press(const PressSpec& spec) { return build(spec); }

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
