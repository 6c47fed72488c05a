// Loader throughput: images/s of spotrain's input pipeline (read, JPEG decode, RandomResizedCrop
// + flip + normalize into a batch) on an ImageFolder or shards, and CPU seconds per image,
// so bench/compare_loader.py can set it against torchvision's DataLoader per core.
//   bench_loader --data imagefolder:DIR|shards:DIR --workers N [--batch 64] [--batches 30]
//                [--eval] [--fast-decode]       prints one JSON line
//   bench_loader --data ... --dump PREFIX [--eval]   writes the first batch (PREFIX.bin: fp32
//                NHWC) and per image its file, label and crop box (PREFIX.json) for
//                bench/check_transforms_pil.py
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "io/image_folder.h"
#include "io/shards.h"
#include "io/image_transforms.h"
#include "io/jpeg.h"
#include "io/loader.h"

using namespace spotrain;

namespace {
double cpu_seconds() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}
double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv) {
  std::string data, dump;
  int workers = 1, batches = 30, prefetch = 4;
  int64_t batch = 64;
  bool train = true, fast = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--data") data = val();
    else if (a == "--workers") workers = std::atoi(val().c_str());
    else if (a == "--batch") batch = std::atoll(val().c_str());
    else if (a == "--batches") batches = std::atoi(val().c_str());
    else if (a == "--prefetch") prefetch = std::atoi(val().c_str());
    else if (a == "--eval") train = false;
    else if (a == "--fast-decode") fast = true;
    else if (a == "--dump") dump = val();
    else {
      std::fprintf(stderr, "usage: bench_loader --data imagefolder:DIR|shards:DIR --workers N [--batch B] "
                           "[--batches K] [--prefetch P] [--eval] [--fast-decode]\n");
      return 2;
    }
  }
  try {
    std::shared_ptr<io::Dataset> d;
    if (data.rfind("imagefolder:", 0) == 0) d = io::open_image_folder(data.substr(12) + "/train");
    else if (data.rfind("shards:", 0) == 0) d = io::open_shards(data.substr(7) + "/train");
    else SPOTRAIN_THROW("--data must be imagefolder:DIR or shards:DIR");
    io::LoaderOptions lo;
    lo.batch_size = batch;
    lo.train = train;
    lo.workers = workers;
    lo.prefetch = prefetch;
    lo.seed = 1;
    lo.image.fast_decode = fast;
    io::Loader loader(d, lo);
    io::Batch b;
    if (!dump.empty()) {
      loader.start_epoch(0);
      SPOTRAIN_CHECK(loader.next(b), "no batches");
      FILE* f = std::fopen((dump + ".bin").c_str(), "wb");
      SPOTRAIN_CHECK(f && std::fwrite(b.images.raw(), 1, b.images.nbytes(), f) == b.images.nbytes(),
                     "cannot write ", dump, ".bin");
      std::fclose(f);
      FILE* j = std::fopen((dump + ".json").c_str(), "w");
      SPOTRAIN_CHECK(j, "cannot write ", dump, ".json");
      std::fprintf(j, "[\n");
      std::vector<uint8_t> bytes;
      for (size_t i = 0; i < b.sample_ids.size(); ++i) {
        int32_t label;
        d->read_encoded(b.sample_ids[i], &bytes, &label);
        io::JpegInfo info;
        SPOTRAIN_CHECK(io::jpeg_info(bytes.data(), bytes.size(), &info), "not a JPEG: ", d->sample_name(b.sample_ids[i]));
        io::CropBox box = train ? io::random_resized_crop(info.width, info.height, lo.image, true, lo.seed, 0,
                                                          b.sample_ids[i])
                                : io::center_crop_box(info.width, info.height, lo.image);
        std::fprintf(j, "{\"file\": \"%s\", \"label\": %d, \"x\": %.17g, \"y\": %.17g, \"w\": %.17g, "
                        "\"h\": %.17g, \"flip\": %s, \"denom\": %d}%s\n",
                     d->sample_name(b.sample_ids[i]).c_str(), label, box.x, box.y, box.w, box.h,
                     box.flip ? "true" : "false", io::pick_jpeg_denom(box, lo.image.out_size),
                     i + 1 < b.sample_ids.size() ? "," : "");
      }
      std::fprintf(j, "]\n");
      std::fclose(j);
      return 0;
    }
    int64_t images = 0, epoch = 0;
    loader.start_epoch(epoch);
    // Warm-up: threads started, the batch buffers in flight allocated once (the allocator then
    // recycles them, as in training), file cache touched.
    for (int k = 0; k < prefetch + workers + 2; ++k)
      if (!loader.next(b)) {
        loader.start_epoch(++epoch);
        SPOTRAIN_CHECK(loader.next(b), "no batches");
      }
    double t0 = now(), c0 = cpu_seconds();
    for (int k = 0; k < batches; ++k) {
      if (!loader.next(b)) {
        loader.start_epoch(++epoch);
        SPOTRAIN_CHECK(loader.next(b), "no batches");
      }
      images += int64_t(b.labels.size());
    }
    double secs = now() - t0, cpu = cpu_seconds() - c0;
    std::printf("{\"impl\": \"spotrain\", \"workers\": %d, \"batch\": %lld, \"images\": %lld, \"seconds\": %.4f, "
                "\"images_per_sec\": %.2f, \"cpu_seconds\": %.4f, \"images_per_cpu_sec\": %.2f, \"fast_decode\": %s, "
                "\"train\": %s}\n",
                workers, (long long)batch, (long long)images, secs, double(images) / secs, cpu,
                double(images) / cpu, fast ? "true" : "false", train ? "true" : "false");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
