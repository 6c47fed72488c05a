// SteadySteps (see steady_steps.h).
#include "observe/steady_steps.h"

#include <algorithm>
#include <vector>

namespace spotrain {

void SteadySteps::add(double seconds) {
  if (skip_next_) {
    skip_next_ = false;
    return;
  }
  latest_.push_back(seconds);
  if (latest_.size() > size_t(kWindow)) latest_.pop_front();
  ++kept_;
}

double SteadySteps::seconds() const {
  if (latest_.size() < size_t(kMinSteps)) return 0.0;
  std::vector<double> v(latest_.begin(), latest_.end());
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + long(mid), v.end());
  return v[mid];
}

}  // namespace spotrain
