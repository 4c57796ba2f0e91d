// Text helpers for the evaluation data: whitespace normalisation, a sentence splitter,
// loading a directory of .txt files, string replacement.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace kvtrim::eval {

// Collapses every run of whitespace to one space and trims the ends.
std::string normalize_space(std::string_view s);
// Splits normalised text into sentences: a sentence ends at '.', '!' or '?' (optionally
// followed by closing quotes or brackets) that is followed by a space or the end.
// Joining the result with " " gives the input back.
std::vector<std::string> split_sentences(std::string_view text);
// Splits on single spaces (input normalised).
std::vector<std::string> split_words(std::string_view text);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
std::string replace_all(std::string s, std::string_view from, std::string_view to);
std::string to_lower(std::string_view s);
bool contains_ci(std::string_view haystack, std::string_view needle);  // case-insensitive

// The whole file; throws Error "cannot read <what> '<path>'" if it cannot be opened.
std::string read_text_file(const std::string& path, const char* what);

// The texts of every *.txt file directly in `dir`, in file-name order (so the corpus is the
// same on every machine). Throws Error naming the directory if it is missing or has no .txt.
std::vector<std::string> load_text_dir(const std::string& dir);

}  // namespace kvtrim::eval
