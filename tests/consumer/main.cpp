// Uses an installed spotrain as a library: builds a small ResNet on the CPU backend, trains
// it for a few steps on one synthetic batch and checks that the loss went down.
#include <cstdio>
#include <vector>

#include "core/philox.h"
#include "engine/session.h"

int main() {
  using namespace spotrain;
  SessionOptions so;
  so.comm = "local";
  so.device = "cpu";
  so.backend.threads = 1;
  Session session(so);
  TrainingSpec spec;
  spec.net.arch = "resnet20";
  spec.net.in_channels = 1;
  spec.net.num_classes = 10;
  Training t = session.make_training(spec);
  Tensor x = Tensor::host({8, 1, 16, 16}, DType::f32, Layout::nhwc);
  Philox rng(1, 0);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng.normal();
  std::vector<int32_t> labels{0, 1, 2, 3, 4, 5, 6, 7};
  double first = 0, last = 0;
  for (int step = 0; step < 5; ++step) {
    StepResult r = t.runner->run(x, labels.data(), 0.05f, 0.f);
    (step == 0 ? first : last) = r.loss.loss;
  }
  std::printf("consumer: loss %.4f -> %.4f\n", first, last);
  return last < first ? 0 : 1;
}
