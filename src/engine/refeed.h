// The re-feed passes (issue 13; DESIGN.md §4.4; docs/presses-kvcompose.md, docs/presses-kvzip.md):
// after the prefill, the context goes through the model a second time, after itself, and the
// attention its queries pay to the stored context scores every stored token. The pass reads
// the cache and keeps none of its own tokens: each chunk is appended at positions n_past...
// (the context's end), run, and truncated away before the next, so the cache holds at most
// the context plus one chunk (the reference implementations run the whole re-feed in one
// forward call: 2x the cache).
//
//   KVCompose (task-agnostic, the authors' KVComposePress in NVIDIA/kvpress): the context's
//   own tokens re-fed; every re-fed query attends over the whole stored context and the
//   re-fed tokens before it in its chunk (causal); Agg_task over all of them
//   (TokenStat::kRefeedMax / kRefeedSum). With one chunk this is the reference exactly;
//   with chunks of C tokens a re-fed token no longer sees the re-fed tokens of earlier chunks
//   (their keys would double the cache), which changes each softmax's denominator slightly.
//
//   KVzip (Kim et al. 2025; kvpress's KVzipPress): the context after the first `sinks` tokens
//   is cut into chunks of C tokens (the reference's 2048); chunk i is reconstructed from
//   "\n\nRepeat the previous context exactly." (i = 0) or "\n\nRepeat the part of the previous
//   context exactly, starting with" + the previous chunk's last 8 tokens (i > 0), then the chat
//   template's assistant opening (the text after a user turn; "\n" without a template), then
//   the chunk itself. Its queries' softmax runs over the sinks, the chunk's own span of the
//   stored context and the reconstruction's own tokens (causal); a stored token's score is the
//   max over the group's query heads and the queries of the probability it gets
//   (TokenStat::kKvzip); the sinks score 1.
//
// Session::prepare_compress runs the passes the session's observer needs (PressNeeds::refeed)
// once per context; compress() calls it. Its time is that of about one more prefill per pass.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvtrim {

class Model;

// One chunk of a re-feed pass: the tokens run after the context, and the span of context
// positions [lo, hi) it scores (KVzip; the whole context for KVCompose's re-feed).
struct RefeedChunk {
  std::vector<int32_t> tokens;
  int32_t lo = 0, hi = 0;
};

// KVCompose's re-feed of `context` in chunks of `chunk` tokens (0 = one chunk).
std::vector<RefeedChunk> context_refeed_chunks(const std::vector<int32_t>& context, int64_t chunk);

// KVzip's reconstruction prompt pieces for `model` (tokenized as the reference does: the
// instructions as plain text, the template's assistant opening with its special tokens).
struct KvzipPrompts {
  std::vector<int32_t> first;    // "\n\nRepeat the previous context exactly."
  std::vector<int32_t> next;     // "\n\nRepeat the part of the previous context exactly, starting with"
  std::vector<int32_t> suffix;   // the assistant opening after a user turn, or "\n"
};
KvzipPrompts kvzip_prompts(const Model& model);
// KVzip's chunks of `context` (positions 0..n-1; the first `sinks` are not reconstructed).
inline constexpr int kKvzipOverlap = 8;  // tokens of the previous chunk quoted in the prompt
std::vector<RefeedChunk> kvzip_refeed_chunks(const KvzipPrompts& p, const std::vector<int32_t>& context,
                                             int64_t chunk, int sinks);

struct RefeedNeeds;
// The chunks of the passes `rn` over `context` in a session whose context limit is n_ctx: each
// chunk is cut to the room the context leaves (cut = true) and a room under 16 tokens (plus
// KVzip's prompt) is a LimitError naming the numbers. longest: the most tokens one chunk adds
// to the cache (what the pass needs beyond the context).
struct RefeedPlan {
  std::vector<RefeedChunk> ctx_chunks, zip_chunks;
  int64_t ctx_chunk = 0, zip_chunk = 0;  // chunk sizes after any cut
  bool cut = false;
  int64_t longest = 0;
};
RefeedPlan plan_refeed(const Model& model, const RefeedNeeds& rn, const std::vector<int32_t>& context, int64_t n_ctx);
// RefeedPlan::longest for a context of n_context tokens (0 without a pass): what a memory
// budget must allow beyond the context while the pass runs (the server's --kv-budget).
int64_t refeed_peak_tokens(const Model& model, const RefeedNeeds& rn, int64_t n_context, int64_t n_ctx);

}  // namespace kvtrim
