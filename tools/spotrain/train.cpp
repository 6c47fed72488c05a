// `spotrain train`: one option per setting of config.h's table, then the Trainer. A run
// stopped by a signal or --max-wall-time exits 75 (resume with --resume auto).
#include <memory>
#include <string>
#include <type_traits>

#include "checkpoints/preemption.h"
#include "engine/config.h"
#include "engine/core/log.h"
#include "engine/trainer.h"
#include "tools/spotrain/commands.h"

namespace spotrain::cli {

namespace {

int run_train(const RunConfig& cfg) {
  Trainer t(cfg);
  TrainResult r = t.run();
  if (r.stopped) return kExitResumable;
  log_info(str("finished ", r.steps, " steps in ", fmt_duration(r.seconds), "; test top-1 ",
               fmt_fixed(100 * r.test.top1, 2), "% top-5 ", fmt_fixed(100 * r.test.top5, 2), "%",
               t.scaler().enabled()
                   ? str("; ", r.skipped_steps, " overflowed steps skipped, loss scale ", r.loss_scale)
                   : std::string()));
  return 0;
}

}  // namespace

Command add_train(CLI::App& app) {
  auto cfg = std::make_shared<RunConfig>();
  CLI::App* train = app.add_subcommand("train", "train a model");
  for_each_setting(*cfg, [train](const SettingInfo& s, auto& value) {
    CLI::Option* o;
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, bool>)
      o = train->add_flag(s.flag, value, s.help);
    else
      o = train->add_option(s.flag, value, s.help);
    if (s.flags & kShowDefault) o->capture_default_str();
  });
  return {train, [cfg] { return run_train(*cfg); }};
}

}  // namespace spotrain::cli
