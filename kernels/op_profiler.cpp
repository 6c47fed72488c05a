// OpProfiler (see op_profiler.h).
#include "kernels/op_profiler.h"

#include <algorithm>
#include <cstdio>

#include "core/clock.h"

namespace spotrain {

namespace {

double host_ms() { return 1e3 * now_seconds(); }

}  // namespace

OpProfiler::OpProfiler(Backend& be) : be_(be), clock_(be.device_clock()) {
  if (clock_) clock_->read_marks_ms();  // marks from before are not ours
  be_.set_profiler(this);
}

OpProfiler::~OpProfiler() {
  if (be_.profiler() == this) be_.set_profiler(nullptr);
}

OpProfiler::Open OpProfiler::begin() {
  Open o;
  if (clock_)
    o.mark = clock_->record_mark();
  else
    o.host_ms = host_ms();
  return o;
}

void OpProfiler::end(const Open& o, const char* op, std::string shape) {
  Pending p{o.mark, -1, 0.0, op, std::move(shape)};
  if (clock_)
    p.end_mark = clock_->record_mark();
  else
    p.host_ms = host_ms() - o.host_ms;
  pending_.push_back(std::move(p));
}

void OpProfiler::resolve_pending() {
  if (!clock_) return;
  const std::vector<double> ms = clock_->read_marks_ms();
  for (Pending& p : pending_)
    if (p.end_mark >= 0) {
      p.host_ms = ms.at(size_t(p.end_mark)) - ms.at(size_t(p.begin_mark));
      p.begin_mark = p.end_mark = -1;
    }
}

void OpProfiler::collect(bool count) {
  std::vector<double> ms;
  if (clock_) ms = clock_->read_marks_ms();
  if (count) {
    for (const Pending& p : pending_) {
      double t = clock_ && p.end_mark >= 0 ? ms.at(size_t(p.end_mark)) - ms.at(size_t(p.begin_mark))
                                          : p.host_ms;
      Total& a = ops_[p.op];
      a.ms += t;
      ++a.calls;
      Total& b = shapes_[p.op + " " + p.shape];
      b.ms += t;
      ++b.calls;
    }
    ++steps_;
  }
  pending_.clear();
}

std::vector<OpProfiler::Row> OpProfiler::by_op() const {
  std::vector<Row> rows;
  double n = double(std::max<int64_t>(steps_, 1));
  for (auto& [k, v] : ops_) rows.push_back(Row{k, v.ms / n, double(v.calls) / n});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms_per_step > b.ms_per_step; });
  return rows;
}

std::vector<OpProfiler::Row> OpProfiler::by_shape(size_t top) const {
  std::vector<Row> rows;
  double n = double(std::max<int64_t>(steps_, 1));
  for (auto& [k, v] : shapes_) rows.push_back(Row{k, v.ms / n, double(v.calls) / n});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms_per_step > b.ms_per_step; });
  if (rows.size() > top) rows.resize(top);
  return rows;
}

std::vector<std::string> OpProfiler::report(size_t top_shapes) const {
  std::vector<std::string> out;
  auto ops = by_op();
  double total = 0;
  for (auto& r : ops) total += r.ms_per_step;
  char line[256];
  std::snprintf(line, sizeof line, "profile over %lld steps (%s clock): %.2f ms/step inside ops",
                (long long)steps_, clock_ ? "device" : "host", total);
  out.push_back(line);
  std::snprintf(line, sizeof line, "  %-28s %9s %6s %7s", "op", "ms/step", "share", "calls");
  out.push_back(line);
  for (auto& r : ops) {
    std::snprintf(line, sizeof line, "  %-28s %9.3f %5.1f%% %7.1f", r.name.c_str(), r.ms_per_step,
                  total > 0 ? 100 * r.ms_per_step / total : 0.0, r.calls_per_step);
    out.push_back(line);
  }
  out.push_back("  heaviest op shapes:");
  for (auto& r : by_shape(top_shapes)) {
    std::snprintf(line, sizeof line, "  %9.3f ms %5.1f  %s", r.ms_per_step, r.calls_per_step,
                  r.name.c_str());
    out.push_back(line);
  }
  return out;
}

}  // namespace spotrain
