// Word lists for RULER-style keys and the common-words task, from two Debian packages
// (installed by scripts/install_deps.sh):
//  - wordnet-base: /usr/share/wordnet/index.{noun,adj,verb} give each word's part of speech;
//  - scowl: /usr/share/dict/scowl/english-words.{10,20,35} are the common tiers of English.
// A word is kept when it is all lowercase ASCII letters, 3 to 12 long, in the WordNet index
// of its part of speech and in one of the three common SCOWL tiers (RULER uses the similarly
// sized noun/adjective/verb lists of the `wonderwords` package). Lists are sorted and unique,
// so they do not depend on file order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvtrim::eval {

struct WordLists {
  std::vector<std::string> nouns, adjs, verbs;  // sorted, unique
  uint64_t fingerprint = 0;                     // hash of every list (goes into config hashes)
};

inline constexpr const char* kDefaultWordnetDir = "/usr/share/wordnet";
inline constexpr const char* kDefaultScowlDir = "/usr/share/dict/scowl";

// Throws Error naming the missing file and the package to install.
WordLists load_word_lists(const std::string& wordnet_dir = kDefaultWordnetDir,
                          const std::string& scowl_dir = kDefaultScowlDir);

}  // namespace kvtrim::eval
