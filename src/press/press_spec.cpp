// The press-string parser (grammar in press.h) and the printers of its tree.
#include "press/press_spec.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "core/error.h"
#include "core/strings.h"
#include "press/press.h"

namespace kvtrim {

namespace {

std::string known_names() {
  std::string s;
  for (const auto& p : press_registry()) s += (s.empty() ? "" : ", ") + p.name;
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

PressSpec parse_spec(const std::string& text, const std::string& whole);

PressSpecItem parse_item(const std::string& item_raw, const std::string& whole) {
  const std::string item = trim_space(item_raw);
  KVTRIM_CHECK(!item.empty(), "press string '%s': empty press (a stray '+'?)", whole.c_str());
  // name [ '(' inner ')' ] [ ':' options ]
  size_t i = 0;
  while (i < item.size() && item[i] != '(' && item[i] != ':') ++i;
  PressSpecItem out;
  out.name = ascii_lower(trim_space(item.substr(0, i)));
  KVTRIM_CHECK(!out.name.empty(), "press string '%s': missing press name in '%s'", whole.c_str(), item.c_str());
  out.info = find_press(out.name);
  KVTRIM_CHECK(out.info != nullptr,
               "unknown press '%s' (known presses: %s; `kvtrim presses` lists them with their options)",
               out.name.c_str(), known_names().c_str());
  const PressInfo& info = *out.info;
  const std::string& name = out.name;
  if (i < item.size() && item[i] == '(') {
    int depth = 0;
    size_t j = i;
    for (; j < item.size(); ++j) {
      if (item[j] == '(') ++depth;
      if (item[j] == ')' && --depth == 0) break;
    }
    KVTRIM_CHECK(j < item.size(), "press string '%s': unbalanced '(' after '%s'", whole.c_str(), name.c_str());
    KVTRIM_CHECK(info.wrapper,
                 "press '%s' does not wrap another press: '(...)' is only for wrappers (e.g. adakv(snapkv))",
                 name.c_str());
    out.inner.push_back(parse_spec(item.substr(i + 1, j - i - 1), whole));
    i = j + 1;
    while (i < item.size() && std::isspace(static_cast<unsigned char>(item[i]))) ++i;
    KVTRIM_CHECK(i == item.size() || item[i] == ':', "press string '%s': unexpected '%s' after '%s(...)'",
                 whole.c_str(), item.substr(i).c_str(), name.c_str());
  }
  if (i < item.size() && item[i] == ':') {
    const std::string opts = item.substr(i + 1);
    const auto parts = split_top(opts, ',', whole);
    for (size_t k = 0; k < parts.size(); ++k) {
      const std::string part = trim_space(parts[k]);
      KVTRIM_CHECK(!part.empty(), "press '%s': empty option in '%s'", name.c_str(), opts.c_str());
      const size_t eq = part.find('=');
      PressSpecOption o;
      if (eq == std::string::npos) {
        KVTRIM_CHECK(k == 0 && !info.options.empty(),
                     "press '%s': option '%s' has no value (write name=value; options: %s)", name.c_str(),
                     part.c_str(), option_names(info).c_str());
        o.name = info.options[0].name;  // a bare first value sets the first option (ratio)
        o.value = part;
        o.bare = true;
      } else {
        o.name = ascii_lower(trim_space(part.substr(0, eq)));
        o.value = trim_space(part.substr(eq + 1));
      }
      if (!out.declares(o.name) && info.wrapper && o.name == "press" && out.inner.empty()) {
        out.inner.push_back(parse_spec(o.value, whole));  // adakv:press=snapkv
        continue;
      }
      KVTRIM_CHECK(out.declares(o.name), "press '%s' has no option '%s' (options: %s)", name.c_str(),
                   o.name.c_str(), option_names(info).c_str());
      KVTRIM_CHECK(!o.value.empty(), "press '%s': option '%s' has an empty value", name.c_str(),
                   o.name.c_str());
      KVTRIM_CHECK(out.find(o.name) == nullptr, "press '%s': option '%s' given twice", name.c_str(),
                   o.name.c_str());
      out.options.push_back(std::move(o));
    }
  }
  KVTRIM_CHECK(!info.wrapper || !out.inner.empty(),
               "press '%s' wraps another press: write %s(snapkv:ratio=0.5) or %s:press=snapkv", name.c_str(),
               name.c_str(), name.c_str());
  return out;
}

PressSpec parse_spec(const std::string& text, const std::string& whole) {
  const std::string s = trim_space(text);
  KVTRIM_CHECK(!whole.empty(), "empty press string (e.g. --press snapkv:ratio=0.5; `kvtrim presses` lists them)");
  KVTRIM_CHECK(!s.empty(), "press string '%s': a wrapper's inner press is empty", whole.c_str());
  PressSpec spec;
  for (const std::string& item : split_top(s, '+', whole)) spec.items.push_back(parse_item(item, whole));
  return spec;
}

std::string print(const PressSpec& spec, bool canonical);

std::string print_item(const PressSpecItem& item, bool canonical) {
  std::string s = item.name;
  if (!item.inner.empty()) s.append("(").append(print(item.inner[0], canonical)).append(")");
  std::string opts;
  auto add = [&](const PressSpecOption& o) {
    if (!opts.empty()) opts.push_back(',');
    if (!o.bare || canonical) opts.append(o.name).push_back('=');
    opts.append(o.value);
  };
  if (canonical) {
    for (const PressOption& decl : item.info->options)
      if (const PressSpecOption* o = item.find(decl.name)) add(*o);
  } else {
    for (const PressSpecOption& o : item.options) add(o);
  }
  if (!opts.empty()) s.append(":").append(opts);
  return s;
}

std::string print(const PressSpec& spec, bool canonical) {
  std::string s;
  for (const PressSpecItem& item : spec.items) {
    if (!s.empty()) s.push_back('+');
    s.append(print_item(item, canonical));
  }
  return s;
}

}  // namespace

const PressSpecOption* PressSpecItem::find(const std::string& option) const {
  for (const PressSpecOption& o : options)
    if (o.name == option) return &o;
  return nullptr;
}

bool PressSpecItem::declares(const std::string& option) const {
  KVTRIM_ASSERT(info != nullptr);
  return std::any_of(info->options.begin(), info->options.end(),
                     [&](const PressOption& o) { return o.name == option; });
}

void PressSpecItem::set(const std::string& option, const std::string& value) {
  KVTRIM_CHECK(declares(option), "press '%s' has no option '%s' (options: %s)", name.c_str(), option.c_str(),
               option_names(*info).c_str());
  for (PressSpecOption& o : options)
    if (o.name == option) {
      o.value = value;
      o.bare = false;
      return;
    }
  options.insert(options.begin(), PressSpecOption{option, value, false});
}

void PressSpecItem::erase(const std::string& option) {
  options.erase(std::remove_if(options.begin(), options.end(),
                               [&](const PressSpecOption& o) { return o.name == option; }),
                options.end());
}

PressSpec parse_press_spec(const std::string& text) { return parse_spec(text, trim_space(text)); }

std::string canonical_press_spec(const PressSpec& spec) { return print(spec, true); }

std::string canonical_press_spec(const PressSpecItem& item) { return print_item(item, true); }

std::string written_press_spec(const PressSpec& spec) { return print(spec, false); }

PressSpecItem& ratio_target(PressSpec& spec) {
  KVTRIM_CHECK(!spec.items.empty(), "an empty press string has no ratio");
  PressSpecItem& last = spec.items.back();
  if (last.info->wrapper) {
    // The ratio belongs to the wrapped press (adakv(snapkv) at 0.5: adakv(snapkv:ratio=0.5)).
    KVTRIM_CHECK(!last.inner.empty(), "wrapper '%s' needs its inner press, e.g. %s(snapkv)", last.name.c_str(),
                 last.name.c_str());
    return ratio_target(last.inner[0]);
  }
  KVTRIM_CHECK(last.declares("ratio"), "press '%s' has no ratio option, so a sweep over ratios cannot set it",
               last.name.c_str());
  return last;
}

namespace {

// The ratio an item compresses with (given, else its declared default); -1 without one, or
// when a nonzero `budget` count replaces it.
double item_ratio(const PressSpecItem& it) {
  if (!it.declares("ratio")) return -1;
  if (const PressSpecOption* b = it.find("budget"); b && std::strtod(b->value.c_str(), nullptr) > 0) return -1;
  if (const PressSpecOption* r = it.find("ratio")) return std::strtod(r->value.c_str(), nullptr);
  for (const PressOption& o : it.info->options)
    if (o.name == "ratio") return std::strtod(o.default_value.c_str(), nullptr);
  return -1;
}

bool halve_item(PressSpecItem& it) {
  bool any = false;
  for (PressSpec& in : it.inner) any = halve_press_ratios(&in) || any;
  const double r = item_ratio(it);
  if (r > 0) {
    it.set("ratio", strprintf("%g", r / 2));
    any = true;
  }
  return any;
}

}  // namespace

double press_spec_ratio(const PressSpec& spec) {
  if (spec.items.empty()) return -1;
  const PressSpecItem* it = &spec.items.back();
  while (it->info->wrapper && !it->inner.empty() && !it->inner[0].items.empty()) it = &it->inner[0].items.back();
  return item_ratio(*it);
}

bool halve_press_ratios(PressSpec* spec) {
  bool any = false;
  for (PressSpecItem& it : spec->items) any = halve_item(it) || any;
  return any;
}

}  // namespace kvtrim
