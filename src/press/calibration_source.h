// The calibration file a press reads (the low-rank presses, SWAN): `calib=PATH`, or the
// default <model gguf path minus .gguf>.kvcalib, or the in-memory override. Loaded once per press
// and checked against the model it is used with (a file made for another model is an Error that
// shows both fingerprints; a missing file is an Error naming the `kvtrim calibrate` command).
#pragma once
#include <memory>
#include <mutex>
#include <string>

#include "calib/calibration.h"
#include "press/press.h"

namespace kvtrim {

class CalibrationSource {
 public:
  // who: the press's name (messages); path: the calib= option ("" = default / override).
  CalibrationSource(std::string who, std::string path) : who_(std::move(who)), path_(std::move(path)) {}
  CalibrationSource(const CalibrationSource&) = delete;
  CalibrationSource& operator=(const CalibrationSource&) = delete;
  // The calibration for ctx's model (loaded on first use, checked against the model and the
  // cache's shape). Thread-safe.
  std::shared_ptr<const Calibration> get(const PressContext& ctx) const;
  // What identifies the calibration this press reads with `model` (eval configs): the file's
  // stored checksum (16 hex digits), "memory" for the in-memory override. Loads and checks the
  // file as get() does (an Error for a missing file or one made for another model).
  std::string identity(const Model& model) const;

 private:
  std::shared_ptr<const Calibration> file_locked(const Model* model) const;
  void check_override_locked(const Calibration& cal, const Model* model) const;

  std::string who_, path_;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const Calibration> cal_;  // loaded from a file
  mutable std::string cal_path_;                    // ... this one
  mutable const Model* checked_model_ = nullptr;    // model the calibration was checked against
  mutable const Calibration* override_checked_ = nullptr;  // the override checked (if any)
};

// A calibration held in memory (tests; tools that just calibrated): while set, every press
// reading a calibration without an explicit calib= option uses it instead of the default file.
// It is checked against the model like a loaded file. nullptr clears it.
void set_calibration_override(std::shared_ptr<const Calibration> cal);

}  // namespace kvtrim
