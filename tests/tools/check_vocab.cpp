// Runs kvtrim's tokenizer on llama.cpp's tokenizer test cases: a vocab-only GGUF
// (llama.cpp/models/ggml-vocab-*.gguf) with VOCAB.inp (texts separated by
// "\n__ggml_vocab_test__\n") and VOCAB.out (one line of token ids per text, produced by Hugging
// Face tokenizers). Tokenizes as llama.cpp's test-tokenizer-0 does: no BOS, special tokens
// not parsed. Usage: check_vocab VOCAB.gguf [--cases PREFIX] [-v] (--cases: read the cases
// from PREFIX.inp / PREFIX.out instead of VOCAB.gguf.inp / .out). Prints one line
//   RESULT <file> <cases> <mismatches>
// (or "UNSUPPORTED <file> <reason>" when kvtrim cannot load the tokenizer, exit 3); with -v,
// every mismatch with both id lists. Exit 0 when all cases match, 1 otherwise.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

using namespace kvtrim;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "check_vocab: cannot open %s\n", path.c_str());
    std::exit(2);
  }
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s VOCAB.gguf [--cases PREFIX] [-v]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  std::string cases = path;
  bool verbose = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-v") {
      verbose = true;
    } else if (a == "--cases" && i + 1 < argc) {
      cases = argv[++i];
    } else {
      std::fprintf(stderr, "check_vocab: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  const std::string base = path.substr(path.find_last_of('/') + 1);
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
  try {
    file = GgufFile::open(path);
    tok = Tokenizer::from_gguf(*file);
  } catch (const Error& e) {
    std::printf("UNSUPPORTED %s %s\n", base.c_str(), e.what());
    return 3;
  }
  // The inputs, cut as test-tokenizer-0 cuts them.
  const std::string raw = read_all(cases + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(raw.substr(pos));
      break;
    }
    inputs.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::vector<int32_t>> expected;
  std::istringstream out(read_all(cases + ".out"));
  for (std::string line; std::getline(out, line);) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    for (int32_t id; ls >> id;) ids.push_back(id);
    expected.push_back(ids);
  }
  if (inputs.size() != expected.size()) {
    std::fprintf(stderr, "check_vocab: %s: %zu inputs but %zu outputs\n", base.c_str(),
                 inputs.size(), expected.size());
    return 2;
  }
  size_t mismatches = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t> got =
        tok->encode(inputs[i], /*add_bos=*/false, /*parse_special=*/false);
    if (got == expected[i]) continue;
    ++mismatches;
    if (verbose) {
      std::printf("MISMATCH %s case %zu: '%s'\n  kvtrim: %s\n  hf:     %s\n", base.c_str(), i,
                  inputs[i].c_str(), show(got).c_str(), show(expected[i]).c_str());
    }
  }
  std::printf("RESULT %s %zu %zu\n", base.c_str(), inputs.size(), mismatches);
  return mismatches == 0 ? 0 : 1;
}
