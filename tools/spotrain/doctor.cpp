// `spotrain doctor`: checks this node before a run pays for it (health/doctor.h): one line
// per check, ok, warn or fail with its figure and limit, exit 0 when healthy and 1 when not;
// --json FILE writes the same checks for a launcher or a fleet's health gate. --links, under
// mpirun with one rank per host, checks the network between the hosts instead (health/links.h).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/atomic_file.h"
#include "core/clock.h"
#include "core/log.h"
#include "comm/communicator.h"
#include "health/doctor.h"
#include "health/links.h"
#include "run/config.h"
#include "tools/spotrain/commands.h"

namespace spotrain::cli {

namespace {

struct DoctorArgs {
  health::DoctorOptions opt;
  std::string json;
  bool links = false;
  health::LinkOptions link;
  double link_mb = 4;
};

// --links: the link check across the ranks of this MPI job; rank 0 prints and writes the JSON.
int run_links_command(const DoctorArgs& a) {
  health::LinkOptions opt = a.link;
  opt.bytes = opt.allreduce_bytes = size_t(a.link_mb * double(1 << 20));
  std::unique_ptr<Communicator> comm = make_communicator("auto");
  const bool root = comm->rank() == 0;
  if (root && comm->size() >= 2) {
    std::printf("spotrain doctor --links: the network between %d hosts (one line a host)\n", comm->size());
    std::fflush(stdout);
  }
  const health::LinkReport rep = health::run_link_check(*comm, opt, [](const health::DoctorCheck& c) {
    std::printf("%s\n", c.line().c_str());
    std::fflush(stdout);
  });
  const bool ok = health::healthy(rep.checks);
  if (!root) return 0;
  int failed = 0;
  for (const auto& c : rep.checks) failed += c.verdict == health::Verdict::fail;
  std::printf("doctor --links: %s: %zu hosts, %d failed, in %.1f s\n", ok ? "healthy" : "NOT healthy",
              rep.hosts.size(), failed, rep.seconds);
  if (!a.json.empty()) {
    nlohmann::json j;
    j["healthy"] = ok;
    j["seconds"] = rep.seconds;
    j["allreduce_bus_bytes_per_sec"] = rep.allreduce_bus_bytes_per_sec;
    for (size_t i = 0; i < rep.hosts.size(); ++i)
      j["hosts"].push_back({{"name", rep.hosts[i].name}, {"bytes_per_sec", rep.hosts[i].bytes_per_sec},
                            {"best_peer", rep.hosts[i].best_peer},
                            {"verdict", health::verdict_name(rep.checks[i].verdict)}});
    for (const auto& c : rep.checks)
      j["checks"].push_back({{"name", c.name}, {"verdict", health::verdict_name(c.verdict)},
                             {"figure", c.figure}, {"limit", c.limit}});
    write_file_atomic(a.json, j.dump(2) + "\n", "the --json file");
  }
  return ok ? 0 : 1;
}

int run_doctor_command(const DoctorArgs& a) {
  if (a.links) return run_links_command(a);
  if (a.opt.threads > 0) check_thread_counts(a.opt.threads, 1);
  const double t0 = now_seconds();
  std::printf("spotrain doctor: is this node fit to train? (one line a check)\n");
  std::fflush(stdout);
  const std::vector<health::DoctorCheck> checks = health::run_doctor(a.opt, [](const health::DoctorCheck& c) {
    std::printf("%s\n", c.line().c_str());
    std::fflush(stdout);
  });
  int failed = 0, warned = 0;
  for (const auto& c : checks) {
    failed += c.verdict == health::Verdict::fail;
    warned += c.verdict == health::Verdict::warn;
  }
  const double secs = now_seconds() - t0;
  const bool ok = health::healthy(checks);
  std::printf("doctor: %s: %zu checks, %d failed, %d warned, in %.1f s\n",
              ok ? "healthy" : "NOT healthy", checks.size(), failed, warned, secs);
  if (!a.json.empty()) {
    nlohmann::json j;
    j["healthy"] = ok;
    j["seconds"] = secs;
    j["host"] = host_name();
    for (const auto& c : checks)
      j["checks"].push_back({{"name", c.name}, {"verdict", health::verdict_name(c.verdict)},
                             {"figure", c.figure}, {"limit", c.limit}});
    write_file_atomic(a.json, j.dump(2) + "\n", "the --json file");
  }
  return ok ? 0 : 1;
}

}  // namespace

Command add_doctor(CLI::App& app) {
  auto a = std::make_shared<DoctorArgs>();
  auto* d = app.add_subcommand("doctor",
                               "check this node before a run: ops against the float64 reference, a few "
                               "training steps' speed and memory and their fast paths' first-use checks, "
                               "GPU health, the checkpoint folder");
  d->add_option("--device", a->opt.device, "auto|cpu|cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  d->add_option("--precision", a->opt.precision,
                "check one precision (fp32|tf32|bf16|fp16); default: each the device runs for the ops, "
                "fp16 on a GPU and fp32 on the CPU for the steps")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  d->add_option("--ckpt-dir", a->opt.ckpt_dir, "the checkpoint folder to check (room for --keep, write rate)");
  d->add_option("--keep", a->opt.keep, "checkpoints the run keeps")->capture_default_str();
  d->add_option("--model", a->opt.model, "the model the training steps run")->capture_default_str();
  d->add_option("--batch-size", a->opt.batch_size, "the steps' batch (0: 16 on a CPU, 256 on a GPU)")
      ->capture_default_str();
  d->add_option("--steps", a->opt.steps, "timed training steps")->capture_default_str();
  d->add_option("--threads", a->opt.threads, "CPU threads (0 = all cores)")->capture_default_str();
  d->add_option("--json", a->json, "also write the checks as JSON to FILE");
  d->add_flag("--links", a->links,
              "check the network instead, under mpirun with one rank per host: every pair of hosts "
              "point to point, each host's best pair against the median, and one all-reduce");
  d->add_option("--link-mb", a->link_mb, "--links: MiB each message carries")
      ->check(CLI::Range(0.001, 1024.0))->capture_default_str();
  d->add_option("--link-min-share", a->link.min_share,
                "--links: a host fails below this share of the median host's rate")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  d->add_option("--link-min-gbps", a->link.min_gbps, "--links: a host fails below this many Gbit/s (0: no floor)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  d->add_option("--names", a->link.names, "--links: the hosts' names in rank order (default: host names)")
      ->delimiter(',');
  return {d, [a] { return run_doctor_command(*a); }};
}

}  // namespace spotrain::cli
