// `spotrain ckpt info FILE` (a checkpoint's step, model, precision, sizes and settings) and
// `spotrain ckpt verify FILE` (format, attributes in range, every checksum, one self-contained file,
// and every tensor its model needs: a file verify passes is one a resume or eval can read).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoints/checkpoint.h"
#include "core/error.h"
#include "engine/checkpoint_state.h"
#include "tools/spotrain/commands.h"

namespace spotrain::cli {

namespace {

int run_ckpt_info(const std::string& ckpt_file) {
  auto info = spotrain::read_checkpoint_info(ckpt_file);
  std::printf("file          %s (%.1f MiB)\nformat        %d\nmodel         %s (%d classes, %d input "
              "channels)\nprecision     %s\nglobal step   %lld\nprogress      %s (%lld samples of "
              "the epoch under way)\nglobal batch  %lld on %d rank(s), seed %llu\n"
              "loss scale    %s\nconfig        %s\n",
              ckpt_file.c_str(), double(std::filesystem::file_size(ckpt_file)) / (1 << 20),
              info.format_version, info.model.c_str(), info.num_classes, info.in_channels,
              info.precision.c_str(), static_cast<long long>(info.global_step),
              spotrain::progress_text(spotrain::position_of(info)).c_str(),
              static_cast<long long>(info.samples_in_epoch),
              static_cast<long long>(info.global_batch), info.world_size,
              static_cast<unsigned long long>(info.seed),
              info.precision == "fp16"
                  ? spotrain::str(info.scaler.scale, " (", info.scaler.skipped_steps,
                                  " skipped steps)").c_str()
                  : "none (no fp16 loss scaling)",
              info.config_json.c_str());
  return 0;
}

int run_ckpt_verify(const std::string& ckpt_file) {
  spotrain::verify_checkpoint(ckpt_file, nullptr, spotrain::checkpoint_expectation(false));
  std::printf("%s: OK\n", ckpt_file.c_str());
  return 0;
}

}  // namespace

std::vector<Command> add_ckpt(CLI::App& app) {
  auto file = std::make_shared<std::string>();
  std::string& ckpt_file = *file;
  auto* ckpt = app.add_subcommand("ckpt", "inspect or verify a checkpoint file");
  ckpt->require_subcommand(1);
  auto* ckpt_info = ckpt->add_subcommand("info", "print step, epoch, model, precision, sizes, config");
  ckpt_info->add_option("file", ckpt_file, "checkpoint file")->required();
  auto* ckpt_verify = ckpt->add_subcommand("verify", "check format, attributes, every checksum and that it holds every tensor its model needs");
  ckpt_verify->add_option("file", ckpt_file, "checkpoint file")->required();
  return {{ckpt_info, [file] { return run_ckpt_info(*file); }},
          {ckpt_verify, [file] { return run_ckpt_verify(*file); }}};
}

}  // namespace spotrain::cli
