// Calibration capture (DESIGN.md §2 "calib", docs/calibration.md): a ForwardObserver that
// streams, per (layer, kv head), the Gram matrices and sums of HeadStats from every forward
// chunk (f32 BLAS per chunk, added into f64 totals), so memory does not grow with the number
// of calibration tokens; and, optionally, a seeded reservoir sample of R (x_in, x_out) rows of
// each layer's residual stream. run_capture() drives the model over token sequences.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "calib/calibration.h"
#include "model/model.h"

namespace kvtrim {

class ThreadPool;

class CalibCapture : public ForwardObserver {
 public:
  // layer_io_rows: rows kept per layer (0 = none); seed: the reservoirs' random stream;
  // kv_rows: post-RoPE key and value rows kept per layer (each (token, kv head) one row, keys and
  // values paired; 0 = none; Lexico's dictionary learning).
  CalibCapture(const Model& model, int layer_io_rows = 0, uint64_t seed = 42, int kv_rows = 0);

  void on_qkv(int il, int64_t n, const float* q, const float* k, const float* v,
              const int32_t* pos) override;
  bool wants_pre_rope() const override { return true; }
  void on_qk_pre_rope(int il, int64_t n, const float* q, const float* k) override;
  bool wants_layer_io() const override { return layer_io_rows_ > 0; }
  void on_layer_io(int il, int64_t n, const float* x_in, const float* x_out) override;

  // Statistics so far, [n_layer * n_head_kv] (gram_vo filled from the model's W_O).
  std::vector<HeadStats> stats() const;
  // Layer io samples, [n_layer] (rows in reservoir order; empty vector if layer_io_rows == 0).
  std::vector<LayerIoSample> layer_io() const;
  // Key rows [n_layer][n, head_dim_k] and value rows [n_layer][n, head_dim_v] (n <= kv_rows).
  const std::vector<std::vector<float>>& key_rows() const { return kr_; }
  const std::vector<std::vector<float>>& value_rows() const { return vr_; }
  int64_t n_tokens() const;

 private:
  const Model& model_;
  int n_layer_, n_head_, n_head_kv_, dk_, dv_, n_embd_;
  int layer_io_rows_;
  uint64_t seed_;
  std::vector<HeadStats> stats_;   // [n_layer * n_head_kv]
  std::vector<LayerIoSample> io_;  // [n_layer]
  std::vector<int64_t> io_seen_;   // [n_layer] rows offered to each reservoir
  std::vector<uint64_t> io_rng_;   // [n_layer] splitmix64 states
  std::vector<float> tmp_;         // [d, d] per-chunk f32 Gram
  int kv_rows_;
  std::vector<std::vector<float>> kr_, vr_;  // [n_layer] key / value row reservoirs
  std::vector<int64_t> kv_seen_;
  std::vector<uint64_t> kv_rng_;
};

// Σ_{h in group ih} W_O^h W_O^hᵀ [dv, dv] of layer il (W_O dequantized; head h owns columns
// h·dv .. (h+1)·dv of each W_O row).
std::vector<std::vector<double>> gram_vo_layer(const Model& model, int il);  // [n_head_kv][dv*dv]

// Runs the model over each sequence (from an empty dense cache, one forward per sequence) with
// `cap` observing. progress(done, total) after each sequence (may be empty).
void run_capture(const Model& model, const std::vector<std::vector<int32_t>>& seqs,
                 CalibCapture& cap, ThreadPool* pool,
                 const std::function<void(int64_t, int64_t)>& progress = {});

// Cuts `tokens` into up to n_seqs consecutive sequences of seq_len tokens (the first token of each
// replaced by bos when bos >= 0, as perplexity windows are). Fewer when the text is short.
std::vector<std::vector<int32_t>> cut_sequences(const std::vector<int32_t>& tokens, int64_t n_seqs,
                                                int64_t seq_len, int32_t bos);

}  // namespace kvtrim
