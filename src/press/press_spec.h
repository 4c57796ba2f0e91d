// A press string parsed into a tree (grammar at the top of press.h), checked against the
// registry: every press name known, every option declared by its press, no option twice, a
// wrapper with its inner press and nothing else with one. make_press builds presses from it;
// tools that edit a press string (the sweep setting each cell's ratio, its labels) edit the
// tree and print it, so there is one parser.
#pragma once
#include <string>
#include <vector>

namespace kvtrim {

struct PressInfo;
struct PressSpec;

struct PressSpecOption {
  std::string name;   // the declared option's name (a bare first value resolved to it)
  std::string value;  // as written, trimmed
  bool bare = false;  // written as a bare first value ("snapkv:0.5")
};

// One press of a composition: name[(inner)][:options].
struct PressSpecItem {
  std::string name;                    // the registry's name (lower case)
  const PressInfo* info = nullptr;     // its registry entry
  std::vector<PressSpec> inner;        // a wrapper's inner press (exactly one), else empty
  std::vector<PressSpecOption> options;  // as given, in the order given

  const PressSpecOption* find(const std::string& option) const;
  // Sets `option` (declared by the press, else Error) to `value`: replaced where given,
  // else first.
  void set(const std::string& option, const std::string& value);
  // Removes `option` where given.
  void erase(const std::string& option);
  bool declares(const std::string& option) const;
};

// '+'-separated presses, applied in sequence.
struct PressSpec {
  std::vector<PressSpecItem> items;
};

// Parses and checks a press string; Error names the mistake (unknown press or option, an
// option twice or empty, unbalanced parentheses, a stray '+', a wrapper without its press).
PressSpec parse_press_spec(const std::string& text);

// The canonical form (Press::spec()): each press's given options in the order its press
// declares them, always name=value; wrappers' inner presses likewise.
std::string canonical_press_spec(const PressSpec& spec);
// The same for one press of a composition (its Press::spec()).
std::string canonical_press_spec(const PressSpecItem& item);
// The options in the order given, bare values kept bare (what the user wrote, normalised).
std::string written_press_spec(const PressSpec& spec);

// The press a sweep's ratio applies to: the last of the composition, and inside a wrapper its
// inner press's (adakv(snapkv) at 0.5 sets snapkv's ratio). Error where that press has no
// `ratio` option, or a wrapper lacks its inner press.
PressSpecItem& ratio_target(PressSpec& spec);

// The ratio a press string compresses with: ratio_target's `ratio` as given, else its default;
// -1 when that press has no ratio option (or a `budget` count replaces it).
double press_spec_ratio(const PressSpec& spec);

// A weaker press (the quality guard's retry, --press-max-loss): every press of the composition,
// inside wrappers too, that declares `ratio` and is not given a `budget` count gets half its
// ratio (as given, else its default). False when no press was weakened (spec unchanged).
bool halve_press_ratios(PressSpec* spec);

}  // namespace kvtrim
