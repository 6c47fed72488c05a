// ResNet family builders with torchvision parameter names: ResNet-18/34/50/101/152 (v1.5:
// stride on the bottleneck's 3x3 conv) and the small-input variant (3x3 stem, no max-pool,
// three stages of 16/32/64 channels, e.g. resnet20 for 28x28 / 32x32 images).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "layers/containers.h"

namespace spotrain {

struct ResNetOptions {
  std::string arch = "resnet20";  // resnet18|34|50|101|152 or resnet<6n+2> (20, 32, 44, 56, 110)
  int num_classes = 10;
  int in_channels = 1;
  bool zero_init_residual = false;  // last BN gamma of each block starts at zero
  // Gradient checkpointing: "none", "selective" (segments as "stage", convolution outputs kept:
  // only batch norm, ReLU, Add and max-pool recomputed), "block", "stage" or "every:K" (K
  // consecutive blocks of a stage per segment). The stem is always a segment of its own;
  // the last segment is never checkpointed (its replay would follow forward at once).
  std::string grad_checkpoint = "none";
  // Conv + batch-norm fusion in training (fuse_conv_bn_conv in layers.h): link every Conv2d,
  // BatchNorm2d+ReLU, Conv2d run of a block's main branch, so that a convolution can compute
  // the batch statistics of the BN+ReLU after it and the next convolution apply that BN as it
  // reads; and whether the links start switched on (each chain can be switched later:
  // FusionChain). The engine makes these of --fusion (engine/fusion_choice.h, fusion_mode).
  bool fusion_links = false;
  bool fusion_on = false;
};

// Throws Error naming the valid choices for an unknown arch or checkpoint mode.
std::unique_ptr<Sequential> build_resnet(const ResNetOptions& opt);
std::vector<std::string> resnet_arch_names();
// Throws Error, naming the choices, unless `arch` is a model and `grad_checkpoint` a mode that
// build_resnet takes (so a command line is checked before anything is built).
void check_resnet_options(const std::string& arch, const std::string& grad_checkpoint);
bool is_small_input_arch(const std::string& arch);

}  // namespace spotrain
