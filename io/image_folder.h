// Encoded-image datasets in ImageNet's layout: an ImageFolder (`<split>/<class>/*.JPEG`,
// labels from the sorted class names). Packed shards of the same images are in shards.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/dataset.h"

namespace spotrain {
namespace io {

// Files of DIR/<class>/ with a .jpg, .jpeg or .png name (any case), classes and files in
// byte order of their names. `classes` given (the training split's): DIR's class
// directories must be among them and keep their labels; empty: DIR's own sorted classes.
// Images are decoded by the Loader to (out_size, out_size, 3).
std::shared_ptr<Dataset> open_image_folder(const std::string& dir,
                                           const std::vector<std::string>& classes = {},
                                           int out_size = 224);

}  // namespace io
}  // namespace spotrain
