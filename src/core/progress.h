// A one-line progress bar with rate and ETA on stderr, redrawn at most every 100 ms.
// Prints nothing when stderr is not a terminal unless `force` is set (then one line per 5%).
#pragma once
#include <cstdint>
#include <string>

namespace kvtrim {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::string unit = "it");
  ~ProgressBar();
  void update(int64_t done, const std::string& extra = "");
  void finish(const std::string& extra = "");

 private:
  void draw(bool final);
  std::string label_, unit_, extra_;
  int64_t total_, done_ = 0;
  double t0_, last_draw_ = 0;
  bool tty_, finished_ = false;
  int last_pct_logged_ = -1;
};

}  // namespace kvtrim
