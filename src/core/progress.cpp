#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/timer.h"

namespace kvtrim {

namespace {
std::string fmt_duration(double s) {
  if (s < 0 || s > 1e7) return "--:--";
  const int t = static_cast<int>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%d:%02d:%02d", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%02d:%02d", t / 60, t % 60);
  return buf;
}
}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(std::max<int64_t>(1, total)),
      t0_(now_seconds()), tty_(isatty(STDERR_FILENO) != 0) {}

ProgressBar::~ProgressBar() {
  if (!finished_ && done_ > 0 && tty_) std::fputc('\n', stderr);
}

void ProgressBar::update(int64_t done, const std::string& extra) {
  done_ = std::min(done, total_);
  extra_ = extra;
  draw(false);
}

void ProgressBar::finish(const std::string& extra) {
  if (finished_) return;
  if (!extra.empty()) extra_ = extra;
  draw(true);
  finished_ = true;
}

void ProgressBar::draw(bool final) {
  const double t = now_seconds();
  const double elapsed = t - t0_;
  const int pct = static_cast<int>(100.0 * static_cast<double>(done_) / static_cast<double>(total_));
  if (!tty_) {
    if (!final && pct / 5 == last_pct_logged_ / 5) return;
    last_pct_logged_ = pct;
  } else if (!final && t - last_draw_ < 0.1) {
    return;
  }
  last_draw_ = t;
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : -1;
  constexpr int kWidth = 30;
  const int fill = static_cast<int>(kWidth * static_cast<double>(done_) / static_cast<double>(total_));
  std::string bar(static_cast<size_t>(fill), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "%s%s [%s] %3d%% %lld/%lld %s | %.1f %s/s | %s elapsed, ETA %s%s%s%s",
               tty_ ? "\r" : "", label_.c_str(), bar.c_str(), pct, static_cast<long long>(done_),
               static_cast<long long>(total_), unit_.c_str(), rate, unit_.c_str(),
               fmt_duration(elapsed).c_str(), fmt_duration(eta).c_str(), extra_.empty() ? "" : " | ",
               extra_.c_str(), tty_ ? "\033[K" : "");
  if (!tty_ || final) std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace kvtrim
