// `spotrain train`: one option per setting of config.h's table, then the Trainer. A run
// stopped by a signal or --max-wall-time exits 75 (resume with --resume auto; a launcher may
// ask for another code: core/exit_codes.h).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "spot/preempt_notice.h"
#include "spot/preemption.h"
#include "run/config.h"
#include "core/error.h"
#include "core/exit_codes.h"
#include "core/log.h"
#include "run/trainer.h"
#include "tools/spotrain/commands.h"

namespace spotrain::cli {

namespace {

int run_train(const RunConfig& cfg) {
  const int stopped_code = stopped_exit_code();  // a bad SPOTRAIN_STOP_EXIT_CODE fails now
  // A notice already up (a restart on a node about to go): stop before the costly set-up.
  if (!cfg.preempt_notice.empty()) {
    const std::string notice = check_preempt_notice(cfg.preempt_notice);
    if (!notice.empty()) {
      std::fprintf(stderr, "preemption notice (%s) already up: not starting (exit 75)\n",
                   notice.c_str());
      return kExitResumable;
    }
  }
  Trainer t(cfg);  // resumes, too (its own errors reach train.log there)
  TrainResult r;
  try {
    r = t.run();
  } catch (const std::exception& e) {
    log_to_file(str("error: ", e.what()));  // into the run folder's train.log too
    throw;
  }
  if (r.stopped) return stopped_code;
  log_info(str("finished ", r.steps, " steps in ", fmt_duration(r.seconds), "; test top-1 ",
               fmt_fixed(100 * r.test.top1, 2), "% top-5 ", fmt_fixed(100 * r.test.top5, 2), "%",
               t.scaler().enabled()
                   ? str("; ", r.skipped_steps, " overflowed steps skipped, loss scale ", r.loss_scale)
                   : std::string()));
  return 0;
}

std::vector<std::string> split_choices(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e; (e = s.find('|', b)) != std::string::npos; b = e + 1) out.push_back(s.substr(b, e - b));
  out.push_back(s.substr(b));
  return out;
}

}  // namespace

void add_run_settings(CLI::App* app, RunConfig& cfg, const std::vector<std::string>& only) {
  const size_t before = app->get_options().size();
  for_each_setting(cfg, [&](const SettingInfo& s, auto& value) {
    if (!only.empty() && std::find(only.begin(), only.end(), std::string(s.flag)) == only.end()) return;
    CLI::Option* o;
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, bool>) {
      o = app->add_flag(s.flag, value, s.help);
    } else {
      o = app->add_option(s.flag, value, s.help);
      if constexpr (std::is_same_v<T, std::string>)
        if (*s.choices) o->check(CLI::IsMember(split_choices(s.choices)));
    }
    if (s.flags & kShowDefault) o->capture_default_str();
  });
  SPOTRAIN_CHECK(only.empty() || app->get_options().size() - before == only.size(),
                 "internal: a setting ", app->get_name(), " names is not in the settings table");
}

Command add_train(CLI::App& app) {
  auto cfg = std::make_shared<RunConfig>();
  CLI::App* train = app.add_subcommand("train", "train a model");
  add_run_settings(train, *cfg);
  auto check = [cfg] {
    cfg->validate();
    std::printf("# spotrain train --dry-run: the command line and settings are valid; the run "
                "would use\n%s", cfg->to_toml().c_str());
    return 0;
  };
  return {train, [cfg] { return run_train(*cfg); }, check};
}

}  // namespace spotrain::cli
