// Helpers shared by the resume tests: a checkpoint's flat parameters and momentum, and the
// sample ids a run consumed (SPOTRAIN_SAMPLE_LOG files: "step id id ..." per line).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/checkpoint_state.h"
#include "layers/resnet.h"

struct CkptState {
  std::vector<float> params, momentum, buffers;  // buffers: the batch-norm running statistics
};

inline CkptState load_ckpt_state(const std::string& path, const std::string& arch = "resnet20") {
  using namespace spotrain;
  auto be = make_backend("cpu", BackendOptions{1, true});
  ResNetOptions ro;
  ro.arch = arch;
  Model model(build_resnet(ro), *be);
  Sgd sgd(model, SgdOptions{});
  load_training_state(path, model, sgd);
  CkptState s;
  const float* p = model.flat_params().data<float>();
  const float* m = sgd.momentum().data<float>();
  s.params.assign(p, p + model.num_params());
  s.momentum.assign(m, m + model.num_params());
  const Tensor& b = model.flat_buffers();
  if (b.defined()) s.buffers.assign(b.data<float>(), b.data<float>() + b.numel());
  return s;
}

// The checkpoints at `a` and `b` hold bitwise the same weights and momentum: the verdict on a
// run stopped and resumed against one never stopped.
inline void expect_same_weights_and_momentum(const std::string& a, const std::string& b) {
  CkptState sa = load_ckpt_state(a), sb = load_ckpt_state(b);
  ASSERT_EQ(sa.params.size(), sb.params.size()) << a << " vs " << b;
  EXPECT_EQ(std::memcmp(sa.params.data(), sb.params.data(), sa.params.size() * 4), 0) << a << " vs " << b;
  EXPECT_EQ(std::memcmp(sa.momentum.data(), sb.momentum.data(), sa.momentum.size() * 4), 0)
      << a << " vs " << b;
}

// step -> each time that step was trained, the ids of its batch. With one file per rank
// (prefix.0, prefix.1, ...) a step's slices are joined in rank order: the global batch,
// whatever the rank count. A step trained twice (repeated after a resume) has two entries.
inline std::map<int64_t, std::vector<std::vector<int64_t>>> read_sample_log(
    const std::vector<std::string>& rank_files) {
  std::map<int64_t, std::vector<std::vector<int64_t>>> out;
  for (size_t r = 0; r < rank_files.size(); ++r) {
    std::ifstream f(rank_files[r]);
    std::string line;
    std::map<int64_t, int> seen;
    while (std::getline(f, line)) {
      std::istringstream ss(line);
      int64_t step, id;
      ss >> step;
      std::vector<int64_t> ids;
      while (ss >> id) ids.push_back(id);
      int k = seen[step]++;
      auto& v = out[step];
      if (int(v.size()) <= k) v.resize(size_t(k) + 1);
      v[size_t(k)].insert(v[size_t(k)].end(), ids.begin(), ids.end());
    }
  }
  return out;
}
