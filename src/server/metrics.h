// /metrics: the server's counters and gauges in the Prometheus text format (version 0.0.4).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "server/scheduler.h"

namespace kvtrim::server {

// Requests seen by the HTTP layer, by endpoint and status code.
class HttpCounters {
 public:
  void count(const std::string& endpoint, int status);
  std::map<std::pair<std::string, int>, int64_t> snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> n_;
};

std::string render_metrics(const SchedulerStats& st, const ServerOptions& opt,
                           const std::map<std::pair<std::string, int>, int64_t>& http);

}  // namespace kvtrim::server
