// The `spotrain` subcommands, one file each (train.cpp, eval.cpp, bench.cpp, ckpt.cpp,
// data.cpp, report.cpp, plan.cpp, doctor.cpp, batch.cpp): each adds its options to the CLI11 app and returns what runs it; main.cpp only
// wires them. Errors are thrown as spotrain::Error; main turns them into one line and exit 1.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace spotrain::cli {

// A (sub)subcommand and what runs it when it was given; run returns the exit code. check,
// when set, is what `--dry-run` does instead (checks the settings beyond what the parser
// does, prints them and returns the exit code); without it --dry-run only parses.
struct Command {
  CLI::App* app;
  std::function<int()> run;
  std::function<int()> check = nullptr;
};

Command add_train(CLI::App& app);                // spotrain train
Command add_eval(CLI::App& app);                 // spotrain eval
Command add_bench(CLI::App& app);                // spotrain bench
std::vector<Command> add_ckpt(CLI::App& app);    // spotrain ckpt info|verify
std::vector<Command> add_data(CLI::App& app);    // spotrain data pack|verify
Command add_report(CLI::App& app);               // spotrain report
Command add_plan(CLI::App& app);                 // spotrain plan
Command add_doctor(CLI::App& app);               // spotrain doctor
Command add_batch(CLI::App& app);                // spotrain batch

}  // namespace spotrain::cli

namespace spotrain {
struct RunConfig;
}

namespace spotrain::cli {

// The settings of RunConfig's table as options of `app` (flag, help, choices, defaults shown
// from `cfg`'s values): all of them (train), or the flags `only` names (bench, which takes the
// run's settings it uses from the same table).
void add_run_settings(CLI::App* app, RunConfig& cfg, const std::vector<std::string>& only = {});

}  // namespace spotrain::cli
