// The `spotrain` command line: wires the subcommands (train, eval, bench, ckpt, data, report, plan, doctor, batch; one file
// each, see commands.h) into CLI11. Errors become one `error:` line on stderr and exit code 1;
// a bad command line exits 2; a run stopped to be resumed exits 75.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
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

// `message` with, for each option it names (--name) that the command line does not give but
// config file `config` does, where its value came from: a check of a value a user did not
// type must say which file holds it ("--lr must be positive" after `lr = -1` in a recipe).
std::string with_config_origin(const std::string& message, const std::vector<std::string>& args,
                               const std::string& config) {
  if (config.empty()) return message;
  std::vector<std::string> named;
  static const std::regex flag("--([a-z0-9][a-z0-9-]*)");
  for (std::sregex_iterator it(message.begin(), message.end(), flag), end; it != end; ++it) {
    const std::string name = (*it)[1];
    if (name == "config" || std::find(named.begin(), named.end(), name) != named.end()) continue;
    bool typed = false;
    for (const std::string& a : args) typed |= a == "--" + name || a.rfind("--" + name + "=", 0) == 0;
    if (typed) continue;
    // In the file: a key `name` (TOML keys take the option's name, '-' or '_').
    std::ifstream in(config);
    std::string under = name;
    std::replace(under.begin(), under.end(), '-', '_');
    static const std::regex key_line("^\\s*([A-Za-z0-9_-]+)\\s*=");
    bool in_file = false;
    for (std::string line; std::getline(in, line) && !in_file;) {
      std::smatch m;
      if (!std::regex_search(line, m, key_line)) continue;
      std::string k = m[1];
      std::replace(k.begin(), k.end(), '-', '_');
      in_file = k == under;
    }
    if (in_file) named.push_back(name);
  }
  if (named.empty()) return message;
  std::string said = message + " (";
  for (size_t i = 0; i < named.size(); ++i) said += (i ? ", --" : "--") + named[i];
  return said + (named.size() == 1 ? " was" : " were") + " set in config file " + config + ")";
}

// The subcommand named on the command line ("" when none).
std::string subcommand_of(const std::vector<std::string>& reversed_args, const CLI::App& app) {
  for (size_t i = reversed_args.size(); i-- > 0;)
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      if (sub->get_name() == reversed_args[i]) return reversed_args[i];
  return "";
}

// `line` without its comment: from a '#' outside quotes, or a whole line that starts with ';'.
std::string without_comment(const std::string& line) {
  size_t b = line.find_first_not_of(" \t");
  if (b == std::string::npos || line[b] == ';') return "";
  char quote = 0;
  for (size_t i = b; i < line.size(); ++i) {
    char c = line[i];
    if (quote) {
      if (c == '\\' && quote == '"') ++i;  // an escaped character inside "..."
      else if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      return line.substr(0, i);
    }
  }
  return line;
}

// CLI11 reads the config file through a copy made here, for two things it gets wrong:
// keys before the first [section] belong to the subcommand being run (CLI11 reads them as the
// program's own), so the copy opens with [subcommand]; and CLI11 cuts a value at any '#', even
// one inside quotes ("/data/run#2"), so the copy has the comments taken out here, quotes
// respected, and CLI11's own comment character is set to one no file holds. Returns the path
// to give CLI11 and sets `tmp` to the copy to remove afterwards.
std::string config_for_cli11(const std::string& path, const std::string& sub, std::string& tmp) {
  std::ifstream f(path);
  if (!f) return path;  // CLI11 reports a missing file itself
  std::string text;
  bool flat = false, seen_key = false;
  for (std::string line; std::getline(f, line);) {
    line = without_comment(line);
    size_t b = line.find_first_not_of(" \t\r");
    if (b != std::string::npos && !seen_key) {
      seen_key = true;
      flat = line[b] != '[';
    }
    text += line + "\n";
  }
  char name[] = "/tmp/spotrain-config-XXXXXX";
  int fd = ::mkstemp(name);
  if (fd < 0) return path;
  ::close(fd);
  tmp = name;
  std::ofstream(tmp) << (flat && !sub.empty() ? "[" + sub + "]\n" : "") << text;
  return tmp;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = spotrain::cli;
  CLI::App app{"spotrain: data-parallel ResNet training that survives spot interruptions",
               "spotrain"};
  app.require_subcommand(1);
  // An unknown key in a config file is an error (subcommands inherit this when added).
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.set_config("--config", "", "read options from a TOML/INI file ([train] / [bench] sections)");
  app.get_config_formatter_base()->comment('\x01');  // comments: config_for_cli11 takes them out
  app.set_version_flag("--version", [] {
    const auto& g = spotrain::gpu_info();
    return spotrain::str("spotrain ", SPOTRAIN_VERSION, " (built with ", g.built_with, ")\n",
                         spotrain::gpu_info_line(g));
  }, "print the version, the GPU and the CUDA library versions, and exit");

  std::vector<cli::Command> commands{cli::add_train(app), cli::add_eval(app)};
  for (auto& c : cli::add_ckpt(app)) commands.push_back(c);
  for (auto& c : cli::add_data(app)) commands.push_back(c);
  commands.push_back(cli::add_bench(app));
  commands.push_back(cli::add_report(app));
  commands.push_back(cli::add_plan(app));
  commands.push_back(cli::add_doctor(app));
  commands.push_back(cli::add_batch(app));

  // --dry-run, anywhere on the line: parse and check, run nothing (taken out here so that
  // every subcommand accepts it after its own options).
  bool dry_run = false;
  app.add_flag("--dry-run", dry_run,
               "check the command line (and --config file) and exit: 0 when it would run; "
               "train also checks and prints its settings");
  std::vector<std::string> args = config_first(argc, argv);
  for (size_t i = args.size(); i-- > 0;)
    if (args[i] == "--dry-run") {
      dry_run = true;
      args.erase(args.begin() + long(i));
    }
  const std::string sub = subcommand_of(args, app);
  std::string config, tmp;
  for (size_t i = args.size(); i-- > 0;) {  // reversed: --config's value comes just before it
    if (args[i].rfind("--config=", 0) == 0) config = args[i].substr(9);
    if (args[i] == "--config" && i > 0) config = args[i - 1];
  }
  if (!config.empty()) {
    // A folder opens and reads as empty, and CLI11 would then train on the defaults.
    std::error_code ec;
    const auto st = std::filesystem::status(config, ec);
    const char* why = !std::filesystem::exists(st) ? "does not exist"
                      : !std::filesystem::is_regular_file(st) ? "is not a file"
                      : !std::ifstream(config) ? "cannot be read" : nullptr;
    if (why) {
      std::fprintf(stderr, "error: --config %s %s (pass a TOML file, e.g. examples/fashion-mnist/recipe-95.toml)\n",
                   config.c_str(), why);
      return 2;
    }
    std::string use = config_for_cli11(config, sub, tmp);
    for (size_t i = args.size(); i-- > 0;) {
      if (args[i].rfind("--config=", 0) == 0) args[i] = "--config=" + use;
      if (args[i] == "--config" && i > 0) args[i - 1] = use;
    }
  }
  struct RemoveTmp {
    std::string path;
    ~RemoveTmp() {
      if (!path.empty()) std::remove(path.c_str());
    }
  } remove_tmp{tmp};
  try {
    app.parse(args);
    if (!tmp.empty()) std::remove(tmp.c_str());  // read: gone before anything can abort
  } catch (const CLI::ConfigError& e) {
    std::string what = e.what();
    const std::string prefix = "INI was not able to parse ";
    if (what.rfind(prefix, 0) == 0)
      what = "unknown key '" + what.substr(prefix.size()) + "'";
    std::fprintf(stderr, "error: config file %s: %s (see spotrain %s --help for the keys)\n",
                 config.c_str(), what.c_str(), sub.c_str());
    return 2;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see spotrain --help)\n",
                 with_config_origin(e.what(), args, config).c_str());
    return 2;
  }
  try {
    for (auto& c : commands) {
      if (!c.app->parsed()) continue;
      if (!dry_run) return c.run();
      if (c.check) return c.check();
      const CLI::App* parent = c.app->get_parent();
      std::printf("spotrain %s%s --dry-run: the command line is valid\n",
                  parent && parent != &app ? (parent->get_name() + " ").c_str() : "",
                  c.app->get_name().c_str());
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", with_config_origin(e.what(), args, config).c_str());
    return 1;
  }
  return 0;
}
