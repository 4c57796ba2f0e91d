// A press's calibration file (calibration_source.h).
#include "press/calibration_source.h"

#include <filesystem>

#include "core/error.h"
#include "model/gguf.h"

namespace kvtrim {

namespace {

std::mutex g_override_mu;
std::shared_ptr<const Calibration> g_override;

std::shared_ptr<const Calibration> calibration_override() {
  std::lock_guard<std::mutex> lk(g_override_mu);
  return g_override;
}

// <model gguf path minus .gguf>.kvcalib (what `kvtrim calibrate` writes by default).
std::string default_calib_path(const Model& model) {
  std::string p = model.gguf().path();
  const std::string ext = ".gguf";
  if (p.size() > ext.size() && p.compare(p.size() - ext.size(), ext.size(), ext) == 0)
    p.resize(p.size() - ext.size());
  return p + ".kvcalib";
}

void check_calibration_shape(const Calibration& cal, const PressContext& ctx,
                             const std::string& who, const std::string& where) {
  KVTRIM_CHECK(cal.n_layer() == ctx.n_layer() && cal.n_head_kv() == ctx.n_head_kv(),
               "press '%s': the calibration %s has %d layers x %d kv heads, the model %d x %d",
               who.c_str(), where.c_str(), cal.n_layer(), cal.n_head_kv(), ctx.n_layer(),
               ctx.n_head_kv());
}

}  // namespace

void set_calibration_override(std::shared_ptr<const Calibration> cal) {
  std::lock_guard<std::mutex> lk(g_override_mu);
  g_override = std::move(cal);
}

// The file's calibration (loaded on first use) checked against model; mu_ held.
std::shared_ptr<const Calibration> CalibrationSource::file_locked(const Model* model) const {
  if (!cal_) {
    KVTRIM_CHECK(!path_.empty() || model != nullptr,
                 "press '%s' needs a calibration file: give calib=PATH (no model to find "
                 "<model>.kvcalib from)",
                 who_.c_str());
    const std::string path = path_.empty() ? default_calib_path(*model) : path_;
    if (!std::filesystem::exists(path)) {
      const std::string model_path = model ? model->gguf().path() : std::string("MODEL.gguf");
      const std::string out = path_.empty() ? "" : " -o " + path;
      fail(
          "press '%s' needs a calibration file, and '%s' does not exist; create it with: kvtrim "
          "calibrate -m %s%s",
          who_.c_str(), path.c_str(), model_path.c_str(), out.c_str());
    }
    cal_ = std::make_shared<const Calibration>(Calibration::load(path, model));  // checks the model
    cal_path_ = path;
    checked_model_ = model;
  }
  if (model && model != checked_model_) {
    const ModelFingerprint fp = model_fingerprint(*model);
    KVTRIM_CHECK(cal_->fingerprint() == fp,
                 "press '%s': the calibration file '%s' was made for another model (%s; this "
                 "model: %s)",
                 who_.c_str(), cal_path_.c_str(), cal_->fingerprint().describe().c_str(),
                 fp.describe().c_str());
    checked_model_ = model;
  }
  return cal_;
}

// The in-memory override checked against model; mu_ held.
void CalibrationSource::check_override_locked(const Calibration& cal, const Model* model) const {
  if (model && (&cal != override_checked_ || model != checked_model_)) {
    const ModelFingerprint fp = model_fingerprint(*model);
    KVTRIM_CHECK(cal.fingerprint() == fp,
                 "press '%s': the in-memory calibration was made for another model (%s; this model: %s)",
                 who_.c_str(), cal.fingerprint().describe().c_str(), fp.describe().c_str());
    override_checked_ = &cal;
    checked_model_ = model;
  }
}

std::shared_ptr<const Calibration> CalibrationSource::get(const PressContext& ctx) const {
  const Model* model = ctx.model();
  std::shared_ptr<const Calibration> cal = path_.empty() ? calibration_override() : nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  if (!cal) {
    cal = file_locked(model);
    check_calibration_shape(*cal, ctx, who_, "file");
  } else {
    check_override_locked(*cal, model);
    check_calibration_shape(*cal, ctx, who_, "in memory");
  }
  return cal;
}

std::string CalibrationSource::identity(const Model& model) const {
  std::shared_ptr<const Calibration> cal = path_.empty() ? calibration_override() : nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  if (cal) {
    check_override_locked(*cal, &model);
    return "memory";
  }
  cal = file_locked(&model);
  return cal->checksum().empty() ? "unverified" : cal->checksum();
}

}  // namespace kvtrim
