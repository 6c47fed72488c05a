// `spotrain plan`: before paying for GPUs, the time and cost of a training run on each offer of
// a catalog (a TOML file: GPU model, GPUs per host, price on demand and as spot, how often a
// spot host is reclaimed, the notice, the network), per host count and purchase, from the
// speed this project measured (or the user's `bench --json` files), the checkpoint and restart
// costs of a real run (--from-run) or measured defaults, and the goodput model of
// run/goodput.h. Then the choice (cheapest before --deadline, fastest within --budget), its
// launch line, and the table as text, JSON, CSV and an offline HTML page. --check-sweep holds
// the model against the preempted runs bench/spot_sim.py measured.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <toml.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/data.h"
#include "layers/resnet.h"
#include "observe/metrics.h"
#include "run/config.h"
#include "run/goodput.h"
#include "run/plan.h"
#include "tools/spotrain/commands.h"
#include "tools/spotrain/report_assets.h"

namespace spotrain::cli {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// The command line: the work (PlanWork's fields, read through `w`) and what to do with the plan.
struct PlanOptions {
  std::string catalog;
  PlanWork w;
  int max_hosts = 64;
  bool mix = false;
  std::string deadline;
  double budget = 0;
  std::vector<std::string> bench;
  std::string from_run, json_out, csv_out, html_out, title, check_sweep;
  double overlap = 0.6;
  std::string recovery = "today";  // today | survivors (mpirun.sh HOST_DISCOVERY: docs/SCALING.md)
  bool show_unproven = false;
};

// ---- the plan ---------------------------------------------------------------------------------

using Row = PlanRow;

json row_json(const Row& r, const PlanOptions& o) {
  json mix = nullptr;  // a mix: each offer's hosts and each GPU's micro-batches per step
  if (r.with)
    mix = {{"offers", {r.offer->name, r.with->name}}, {"gpus", {r.offer->gpu, r.with->gpu}},
           {"hosts", {r.hosts, r.with_hosts}},
           {"micro_batches", {r.batch.count(0), r.batch.count(r.gpus() - 1)}}};
  return json{{"offer", r.fleet()},
              {"gpu", r.with ? r.offer->gpu + " + " + r.with->gpu : r.offer->gpu},
              {"purchase", r.spot ? "spot" : "on_demand"},
              {"hosts", r.all_hosts()},
              {"gpus", r.gpus()},
              {"mix", mix},
              {"price_per_host_hour", r.price},
              {"wall_seconds", r.wall_s},
              {"expected_reclaims", r.reclaims},
              {"goodput", r.g.goodput},
              {"work_seconds", r.work_s},
              {"step_efficiency", r.g.step_efficiency},
              {"cost_usd", r.cost},
              {"checkpoint_interval_seconds", r.spot ? json(r.g.interval_s) : json(nullptr)},
              {"notice_covers_stop", r.g.notice_covers_stop},
              {"batch_per_gpu", r.batch.micro},
              {"accum_steps", r.batch.count(0)},
              {"global_batch", r.batch.global()},
              {"beyond_evidence", r.unproven}};
}

// A wall time as a person reads it: seconds under two minutes, minutes under two hours, else hours.
std::string hours(double s) {
  if (s < 120) return fmt_fixed(s, s < 10 ? 1 : 0) + " s";
  return s < 7200 ? fmt_fixed(s / 60.0, s < 600 ? 1 : 0) + " min" : fmt_fixed(s / 3600.0, s < 36000 ? 2 : 1) + " h";
}

// Seconds with the digits that matter: 0.31 s, 4.2 s, 120 s.
std::string secs(double s) { return fmt_fixed(s, s < 1 ? 2 : s < 10 ? 1 : 0); }

std::string describe(const Row& r) {
  return str(r.fleet(), ", ", r.all_hosts(), r.all_hosts() == 1 ? " host" : " hosts", ", ", r.spot ? "spot" : "on demand",
             ": ", hours(r.wall_s), ", $", fmt_fixed(r.cost, 2), r.spot ? str(", ", fmt_fixed(r.reclaims, 2),
             " reclaims expected") : std::string());
}

// The command that runs the chosen row: the launcher with its ranks, the run's settings, a
// checkpoint interval from the reclaim rate on spot, and the plan kept with the run.
std::string launch_line(const Row& r, const PlanOptions& o) {
  const bool survivors = r.spot && r.all_hosts() > 1 && o.recovery == "survivors";
  std::string s = survivors ? "HOST_DISCOVERY='cat hosts.txt' MIN_HOSTS=1 " : "";
  if (r.offer->gpus_per_host > 1) s += str("RANKS_PER_NODE=", r.offer->gpus_per_host, " ");
  s += str("examples/resnet50/launch/mpirun.sh ", survivors ? "-" : "hosts.txt", " ", r.gpus(),
           " --model ", o.w.model, " --data ", o.w.data, " --precision ", o.w.precision, " --batch-size ", r.batch.micro,
           " --image-size ", o.w.image_size);
  // Each GPU starts from an even share of the global batch (a mix's then follows its speed).
  const int64_t accum = r.batch.units() / r.gpus();
  if (accum > 1) s += str(" --accum-steps ", accum);
  if (o.w.optimizer != "sgd") s += " --optimizer " + o.w.optimizer;
  s += o.w.steps > 0 ? str(" --steps ", o.w.steps) : str(" --epochs ", o.w.epochs);
  if (r.spot) {
    std::ostringstream mtbf;  // as short as it is exact: 12h, 0.25h; a mix's per host on average
    mtbf << (r.with ? r.all_hosts() / (r.hosts / r.offer->spot_mtbf_h + r.with_hosts / r.with->spot_mtbf_h)
                    : r.offer->spot_mtbf_h) << "h";
    s += " --ckpt-every auto --mtbf " + mtbf.str();
  }
  if (!o.json_out.empty()) s += " --plan " + o.json_out;
  return s;
}

// A CSV field: quoted when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\r\n") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::string t = "offer,gpu,purchase,hosts,gpus,price_per_host_hour,wall_hours,expected_reclaims,goodput,"
                  "cost_usd,checkpoint_interval_seconds\n";
  for (const Row& r : rows)
    t += str(csv_field(r.fleet()), ",", csv_field(r.with ? r.offer->gpu + " + " + r.with->gpu : r.offer->gpu), ",",
             r.spot ? "spot" : "on_demand", ",", r.all_hosts(), ",", r.gpus(), ",", r.price, ",",
             fmt_fixed(r.wall_s / 3600.0, 4), ",",
             fmt_fixed(r.reclaims, 3), ",", fmt_fixed(r.g.goodput, 4), ",", fmt_fixed(r.cost, 2), ",",
             r.spot ? fmt_fixed(r.g.interval_s, 1) : std::string(), "\n");
  write_file_atomic(path, t, "the --csv file");
}

void write_html(const std::string& path, const json& plan) {
  SPOTRAIN_CHECK(!chartjs_source().empty(),
                 "plan: this spotrain was built without Chart.js, so it cannot draw a page; install Debian's "
                 "libjs-chart.js and rebuild (--json and --csv work without it)");
  write_file_atomic(path, fill_page(plan_page_template(), plan.dump(-1, ' ', false, json::error_handler_t::replace)),
                    "the plan's page");
}

// --check-sweep: the model against bench/spot_sim.py's measured runs (its JSON lines). Each
// run is predicted from its own costs (start-up, restart, checkpoint interval and cost, count
// of reclaims), none of it from its wall time: what the model adds is the work a hard reclaim
// loses and that nothing else takes time.
int run_check_sweep(const std::string& path) {
  std::ifstream in(path);
  SPOTRAIN_CHECK(in, "--check-sweep ", path, " cannot be read");
  struct Line {
    MeasuredSpotRun run;
    std::string interval;
    int64_t seed = 0;
    bool has_startup = false;
  };
  std::vector<Line> runs;
  int skipped = 0, line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    const std::string where = str("--check-sweep ", path, " line ", line_no);
    SPOTRAIN_CHECK(j.is_object(), where, " is not a JSON object");
    if (j.contains("failed") && j["failed"].is_boolean() && j["failed"].get<bool>()) {
      ++skipped;
      continue;
    }
    auto num = [&](const char* k) {
      SPOTRAIN_CHECK(j.contains(k) && (j[k].is_number() || j[k].is_null()), where, ": '", k,
                     "' is missing or not a number (a line of bench/spot_sim.py --json?)");
      return j[k].is_null() ? 0.0 : j[k].get<double>();
    };
    Line l;
    MeasuredSpotRun& r = l.run;
    if (j.contains("recovery")) {
      SPOTRAIN_CHECK(j["recovery"] == "today" || j["recovery"] == "survivors", where,
                     ": 'recovery' must be \"today\" or \"survivors\"");
      r.recovery = j["recovery"];
    }
    r.hosts = num("hosts");
    r.mtbf_s = num("mtbf_s");
    r.step_time_s = num("step_time_s");
    r.wall_s = num("wall_s");
    r.lost_s = num("lost_s");
    r.restarts = num("restarts");
    r.preemptions = num("preemptions");
    r.checkpoints = num("checkpoints");
    r.checkpoint_held_s = num("checkpoint_held_s");
    r.restart_s = num("restart_to_first_step_s");
    r.goodput = num("goodput");
    SPOTRAIN_CHECK(r.hosts >= 1 && r.mtbf_s > 0 && r.step_time_s > 0 && r.wall_s > 0, where,
                   ": hosts, mtbf_s, step_time_s and wall_s must be positive");
    l.has_startup = j.contains("startup_s") && j["startup_s"].is_number();
    r.startup_s = l.has_startup ? j["startup_s"].get<double>() : 0.0;
    l.interval = j.contains("ckpt_every") ? (j["ckpt_every"].is_string() ? j["ckpt_every"].get<std::string>()
                                                                          : j["ckpt_every"].dump())
                                          : "-";
    l.seed = j.contains("seed") && j["seed"].is_number_integer() ? j["seed"].get<int64_t>() : 0;
    runs.push_back(l);
  }
  SPOTRAIN_CHECK(!runs.empty(), "--check-sweep ", path, " holds no measured run");
  // A run that never restarted measured no start-up of its own: the sweep's median start-up.
  std::vector<double> startups;
  for (const Line& l : runs)
    if (l.has_startup) startups.push_back(l.run.startup_s);
  const double sweep_startup = startups.empty() ? 0.0 : median_of(startups);

  std::printf("%-9s %6s %9s %5s %9s %9s %7s %11s %9s %9s %12s\n", "recovery", "mtbf", "interval", "seed", "measured",
              "model", "ratio", "preemptions", "restart", "start-up", "at expected");
  int off = 0;
  double worst = 1, measured_reclaims = 0, expected_reclaims = 0, lost = 0, lost_model = 0;
  std::vector<double> at_expected;  // measured / the model at the expected count of failures
  for (Line& l : runs) {
    MeasuredSpotRun& r = l.run;
    if (!l.has_startup) r.startup_s = sweep_startup;
    const double model = predicted_goodput(r);
    const double ratio = r.goodput / std::max(model, 1e-9);
    const double expected = expected_goodput(r);
    at_expected.push_back(r.goodput / std::max(expected, 1e-9));
    // The simulator preempts only while the job trains: its failures come at the job MTBF over
    // the training time.
    measured_reclaims += r.preemptions;
    expected_reclaims += (r.step_time_s + r.lost_s) * r.hosts / r.mtbf_s;
    if (r.recovery != "survivors") {
      lost += r.lost_s;
      lost_model += r.preemptions * (r.step_time_s + r.checkpoint_held_s) / std::max(r.checkpoints, 1.0) / 2.0;
    }
    off += std::fabs(ratio - 1) > 0.15;
    worst = std::fabs(ratio - 1) > std::fabs(worst - 1) ? ratio : worst;
    std::printf("%-9s %6g %9s %5lld %9.3f %9.3f %7.3f %11g %8.2fs %8.2fs%s %12.3f\n", r.recovery.c_str(), r.mtbf_s,
                l.interval.c_str(), static_cast<long long>(l.seed), r.goodput, model, ratio, r.preemptions,
                r.restart_s, r.startup_s, l.has_startup ? " " : "*", expected);
  }
  std::sort(at_expected.begin(), at_expected.end());
  double mean_expected = 0;
  for (double v : at_expected) mean_expected += v / double(at_expected.size());
  if (startups.size() < runs.size())
    std::printf("* start-up: the sweep's median (%.2f s; the run never restarted, so measured none)\n", sweep_startup);
  std::printf("work lost to hard reclaims: %.1f s measured, %.1f s by the model (half an interval and half a "
              "checkpoint each)\n", lost, lost_model);
  std::printf("at the expected count of failures instead of each run's own (what a plan can know): measured / model "
              "%.2f-%.2f, mean %.3f; reclaims %g measured against %.1f expected from the MTBF\n",
              at_expected.front(), at_expected.back(), mean_expected, measured_reclaims, expected_reclaims);
  std::printf("%zu run(s)%s: the model within 15%% of %zu; the worst ratio (measured / model) %.3f\n", runs.size(),
              skipped ? str(" (", skipped, " whose job failed left out)").c_str() : "", runs.size() - size_t(off), worst);
  return off ? 1 : 0;
}

int run_plan(const PlanOptions& o) {
  if (!o.check_sweep.empty()) return run_check_sweep(o.check_sweep);
  SPOTRAIN_CHECK(!o.catalog.empty(), "plan: pass --catalog FILE (an example: examples/offers.toml)");
  SPOTRAIN_CHECK(o.w.epochs > 0 || o.w.steps > 0, "--epochs or --steps must be positive");
  SPOTRAIN_CHECK(o.w.images_per_epoch > 0, "--images-per-epoch must be positive");
  SPOTRAIN_CHECK(o.w.batch_size > 0, "--batch-size must be positive");
  SPOTRAIN_CHECK(o.w.global_batch >= 0, "--global-batch must not be negative (0: GPUs x --batch-size)");
  SPOTRAIN_CHECK(o.max_hosts >= 1 && o.max_hosts <= 65536, "--max-hosts must be in [1, 65536]");
  SPOTRAIN_CHECK(o.budget >= 0, "--budget must not be negative");
  SPOTRAIN_CHECK(o.overlap >= 0 && o.overlap <= 1, "--overlap must be in [0, 1]");
  SPOTRAIN_CHECK(o.recovery == "today" || o.recovery == "survivors", "--recovery must be today or survivors");
  check_resnet_options(o.w.model, "none");
  check_data_spec(o.w.data);  // "synthetic:" is no data spec: not a run that reads files either
  double deadline_s = 0;
  if (!o.deadline.empty()) {
    try {
      deadline_s = parse_duration(o.deadline);
    } catch (const Error& e) {
      SPOTRAIN_THROW("--deadline: ", e.what());
    }
  }
  json about;
  const std::vector<Offer> offers = read_catalog(o.catalog, &about);
  std::vector<BenchFile> benches;
  for (const std::string& b : o.bench) benches.push_back(read_bench(b));
  PlanInput in;
  in.work = o.w;
  in.max_hosts = o.max_hosts;
  in.mix = o.mix;
  in.overlap = o.overlap;
  in.recovery = o.recovery;
  in.costs = costs_from(o.from_run);
  in.show_unproven = o.show_unproven;
  const RunCosts& costs = in.costs;
  const Planned planned = plan_offers(in, offers, benches);
  const std::vector<Row>& rows = planned.rows;
  const json& speeds = planned.speeds;
  const json& left_out = planned.left_out;
  const int64_t nparams = planned.parameters;
  for (const json& l : left_out)
    log_info(str("not planned: ", l["offer"].get<std::string>(), ": ", l["why"].get<std::string>()));
  for (const std::string& h : planned.hopeless) log_info("not planned: " + h);
  // Fleets whose global batch cannot be reached or would not converge: one line per offer (the
  // smallest host count left out, the reason), not one per row.
  {
    std::string last;
    for (const json& l : planned.batch_left_out) {
      if (l["offer"] == last) continue;
      last = l["offer"];
      log_info(str("not planned: ", last, " from ", l["hosts"].get<int>(), " hosts: ", l["why"].get<std::string>()));
    }
  }
  SPOTRAIN_CHECK(!rows.empty(), "no offer of ", o.catalog, " can be planned: ",
                 left_out.empty() ? (!planned.batch_left_out.empty() ? planned.batch_left_out[0]["why"].get<std::string>()
                                     : planned.hopeless.empty() ? std::string("none given") : planned.hopeless[0])
                                  : str(left_out[0]["offer"].get<std::string>(), ": ", left_out[0]["why"].get<std::string>(),
                                        left_out.size() > 1 ? str(" (and ", left_out.size() - 1, " more above)") : ""));

  // The choice.
  const PlanChoice choice = choose_row(rows, deadline_s, o.budget);
  auto meets = [&](const Row& r) { return choice.meets(r); };
  auto within = [&](const Row& r) { return choice.within(r); };
  const Row* cheapest = choice.cheapest;
  const Row* fastest = choice.fastest;
  const Row* chosen = choice.chosen;

  // The table.
  std::printf("plan: %s %s at %dx%d, %s, %s, %s; catalog %s%s; spot recovery: %s\n", o.w.model.c_str(),
              o.w.precision.c_str(), o.w.image_size, o.w.image_size,
              o.w.steps > 0 ? str(o.w.steps, " steps").c_str() : str(o.w.epochs, " epochs of ", o.w.images_per_epoch, " images").c_str(),
              o.w.global_batch > 0 ? str("global batch ", o.w.global_batch, " (at most ", o.w.batch_size, " per GPU, accumulated)").c_str()
                                   : str("batch ", o.w.batch_size, " per GPU").c_str(),
              o.w.optimizer.c_str(), o.catalog.c_str(),
              about.contains("date") ? str(" (prices of ", about["date"].get<std::string>(), ")").c_str() : "",
              o.recovery == "survivors" ? "the survivors go on (HOST_DISCOVERY)" : "restart from the latest checkpoint");
  std::printf("%-24s %-9s %5s %5s %9s %10s %9s %8s %11s %10s %s\n", "offer", "purchase", "hosts", "GPUs",
              "batch/GPU", "wall", "reclaims", "goodput", "cost (USD)", "ckpt every",
              deadline_s > 0 || o.budget > 0 ? "meets" : "");
  for (const Row& r : rows) {
    const std::string mark = deadline_s > 0 || o.budget > 0 ? (meets(r) && within(r) ? "yes" : "no") : "";
    // A mix: its GPUs and hosts of each, and each GPU's micro-batches (the first offer's, the second's).
    const std::string batch =
        r.with ? str(r.batch.micro, "x", r.batch.count(0), "/", r.batch.count(r.gpus() - 1), r.unproven ? "!" : "")
               : str(r.batch.micro, r.batch.count(0) > 1 ? str("x", r.batch.count(0)) : std::string(), r.unproven ? "!" : "");
    const std::string fleet =
        r.with ? str(r.offer->gpu, " x", r.hosts, " + ", r.with->gpu, " x", r.with_hosts) : r.offer->name;
    std::printf("%-24s %-9s %5d %5d %9s %10s %9s %8.3f %11.2f %10s %s%s\n", fleet.substr(0, 24).c_str(),
                r.spot ? "spot" : "on demand", r.all_hosts(), r.gpus(), batch.c_str(),
                hours(r.wall_s).c_str(),
                r.spot ? fmt_fixed(r.reclaims, 2).c_str() : "-", r.g.goodput, r.cost,
                r.spot ? (fmt_fixed(r.g.interval_s, 0) + " s").c_str() : "epoch ends", mark.c_str(),
                &r == chosen ? "  <- chosen" : "");
  }
  int smallest = o.w.batch_size;
  for (const Row& r : rows) smallest = std::min(smallest, int(r.batch.micro));
  if (smallest < o.w.batch_size)
    log_info(str("note: some fleets reach the global batch with fewer than ", o.w.batch_size,
                 " images per GPU (down to ", smallest, "): their rows take the speed measured at the batch named "
                 "below, and a GPU given fewer images a step is usually slower; measure one with spotrain bench "
                 "--batch-size N"));
  if (o.show_unproven)
    for (const Row& r : rows)
      if (r.unproven) {
        log_info(str("!: a global batch beyond the evidence (", planned.evidence.max_global, " for ", o.w.optimizer,
                     "): shown because of --show-unproven; ", planned.evidence.source));
        break;
      }
  for (const json& s : speeds)
    log_info(str("speed of ", s["offer"].get<std::string>(), ": ", fmt_fixed(s["images_per_sec_per_gpu"].get<double>(), 1),
                 " images/s per GPU, ", s["source"].get<std::string>(),
                 s["measured_at_batch"] != o.w.batch_size
                     ? str(", measured at batch ", s["measured_at_batch"].get<int>(), ", not ", o.w.batch_size)
                     : std::string(),
                 "; several GPUs: ", s["scaling_source"].get<std::string>()));
  log_info(str("checkpoint cost ", fmt_fixed(costs.ckpt_cost_s, 3), " s (", costs.ckpt_source, "), write ",
               fmt_fixed(costs.ckpt_write_s, 2), " s (", costs.write_source, "), restart ",
               secs(costs.restart_s), " s (", costs.restart_source, "), start-up ", secs(costs.startup_s),
               " s (", costs.startup_source, "), ranks' spread ", fmt_fixed(costs.rank_spread, 2), "x (",
               costs.spread_source, "); the goodput model: docs/SCALING.md"));
  if (cheapest) log_info("cheapest" + (deadline_s > 0 ? " within " + o.deadline : std::string()) + ": " + describe(*cheapest));
  if (fastest) log_info("fastest" + (o.budget > 0 ? " within $" + fmt_fixed(o.budget, 2) : std::string()) + ": " + describe(*fastest));

  json plan{{"generated", utc_time_iso()},
            {"title", o.title.empty() ? str("spotrain plan: ", o.w.model, " ", o.w.precision, ", ",
                                            o.w.steps > 0 ? str(o.w.steps, " steps") : str(o.w.epochs, " epochs"))
                                      : o.title},
            {"work", {{"model", o.w.model}, {"precision", o.w.precision}, {"image_size", o.w.image_size},
                      {"batch_per_gpu", o.w.batch_size}, {"global_batch", o.w.global_batch > 0 ? json(o.w.global_batch) : json(nullptr)},
                      {"optimizer", o.w.optimizer}, {"data", o.w.data},
                      {"epochs", o.w.steps > 0 ? json(nullptr) : json(o.w.epochs)},
                      {"steps", o.w.steps > 0 ? json(o.w.steps) : json(nullptr)},
                      {"images_per_epoch", o.w.images_per_epoch}, {"parameters", nparams}}},
            {"catalog", {{"path", o.catalog}, {"about", about}}},
            {"recovery", o.recovery},
            {"deadline_seconds", deadline_s > 0 ? json(deadline_s) : json(nullptr)},
            {"budget_usd", o.budget > 0 ? json(o.budget) : json(nullptr)},
            {"speeds", speeds},
            {"left_out", left_out},
            {"left_out_for_batch", planned.batch_left_out},
            {"batch_evidence", {{"max_global_batch", planned.evidence.max_global > 0 ? json(planned.evidence.max_global) : json(nullptr)},
                                {"source", planned.evidence.source}}},
            {"costs", {{"checkpoint_cost_seconds", costs.ckpt_cost_s}, {"checkpoint_cost_source", costs.ckpt_source},
                       {"checkpoint_write_seconds", costs.ckpt_write_s}, {"checkpoint_write_source", costs.write_source},
                       {"restart_seconds", costs.restart_s}, {"restart_source", costs.restart_source},
                       {"startup_seconds", costs.startup_s}, {"startup_source", costs.startup_source},
                       {"rank_spread", costs.rank_spread}, {"rank_spread_source", costs.spread_source}}},
            {"rows", json::array()},
            {"cheapest", cheapest ? row_json(*cheapest, o) : json(nullptr)},
            {"fastest", fastest ? row_json(*fastest, o) : json(nullptr)},
            {"chosen", chosen ? row_json(*chosen, o) : json(nullptr)},
            {"launch", chosen ? json(launch_line(*chosen, o)) : json(nullptr)}};
  for (const Row& r : rows) plan["rows"].push_back(row_json(r, o));
  if (!o.json_out.empty())
    write_file_atomic(o.json_out, plan.dump(2, ' ', false, json::error_handler_t::replace) + "\n", "the --json file");
  if (!o.csv_out.empty()) write_csv(o.csv_out, rows);
  if (!o.html_out.empty()) {
    write_html(o.html_out, plan);
    log_info(str("wrote ", o.html_out, " (cost against finish time per offer; opens offline)"));
  }
  if (!chosen) {
    // The nearest miss: the fastest when no row meets the deadline; else the cheapest of those
    // that meet it (over the budget by the least); with a budget alone, the cheapest.
    const Row* near = cheapest;
    if (!near)
      for (const Row& r : rows)
        if (!near || r.wall_s < near->wall_s) near = &r;
    std::printf("no offer meets %s%s%s; the nearest miss: %s\n",
                deadline_s > 0 ? ("the " + o.deadline + " deadline").c_str() : "",
                deadline_s > 0 && o.budget > 0 ? " and " : "",
                o.budget > 0 ? ("the $" + fmt_fixed(o.budget, 2) + " budget").c_str() : "", describe(*near).c_str());
    return 0;
  }
  std::printf("chosen: %s\n", describe(*chosen).c_str());

  std::printf("launch: %s\n", launch_line(*chosen, o).c_str());
  if (chosen->with)
    std::printf("hosts.txt: %d host(s) of %s and %d of %s, one a line; each GPU's share of the global batch follows "
                "its speed as the job runs (--straggler-action rebalance, the default)\n",
                chosen->hosts, chosen->offer->name.c_str(), chosen->with_hosts, chosen->with->name.c_str());
  if (chosen->spot && chosen->g.notice_covers_stop)
    std::printf("note: the goodput of %s counts on its %s s notice: add your provider's --preempt-notice (aws, gcp, "
                "azure or a URL) to the launch line, or deliver the notice as SIGTERM, so that a reclaim stops with "
                "a checkpoint (docs/MULTI_NODE.md)\n",
                chosen->offer->name.c_str(), fmt_fixed(chosen->offer->notice_s, 0).c_str());
  return 0;
}

}  // namespace

Command add_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  auto* p = app.add_subcommand(
      "plan", "before paying for GPUs: the time and cost of a run on each offer of a catalog, per host count, "
              "spot or on demand, from measured speed and measured recovery; the cheapest before --deadline, "
              "the fastest within --budget, and the launch line");
  p->add_option("--catalog", o->catalog, "the offers: a TOML file (an example: examples/offers.toml)");
  p->add_option("--model", o->w.model, "the model")->capture_default_str();
  p->add_option("--precision", o->w.precision, "fp32|tf32|bf16|fp16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}))->capture_default_str();
  p->add_option("--image-size", o->w.image_size, "image side")->capture_default_str();
  p->add_option("--num-classes", o->w.num_classes, "classes (the gradient size)")->capture_default_str();
  p->add_option("--batch-size", o->w.batch_size,
                "images per GPU and step (with --global-batch: the most per GPU and micro-batch, its memory limit)")
      ->capture_default_str();
  p->add_option("--epochs", o->w.epochs, "epochs of --images-per-epoch")->capture_default_str();
  p->add_option("--steps", o->w.steps, "steps instead of epochs (0 = use --epochs)");
  p->add_option("--images-per-epoch", o->w.images_per_epoch, "images per epoch (default: ImageNet-1k's)")
      ->capture_default_str();
  p->add_option("--data", o->w.data,
                "what the run reads (its launch line's --data): a run from files is priced at a rate measured "
                "from files where one is known; synthetic at the compute-only rate")
      ->capture_default_str();
  p->add_option("--optimizer", o->w.optimizer,
                "sgd|lars: the optimizer of the run, which decides the largest global batch with evidence that it "
                "reaches the model's accuracy (docs/RECIPES.md)")
      ->check(CLI::IsMember({"sgd", "lars"}))->capture_default_str();
  p->add_option("--global-batch", o->w.global_batch,
                "images per optimizer step, whatever the fleet (a recipe's; e.g. 3200 for the MLPerf recipe): each "
                "fleet reaches it with micro-batches of at most --batch-size per GPU and --accum-steps "
                "(0: GPUs x --batch-size)")
      ->capture_default_str();
  p->add_flag("--show-unproven", o->show_unproven,
              "keep the fleets whose global batch is beyond the evidence, marked, instead of leaving them out");
  p->add_option("--max-hosts", o->max_hosts, "host counts 1, 2, 4, ... up to this")->capture_default_str();
  p->add_flag("--mix", o->mix,
              "also price fleets that mix hosts of two offers of other GPUs (as many GPUs per host) in one job: "
              "each GPU's share of the global batch follows its speed, as training's does (rows 'A100 x2 + H100 x1', "
              "batch/GPU 'micro x the first offer's micro-batches / the second's', in the catalog's order)");
  p->add_option("--deadline", o->deadline, "the run must end within this, e.g. 24h, 90m");
  p->add_option("--budget", o->budget, "the run must cost at most this many USD");
  p->add_option("--bench", o->bench,
                "`spotrain bench --json` files of the GPU models to plan (one per model; a multi-rank "
                "one gives the scaling); else the speeds this project measured");
  p->add_option("--from-run", o->from_run,
                "a run folder (or its metrics.jsonl) whose checkpoint cost and restart time to use");
  p->add_option("--overlap", o->overlap, "share of a step backward hides the all-reduce under")
      ->capture_default_str();
  p->add_option("--recovery", o->recovery,
                "after a hard reclaim on spot: today (restart from the latest checkpoint on a full set of hosts) "
                "or survivors (the hosts left save the last step and go on at once, mpirun.sh HOST_DISCOVERY; "
                "docs/SCALING.md)")
      ->check(CLI::IsMember({"today", "survivors"}))->capture_default_str();
  p->add_option("--json", o->json_out, "write the plan as JSON (train --plan FILE keeps it with the run)");
  p->add_option("--csv", o->csv_out, "write the table as CSV");
  p->add_option("-o,--html", o->html_out, "write an offline HTML page: cost against finish time per offer");
  p->add_option("--title", o->title, "the page's title");
  p->add_option("--check-sweep", o->check_sweep,
                "instead of planning: the model against bench/spot_sim.py's measured runs (their JSON "
                "lines); exit 1 when a run is more than 15% from it");
  return {p, [o] { return run_plan(*o); }};
}

}  // namespace spotrain::cli
