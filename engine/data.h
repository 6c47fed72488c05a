// From a --data spec to datasets and their transforms: "fashion-mnist[:DIR]",
// "imagefolder:DIR" (DIR/train, DIR/val), "shards:DIR" (as `spotrain data pack` writes them)
// or "synthetic"; training and evaluation transforms for each kind.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "io/dataset.h"
#include "io/image_transforms.h"
#include "io/transforms.h"

namespace spotrain {

struct DataPair {
  std::shared_ptr<io::Dataset> train, test;
  std::string kind;  // "fashion-mnist" | "imagefolder" | "shards" | "synthetic"
};
// Throws Error, naming the forms, unless `spec` is a --data of open_data's (its folder is not
// looked at: a command line is checked before anything is opened).
void check_data_spec(const std::string& spec);
// image_size: the crop the imagefolder/shards transforms produce. With with_test = false,
// image folders and shards need no val/ split (bench reads train/ only).
DataPair open_data(const std::string& spec, int64_t train_limit, int64_t test_limit,
                   uint64_t seed, int image_size = 224, bool with_test = true);

// ImageNet transforms for an encoded dataset: crop image_shape().h, eval resize to h*256/224.
io::ImageTransformOptions image_transforms_for(const io::Dataset& d);
// The decoded-sample transforms for a dataset kind (fashion-mnist: pad-and-crop + flips when
// training with augmentation; synthetic: plain scaling; encoded sets: none, see above).
io::TransformOptions transforms_for(const std::string& kind, const io::Dataset& d, bool train,
                                    bool augment);

}  // namespace spotrain
