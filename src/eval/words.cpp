#include "eval/words.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <unordered_set>

#include "core/error.h"
#include "eval/rng.h"

namespace kvtrim::eval {

namespace {

bool plain_word(const std::string& w) {
  if (w.size() < 3 || w.size() > 12) return false;
  return std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}

std::ifstream open_list(const std::string& path, const char* package, const char* option) {
  std::ifstream f(path);
  KVTRIM_CHECK(f.good(),
               "word list '%s' is missing: install the Debian package '%s' "
               "(scripts/install_deps.sh does), or point %s to a copy",
               path.c_str(), package, option);
  return f;
}

// First field of every non-header line of a WordNet index file (header lines start with ' ').
std::vector<std::string> read_wordnet_index(const std::string& path) {
  std::ifstream f = open_list(path, "wordnet-base", "--wordnet-dir");
  std::vector<std::string> out;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == ' ') continue;
    std::string w = line.substr(0, line.find(' '));
    if (plain_word(w)) out.push_back(std::move(w));
  }
  KVTRIM_CHECK(!out.empty(), "word list '%s' has no usable words", path.c_str());
  return out;
}

}  // namespace

WordLists load_word_lists(const std::string& wordnet_dir, const std::string& scowl_dir) {
  std::unordered_set<std::string> common;
  for (const char* tier : {"10", "20", "35"}) {
    const std::string path = scowl_dir + "/english-words." + tier;
    std::ifstream f = open_list(path, "scowl", "--scowl-dir");
    std::string line;
    while (std::getline(f, line)) {
      if (plain_word(line)) common.insert(line);
    }
  }
  WordLists wl;
  auto fill = [&](const char* pos, std::vector<std::string>& dst) {
    for (auto& w : read_wordnet_index(wordnet_dir + "/index." + pos)) {
      if (common.count(w)) dst.push_back(std::move(w));
    }
    std::sort(dst.begin(), dst.end());
    dst.erase(std::unique(dst.begin(), dst.end()), dst.end());
    KVTRIM_CHECK(dst.size() >= 100, "only %zu common words in '%s/index.%s' (expected thousands)",
                 dst.size(), wordnet_dir.c_str(), pos);
  };
  fill("noun", wl.nouns);
  fill("adj", wl.adjs);
  fill("verb", wl.verbs);
  uint64_t h = fnv1a64("words-v1");
  for (const auto* list : {&wl.nouns, &wl.adjs, &wl.verbs}) {
    for (const auto& w : *list) h = fnv1a64(w + "\n", h);
    h = fnv1a64("|", h);
  }
  wl.fingerprint = h;
  return wl;
}

}  // namespace kvtrim::eval
