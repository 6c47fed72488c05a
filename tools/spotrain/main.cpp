// The `spotrain` command line: wires the subcommands (train, eval, bench, ckpt, data; one file
// each, see commands.h) into CLI11. Errors become one `error:` line on stderr and exit code 1;
// a bad command line exits 2; a run stopped to be resumed exits 75.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "kernels/device_info.h"
#include "tools/spotrain/commands.h"

namespace {

// `--config FILE` is an option of the whole program (its [train] / [bench] sections hold each
// subcommand's keys); accept it after the subcommand too by moving it to the front. Returns
// the arguments in the reverse order CLI11's parse(vector) takes.
std::vector<std::string> config_first(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) args.push_back(argv[i]);
  for (size_t i = args.size(); i-- > 0;) {
    std::string a = args[i];
    if (a.rfind("--config=", 0) == 0) {
      args.erase(args.begin() + long(i));
      args.push_back(a);
    } else if (a == "--config" && i > 0) {
      std::string v = args[i - 1];
      args.erase(args.begin() + long(i) - 1, args.begin() + long(i) + 1);
      args.push_back(v);
      args.push_back(a);
    }
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = spotrain::cli;
  CLI::App app{"spotrain: data-parallel ResNet training that survives spot interruptions"};
  app.require_subcommand(1);
  app.set_config("--config", "", "read options from a TOML/INI file ([train] / [bench] sections)");
  app.set_version_flag("--version", [] {
    const auto& g = spotrain::gpu_info();
    return spotrain::str("spotrain ", SPOTRAIN_VERSION, " (built with ", g.built_with, ")\n",
                         spotrain::gpu_info_line(g));
  }, "print the version, the GPU and the CUDA library versions, and exit");

  std::vector<cli::Command> commands{cli::add_train(app), cli::add_eval(app)};
  for (auto& c : cli::add_ckpt(app)) commands.push_back(c);
  for (auto& c : cli::add_data(app)) commands.push_back(c);
  commands.push_back(cli::add_bench(app));

  try {
    app.parse(config_first(argc, argv));
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see spotrain --help)\n", e.what());
    return 2;
  }
  try {
    for (auto& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
