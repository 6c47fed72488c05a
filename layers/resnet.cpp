// ResNet builders (see resnet.h).
#include "layers/resnet.h"

#include "core/error.h"
#include "layers/layers.h"

namespace spotrain {

namespace {

struct Spec {
  bool bottleneck;
  std::vector<int> blocks;
};

bool small_depth(const std::string& arch, int* n) {
  if (arch.rfind("resnet", 0) != 0) return false;
  try {
    size_t used = 0;
    int depth = std::stoi(arch.substr(6), &used);
    if (used != arch.size() - 6) return false;
    // 6n+2 layers, up to the deepest He et al. trained (ResNet-1202): a name such as
    // resnet600000002 is refused, not built until memory runs out.
    if (depth < 8 || depth > 1202 || (depth - 2) % 6 != 0 || depth == 50 || depth == 152) return false;
    *n = (depth - 2) / 6;
    return true;
  } catch (...) {
    return false;
  }
}

bool imagenet_spec(const std::string& arch, Spec* s) {
  if (arch == "resnet18") *s = {false, {2, 2, 2, 2}};
  else if (arch == "resnet34") *s = {false, {3, 4, 6, 3}};
  else if (arch == "resnet50") *s = {true, {3, 4, 6, 3}};
  else if (arch == "resnet101") *s = {true, {3, 4, 23, 3}};
  else if (arch == "resnet152") *s = {true, {3, 8, 36, 3}};
  else return false;
  return true;
}

void conv_bn(Sequential& seq, const std::string& prefix, const char* conv,
                               const char* bn, int in, int out, int k, int stride, bool relu,
                               bool zero_gamma = false) {
  seq.emplace<Conv2d>(join_name(prefix, conv), in, out, k, stride, k / 2);
  auto& b = seq.emplace<BatchNorm2d>(join_name(prefix, bn), out, relu);
  if (zero_gamma) b.gamma().init = Param::Init::zeros;

}

// ResNetOptions::fusion_links: every Conv2d, BatchNorm2d+ReLU, Conv2d run of a block's main
// branch, switched on or not (`on`).
void link_chains(Sequential& seq, bool on) {
  for (size_t i = 0; i + 2 < seq.size(); ++i) {
    auto* a = dynamic_cast<Conv2d*>(&seq.at(i));
    auto* bn = dynamic_cast<BatchNorm2d*>(&seq.at(i + 1));
    auto* b = dynamic_cast<Conv2d*>(&seq.at(i + 2));
    if (a && bn && b && bn->fused_relu()) fuse_conv_bn_conv(*a, *bn, *b, on);
  }
}

// How a block's main branch is linked for conv + batch-norm fusion.
struct Links {
  bool make = false, on = false;
};

// One residual block named `prefix` (e.g. "layer2.0").
std::unique_ptr<Layer> make_block(const std::string& prefix, bool bottleneck, int in, int planes,
                                  int stride, bool zero_init, Links links) {
  auto main = std::make_unique<Sequential>(prefix);
  int out;
  if (bottleneck) {
    out = planes * 4;
    conv_bn(*main, prefix, "conv1", "bn1", in, planes, 1, 1, true);
    conv_bn(*main, prefix, "conv2", "bn2", planes, planes, 3, stride, true);
    conv_bn(*main, prefix, "conv3", "bn3", planes, out, 1, 1, false, zero_init);
  } else {
    out = planes;
    conv_bn(*main, prefix, "conv1", "bn1", in, planes, 3, stride, true);
    conv_bn(*main, prefix, "conv2", "bn2", planes, planes, 3, 1, false, zero_init);
  }
  if (links.make) link_chains(*main, links.on);
  std::unique_ptr<Sequential> shortcut;
  if (stride != 1 || in != out) {
    std::string d = join_name(prefix, "downsample");
    shortcut = std::make_unique<Sequential>(d);
    shortcut->emplace<Conv2d>(join_name(d, "0"), in, out, 1, stride, 0);
    shortcut->emplace<BatchNorm2d>(join_name(d, "1"), out, false);
  }
  return std::make_unique<Residual>(prefix, std::move(main), std::move(shortcut));
}

// Cuts the network body into Checkpointed segments according to the mode and appends them
// to `net`. The stem (first convolution, BN, pool) is always a segment of its own (joined
// with the first stage, its replay would hold both stashes at once). The last segment is never
// checkpointed: backward would replay it right after forward ends, which saves no memory and
// costs a forward.
// --grad-checkpoint as blocks per segment: 1 for "block", K for "every:K", 0 for "stage" and
// "selective" (and "none", which never gets here); throws Error for anything else.
int checkpoint_every(const std::string& mode) {
  if (mode == "none" || mode == "stage" || mode == "selective") return 0;
  if (mode == "block") return 1;
  if (mode.rfind("every:", 0) == 0) {
    int every = 0;
    try {
      every = std::stoi(mode.substr(6));
    } catch (...) {
      every = 0;
    }
    SPOTRAIN_CHECK(every > 0, "--grad-checkpoint ", mode, ": K must be a positive integer");
    return every;
  }
  SPOTRAIN_THROW("unknown --grad-checkpoint '", mode,
                 "'; use none, selective, block, stage or every:K");
}

// --grad-checkpoint selective, in a checkpointed segment: which convolutions keep their output
// for the replay. All but the cheap ones, those costing fewer multiply-adds per output element
// than they have output channels (a bottleneck's last 1x1 and the projection shortcuts, which
// expand channels: their outputs are the largest of a block) and the stem's (3 input channels).
// Under fusion a convolution that makes a batch norm's statistics always keeps its output:
// the convolution after it may hand back a kept output made with those statistics, which a
// replay on a GPU could otherwise sum again in another order.
void keep_costly_conv_outputs(Layer& segment, bool is_stem) {
  segment.visit([is_stem](Layer& l) {
    auto* conv = dynamic_cast<Conv2d*>(&l);
    if (!conv) return;
    const bool cheap = is_stem || conv->macs_per_output() < conv->out_channels();
    conv->keep_output_for_replay(!cheap);
    conv->keep_output_when_making_statistics(true);
  });
}

void add_body(Sequential& net, std::unique_ptr<Sequential> stem,
              std::vector<std::unique_ptr<Sequential>>& stages, const std::string& mode) {
  if (mode == "none") {
    for (auto& l : stem->release()) net.add(std::move(l));
    for (auto& st : stages) net.add(std::move(st));
    return;
  }
  const int every = checkpoint_every(mode);
  const bool selective = mode == "selective";
  std::vector<std::unique_ptr<Sequential>> segments;
  segments.push_back(std::move(stem));
  for (size_t s = 0; s < stages.size(); ++s) {
    auto blocks = stages[s]->release();
    if (every == 0) {  // stage, selective: a segment per stage
      auto seg = std::make_unique<Sequential>(stages[s]->name());
      // selective: the first stage, whose activations are the largest, replays block by block
      // within its own replay (each block keeps its input), so its whole stash is never alive
      // at once.
      const bool nest = selective && s == 0 && stages.size() > 1;
      for (auto& b : blocks) {
        if (nest) seg->add(std::make_unique<Checkpointed>(std::move(b)));
        else seg->add(std::move(b));
      }
      segments.push_back(std::move(seg));
      continue;
    }
    for (size_t i = 0; i < blocks.size(); i += size_t(every)) {
      auto seg = std::make_unique<Sequential>(blocks[i]->name());
      for (size_t k = i; k < std::min(blocks.size(), i + size_t(every)); ++k)
        seg->add(std::move(blocks[k]));
      segments.push_back(std::move(seg));
    }
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    if (i + 1 == segments.size()) {
      net.add(std::move(segments[i]));
      continue;
    }
    if (selective) keep_costly_conv_outputs(*segments[i], i == 0);
    net.add(std::make_unique<Checkpointed>(std::move(segments[i])));
  }
}

}  // namespace

std::vector<std::string> resnet_arch_names() {
  return {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet20",
          "resnet32", "resnet44", "resnet56", "resnet110"};
}

bool is_small_input_arch(const std::string& arch) {
  int n;
  return small_depth(arch, &n);
}

void check_resnet_options(const std::string& arch, const std::string& grad_checkpoint) {
  int n;
  Spec spec;
  if (!small_depth(arch, &n) && !imagenet_spec(arch, &spec)) {
    std::string names;
    for (auto& a : resnet_arch_names()) names += (names.empty() ? "" : ", ") + a;
    SPOTRAIN_THROW("unknown model '", arch, "'; choose one of ", names);
  }
  checkpoint_every(grad_checkpoint);
}

std::unique_ptr<Sequential> build_resnet(const ResNetOptions& opt) {
  check_resnet_options(opt.arch, opt.grad_checkpoint);
  SPOTRAIN_CHECK(opt.num_classes > 0, "number of classes must be positive");
  SPOTRAIN_CHECK(opt.in_channels > 0, "number of input channels must be positive");
  const Links fusion{opt.fusion_links, opt.fusion_links && opt.fusion_on};
  auto net = std::make_unique<Sequential>("");
  std::vector<std::unique_ptr<Sequential>> stages;
  int n_small = 0;
  Spec spec;
  int width;
  auto stem = std::make_unique<Sequential>("stem");
  if (small_depth(opt.arch, &n_small)) {
    conv_bn(*stem, "", "conv1", "bn1", opt.in_channels, 16, 3, 1, true);
    int in = 16;
    const int planes[3] = {16, 32, 64};
    for (int s = 0; s < 3; ++s) {
      std::string sname = "layer" + std::to_string(s + 1);
      auto st = std::make_unique<Sequential>(sname);
      for (int b = 0; b < n_small; ++b) {
        int stride = (b == 0 && s > 0) ? 2 : 1;
        st->add(make_block(join_name(sname, std::to_string(b)), false, in, planes[s], stride,
                           opt.zero_init_residual, fusion));
        in = planes[s];
      }
      stages.push_back(std::move(st));
    }
    width = 64;
  } else if (imagenet_spec(opt.arch, &spec)) {
    stem->emplace<Conv2d>("conv1", opt.in_channels, 64, 7, 2, 3);
    stem->emplace<BatchNorm2d>("bn1", 64, true);
    stem->emplace<MaxPool2d>("maxpool", 3, 2, 1);
    int in = 64;
    for (int s = 0; s < 4; ++s) {
      int planes = 64 << s;
      std::string sname = "layer" + std::to_string(s + 1);
      auto st = std::make_unique<Sequential>(sname);
      for (int b = 0; b < spec.blocks[s]; ++b) {
        int stride = (b == 0 && s > 0) ? 2 : 1;
        st->add(make_block(join_name(sname, std::to_string(b)), spec.bottleneck, in, planes,
                           stride, opt.zero_init_residual, fusion));
        in = spec.bottleneck ? planes * 4 : planes;
      }
      stages.push_back(std::move(st));
    }
    width = in;
  } else {
    SPOTRAIN_THROW("internal: model '", opt.arch, "' passed its check");
  }
  add_body(*net, std::move(stem), stages, opt.grad_checkpoint);
  net->emplace<GlobalAvgPool>("avgpool");
  net->emplace<Linear>("fc", width, opt.num_classes);
  net->set_needs_input_grad(false);
  return net;
}

}  // namespace spotrain
