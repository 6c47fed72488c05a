// ImageNet's validation set ships as one flat folder of images and a labels file; the image-
// folder reader wants VAL/<class>/. sort_into_classes moves each image into its class's folder,
// reading either labels format: "FILE CLASS" / "FILE,CLASS ..." lines (ImageNet's
// LOC_val_solution.csv, the valprep lists), or the devkit's ground truth (one class number per
// image, in file-name order) with the class names in number order.
#pragma once
#include <cstdint>
#include <string>

namespace spotrain::io {

struct SortStats {
  int64_t moved = 0;     // images moved into their class folder
  int64_t already = 0;   // found in their class folder (a second run)
  int64_t missing = 0;   // named by the labels file, in neither place
  int64_t classes = 0;   // class folders made or used
  int64_t unlisted = 0;  // images in the flat folder the labels do not name (left in place)
};

// Sorts the images of `dir` into dir/<class>/. `labels`: a file of "NAME CLASS" or CSV lines
// (a header line and everything after the class's first word are ignored; NAME may lack its
// extension), or of bare class numbers 1..N, one per image in sorted file-name order, in which
// case `synsets` names the classes, one per line in number order (the devkit's). With
// `dry_run` nothing moves; the stats say what would. Throws Error (nothing moved) when the
// labels cannot be read or do not fit the folder (an image they name is in neither place).
SortStats sort_into_classes(const std::string& dir, const std::string& labels,
                            const std::string& synsets, bool dry_run);

}  // namespace spotrain::io
