// The model the training tests build: ResNet-20 for Fashion-MNIST's 28x28 1-channel images and
// its 10 classes (the options the caller adds to, such as fusion or checkpointing, start here).
#pragma once
#include "layers/resnet.h"

inline spotrain::ResNetOptions fmnist_resnet20() {
  spotrain::ResNetOptions o;
  o.arch = "resnet20";
  o.in_channels = 1;
  o.num_classes = 10;
  return o;
}
