// `spotrain report RUN...`: one self-contained HTML page (opens offline; Chart.js is embedded)
// from the metrics of one or more run folders — loss, accuracy, learning rate, images/s,
// data wait, GPU utilisation and memory over steps or wall time with checkpoint, stop and
// resume markers; the per-phase step time; evaluation results; settings and machine; cost at
// --price-per-hour — and with --csv, the same records as one CSV table for spreadsheets.
#include "tools/spotrain/commands.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "observe/metrics.h"
#include "core/log.h"
#include "tools/spotrain/report_assets.h"

namespace spotrain::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ReportOptions {
  std::vector<std::string> runs;
  std::string output, csv, title;
  double price_per_hour = 0;
};

struct Run {
  std::string name, metrics_path;
  std::vector<json> records;
  std::vector<json> evals;  // eval*.json files in the run folder (spotrain eval --json)
  json plan;                // the run folder's plan.json (train --plan), or null
  int64_t torn = 0;         // lines skipped: cut by a kill, or not a record of the schema
  int64_t superseded = 0;   // records of steps a resume trained again (left out)
};

// Leaves out the records a resume rolled back: those marked "superseded", and (in files written
// before the mark) any record with a step after a later resume record's step. What is left is
// one history. Returns how many went.
int64_t drop_superseded(std::vector<json>& records) {
  // A record is rolled back when a resume after it went on from an earlier step: walking back,
  // the smallest step a later resume went on from.
  std::vector<bool> gone(records.size(), false);
  int64_t from = std::numeric_limits<int64_t>::max();
  for (size_t i = records.size(); i-- > 0;) {
    const json& r = records[i];
    const bool has_step = r.contains("step");
    if ((r.contains("superseded") && r["superseded"] == true) || (has_step && r["step"].get<int64_t>() > from))
      gone[i] = true;
    if (r["type"] == "resume" && has_step) from = std::min(from, r["step"].get<int64_t>());
  }
  std::vector<json> kept;
  for (size_t i = 0; i < records.size(); ++i)
    if (!gone[i]) kept.push_back(std::move(records[i]));
  const int64_t n = int64_t(records.size() - kept.size());
  records = std::move(kept);
  return n;
}

Run load_run(const std::string& arg) {
  Run r;
  fs::path p(arg);
  SPOTRAIN_CHECK(fs::exists(p), "report: ", arg, " does not exist (pass a run folder or its metrics.jsonl)");
  fs::path folder = fs::is_directory(p) ? p : p.parent_path();
  r.metrics_path = fs::is_directory(p) ? (p / "metrics.jsonl").string() : p.string();
  SPOTRAIN_CHECK(fs::is_regular_file(r.metrics_path), "report: ", arg, " has no metrics.jsonl (was it trained with --metrics none?)");
  fs::path named = fs::is_directory(p) ? p : p.parent_path();
  r.name = fs::absolute(named).lexically_normal().filename().string();
  if (r.name.empty()) r.name = fs::absolute(named).lexically_normal().parent_path().filename().string();
  MetricsFile file = read_metrics_file(r.metrics_path);
  r.records = std::move(file.records);
  r.torn = file.torn;
  SPOTRAIN_CHECK(!r.records.empty(), "report: ", r.metrics_path, " holds no metrics records");
  r.superseded = drop_superseded(r.records);
  std::vector<fs::path> evals;
  for (const auto& e : fs::directory_iterator(folder.empty() ? fs::path(".") : folder)) {
    const std::string f = e.path().filename().string();
    if (e.is_regular_file() && f.rfind("eval", 0) == 0 && e.path().extension() == ".json") evals.push_back(e.path());
  }
  std::sort(evals.begin(), evals.end());
  const fs::path plan = (folder.empty() ? fs::path(".") : folder) / "plan.json";
  if (fs::is_regular_file(plan)) {  // what `spotrain plan` predicted for this run
    std::ifstream pf(plan);
    json j = json::parse(pf, nullptr, false);
    if (j.is_object() && j.contains("chosen") && j["chosen"].is_object()) r.plan = j["chosen"];
    else log_info(str("report: ", plan.string(), " holds no plan with a chosen offer; left out"));
  }
  for (const auto& e : evals) {
    std::ifstream ef(e);
    json j = json::parse(ef, nullptr, false);
    if (j.is_object()) {
      j["file"] = e.filename().string();
      r.evals.push_back(j);
    }
  }
  return r;
}


// A record's field, or `fallback` when it is missing or of another type: a record that an
// importer or a hand edit got wrong never stops the page.
template <typename T>
T field(const json& rec, const char* key, T fallback) {
  if (!rec.is_object() || !rec.contains(key)) return fallback;
  const json& v = rec[key];
  if constexpr (std::is_same_v<T, std::string>) return v.is_string() ? v.get<std::string>() : fallback;
  else if constexpr (std::is_same_v<T, int64_t>) return v.is_number_integer() ? v.get<int64_t>() : fallback;
  else return v.is_number() ? v.get<T>() : fallback;
}

json num_or_null(const json& obj, const char* key, double scale = 1.0) {
  if (obj.is_object() && obj.contains(key) && obj[key].is_number()) return obj[key].get<double>() * scale;
  return nullptr;
}

// Each rank's times over the run (the step records' "ranks", several ranks only): per rank and
// host its median compute, input and wait per step and their shares of its step, how many
// windows named it a straggler, which is the slowest (compute and input); and each rank's
// compute per window over steps for the chart. Null for a one-rank run.
json rank_times(const std::vector<json>& records, const std::function<json(const json&)>& wall_h) {
  struct Acc {
    std::string host;
    std::vector<double> compute, input, wait;
    std::vector<double> share;  // of the global batch, per window that recorded it
    int64_t named = 0;
  };
  std::map<std::pair<int64_t, std::string>, Acc> acc;  // by rank and host: a restart may move ranks
  json series = {{"step", json::array()}, {"wall_h", json::array()}, {"compute", json::object()}};
  for (const json& rec : records) {
    if (field(rec, "type", std::string()) != "step" || !rec.contains("ranks") || !rec["ranks"].is_array()) continue;
    std::set<int64_t> named;
    if (rec.contains("stragglers") && rec["stragglers"].is_array())
      for (const json& s : rec["stragglers"]) named.insert(field(s, "rank", int64_t(-1)));
    const size_t at = series["step"].size();
    series["step"].push_back(field(rec, "step", int64_t(0)));
    series["wall_h"].push_back(wall_h(rec));
    for (const json& k : rec["ranks"]) {
      const int64_t rank = field(k, "rank", int64_t(-1));
      if (rank < 0) continue;
      Acc& a = acc[{rank, field(k, "host", std::string("?"))}];
      a.host = field(k, "host", std::string("?"));
      a.compute.push_back(field(k, "compute_s", 0.0));
      a.input.push_back(field(k, "input_s", 0.0));
      a.wait.push_back(field(k, "wait_s", 0.0));
      if (k.contains("share") && k["share"].is_number()) a.share.push_back(k["share"].get<double>());
      a.named += named.count(rank) ? 1 : 0;
      json& line = series["compute"][std::to_string(rank)];
      if (line.is_null()) line = json::array();
      while (line.size() < at) line.push_back(nullptr);
      line.push_back(field(k, "compute_s", 0.0));
    }
  }
  if (acc.empty()) return nullptr;
  for (auto& [rank, line] : series["compute"].items())
    while (line.size() < series["step"].size()) line.push_back(nullptr);
  json ranks = json::array();
  double slowest = -1;
  json slowest_rank = nullptr;
  for (const auto& [key, a] : acc) {
    const double c = median_of(a.compute), i = median_of(a.input), w = median_of(a.wait);
    const double step = std::max(1e-12, c + i + w);
    ranks.push_back({{"rank", key.first}, {"host", a.host}, {"windows", a.compute.size()},
                     {"compute_s", c}, {"input_s", i}, {"wait_s", w}, {"compute_share", c / step},
                     {"input_share", i / step}, {"wait_share", w / step}, {"straggler_windows", a.named}});
    // Its share of the global batch over the run (shares that follow rates): first, last, range.
    if (!a.share.empty())
      ranks.back()["batch_share"] = {{"first", a.share.front()}, {"last", a.share.back()},
                                     {"min", *std::min_element(a.share.begin(), a.share.end())},
                                     {"max", *std::max_element(a.share.begin(), a.share.end())}};
    if (c + i > slowest) {
      slowest = c + i;
      slowest_rank = ranks.back();
    }
  }
  return {{"ranks", ranks}, {"slowest", slowest_rank}, {"series", series}};
}

// What the page draws for one run: series over steps and wall time, events, phases, tables.
json page_data(const Run& r, double price_per_hour) {
  const double t0 = iso_seconds(field(r.records.front(), "time", std::string()));
  auto wall_h = [&](const json& rec) {
    const double t = iso_seconds(field(rec, "time", std::string()));
    return std::isnan(t) || std::isnan(t0) ? json(nullptr) : json((t - t0) / 3600.0);
  };
  json steps = {{"step", json::array()}, {"wall_h", json::array()}, {"loss", json::array()},
                {"train_top1", json::array()}, {"lr", json::array()}, {"images_per_sec", json::array()},
                {"data_wait", json::array()}, {"gpu_sm", json::array()}, {"memory_gib", json::array()},
                {"rss_gib", json::array()}};
  json epochs = {{"step", json::array()}, {"wall_h", json::array()}, {"test_top1", json::array()},
                 {"ema_test_top1", json::array()},
                 {"test_top5", json::array()}, {"test_loss", json::array()}, {"train_top1", json::array()}};
  json events = json::array(), starts = json::array();
  std::map<std::string, std::vector<double>> phases;
  std::vector<double> ips, wait, step_secs;
  int64_t last_step = 0, stops = 0, warnings = 0, straggler_warnings = 0, processes = 0;
  double busy_s = 0, process_elapsed = 0;
  bool any_gpu = false;
  json last_epoch, best_epoch;
  for (const json& rec : r.records) {
    const std::string type = field(rec, "type", std::string());
    const json w = wall_h(rec);
    if (rec.contains("step") && rec["step"].is_number_integer()) last_step = rec["step"].get<int64_t>();
    if (type == "start") {
      busy_s += process_elapsed;
      process_elapsed = 0;
      ++processes;
      starts.push_back(rec);
      if (processes > 1) events.push_back({{"kind", "restart"}, {"step", last_step}, {"wall_h", w}, {"text", "process started"}});
    }
    if (rec.contains("elapsed") && rec["elapsed"].is_number())
      process_elapsed = std::max(process_elapsed, rec["elapsed"].get<double>());
    if (type == "step") {
      steps["step"].push_back(field(rec, "step", int64_t(0)));
      steps["wall_h"].push_back(w);
      steps["loss"].push_back(num_or_null(rec, "loss"));
      steps["train_top1"].push_back(num_or_null(rec, "train_top1", 100.0));
      steps["lr"].push_back(num_or_null(rec, "lr"));
      steps["images_per_sec"].push_back(num_or_null(rec, "images_per_sec"));
      steps["data_wait"].push_back(num_or_null(rec, "data_wait_share", 100.0));
      const json gpu = rec.contains("gpu") ? rec["gpu"] : json();
      steps["gpu_sm"].push_back(num_or_null(gpu, "sm_util"));
      any_gpu = any_gpu || gpu.is_object();
      steps["memory_gib"].push_back(num_or_null(rec, "memory_bytes", 1.0 / double(1 << 30)));
      steps["rss_gib"].push_back(num_or_null(rec.contains("host") ? rec["host"] : json(), "rss_bytes", 1.0 / double(1 << 30)));
      if (rec.contains("images_per_sec")) ips.push_back(rec["images_per_sec"].get<double>());
      if (rec.contains("step_seconds") && rec["step_seconds"].is_number()) step_secs.push_back(rec["step_seconds"].get<double>());
      if (rec.contains("data_wait_share")) wait.push_back(rec["data_wait_share"].get<double>());
      if (rec.contains("phases") && rec["phases"].is_object())
        for (auto& [k, v] : rec["phases"].items())
          if (v.is_number()) phases[k].push_back(v.get<double>());
    } else if (type == "epoch") {
      epochs["step"].push_back(field(rec, "step", int64_t(0)));
      epochs["wall_h"].push_back(w);
      epochs["test_top1"].push_back(num_or_null(rec, "test_top1", 100.0));
      epochs["ema_test_top1"].push_back(num_or_null(rec, "ema_test_top1", 100.0));
      epochs["test_top5"].push_back(num_or_null(rec, "test_top5", 100.0));
      epochs["test_loss"].push_back(num_or_null(rec, "test_loss"));
      epochs["train_top1"].push_back(num_or_null(rec, "train_top1", 100.0));
      last_epoch = rec;
      if (best_epoch.is_null() || field(rec, "test_top1", 0.0) > field(best_epoch, "test_top1", 0.0)) best_epoch = rec;
    } else if (type == "checkpoint") {
      events.push_back({{"kind", "checkpoint"}, {"step", field(rec, "step", int64_t(0))}, {"wall_h", w},
                        {"text", field(rec, "path", std::string())}});
    } else if (type == "stop") {
      ++stops;
      events.push_back({{"kind", "stop"}, {"step", field(rec, "step", int64_t(0))}, {"wall_h", w},
                        {"text", "stopped by " + field(rec, "reason", std::string("?"))}});
    } else if (type == "resume") {
      events.push_back({{"kind", "resume"}, {"step", field(rec, "step", int64_t(0))}, {"wall_h", w},
                        {"text", "resumed; before: " + field(rec, "previous", std::string("?"))}});
    } else if (type == "lost_peer") {
      events.push_back({{"kind", "lost_peer"}, {"step", field(rec, "step", int64_t(0))}, {"wall_h", w},
                        {"text", "a peer was lost: " + field(rec, "message", std::string())}});
    } else if (type == "warning") {
      // Each warning under its own marker: a straggler named, or the input falling behind.
      const bool straggler = field(rec, "kind", std::string()) == "straggler";
      ++(straggler ? straggler_warnings : warnings);
      events.push_back({{"kind", straggler ? "straggler" : "input_bound"}, {"step", field(rec, "step", int64_t(0))},
                        {"wall_h", w}, {"text", field(rec, "message", std::string())}});
    } else if (type == "shares") {
      std::string c;
      for (const json& n : rec.value("micro_batches", json::array())) c += (c.empty() ? "" : ", ") + n.dump();
      events.push_back({{"kind", "shares"}, {"step", field(rec, "step", int64_t(0))}, {"wall_h", w},
                        {"text", "shares of the global batch: " + c + " micro-batches per rank"}});
    } else if (type == "leave") {
      events.push_back({{"kind", "leave"}, {"step", field(rec, "step", int64_t(0))}, {"wall_h", w},
                        {"text", field(rec, "message", std::string())}});
    }
  }
  busy_s += process_elapsed;
  // A plan's prediction beside what the run measured, like for like: the wall time (first to
  // last record, the gaps between processes in it, as the plan's), the reclaims (the restarts),
  // goodput (the surviving steps at the median step time over that wall time) and the cost of
  // the wall time at the plan's price.
  json plan_vs = nullptr;
  const double wall_s = iso_seconds(field(r.records.back(), "time", std::string())) - t0;
  if (r.plan.is_object()) {
    const json& p = r.plan;
    const double hosts = field(p, "hosts", 1.0), price = field(p, "price_per_host_hour", 0.0);
    // At most 1: on a noisy machine the median step can come out above the mean (few slow
    // windows, many fast ones), and the steps at that pace then seem to outlast the wall time
    // (1.21 once on a loaded 2-core CI machine).
    const double measured_goodput =
        step_secs.empty() || !(wall_s > 0) ? NAN : std::min(1.0, double(last_step) * median_of(step_secs) / wall_s);
    // Like for like: the share of the planned wall time that is training at full speed (the
    // model's goodput less the start-up).
    const double planned_wall = field(p, "wall_seconds", 0.0);
    const double planned_goodput = planned_wall > 0 && p.contains("work_seconds")
                                       ? field(p, "work_seconds", 0.0) / planned_wall : field(p, "goodput", 0.0);
    plan_vs = {{"offer", field(p, "offer", std::string("?"))}, {"purchase", field(p, "purchase", std::string("?"))},
               {"hosts", hosts},
               {"predicted", {{"hours", field(p, "wall_seconds", 0.0) / 3600.0},
                              {"reclaims", field(p, "expected_reclaims", 0.0)},
                              {"goodput", planned_goodput}, {"cost", field(p, "cost_usd", 0.0)}}},
               {"measured", {{"hours", std::isnan(wall_s) ? json(nullptr) : json(wall_s / 3600.0)},
                             {"reclaims", std::max<int64_t>(0, processes - 1)},
                             {"goodput", std::isnan(measured_goodput) ? json(nullptr) : json(measured_goodput)},
                             {"cost", std::isnan(wall_s) ? json(nullptr) : json(wall_s / 3600.0 * hosts * price)}}}};
  }
  const json ranks = rank_times(r.records, wall_h);
  const json& first_start = starts.empty() ? json::object() : starts.front();
  const json& latest_start = starts.empty() ? json::object() : starts.back();
  json phase_means = json::object();
  for (auto& [k, v] : phases) phase_means[k] = median_of(v);
  const double wall = iso_seconds(field(r.records.back(), "time", std::string())) - t0;
  const json& end = r.records.back();
  json summary = {
      {"status", field(end, "type", std::string()) == "end" ? "finished"
                 : field(end, "type", std::string()) == "stop" ? "stopped (" + field(end, "reason", std::string("?")) + ")"
                 : field(end, "type", std::string()) == "lost_peer" ? "lost a peer (" + field(end, "message", std::string("?")) + ")"
                                                    : "running, or ended without a record"},
      {"steps", last_step},
      {"processes", processes},
      {"restarts", std::max<int64_t>(0, processes - 1)},
      {"stops", stops},
      {"input_bound_warnings", warnings},
      {"straggler_warnings", straggler_warnings},
      {"final_test_top1", num_or_null(last_epoch, "test_top1", 100.0)},
      {"best_test_top1", num_or_null(best_epoch, "test_top1", 100.0)},
      {"median_images_per_sec", ips.empty() ? json(nullptr) : json(median_of(ips))},
      {"median_data_wait_pct", wait.empty() ? json(nullptr) : json(100 * median_of(wait))},
      {"wall_hours", std::isnan(wall) ? json(nullptr) : json(wall / 3600.0)},
      {"busy_hours", busy_s / 3600.0},
      {"price_per_hour", price_per_hour > 0 ? json(price_per_hour) : json(nullptr)},
      {"cost", price_per_hour > 0 ? json(busy_s / 3600.0 * price_per_hour) : json(nullptr)},
      {"torn_lines", r.torn}};
  return {{"name", r.name},
          {"metrics", r.metrics_path},
          {"steps", steps},
          {"epochs", epochs},
          {"events", events},
          {"any_gpu", any_gpu},
          {"phases", phase_means},
          {"summary", summary},
          {"config", first_start.contains("config") ? first_start["config"] : json::object()},
          {"latest_config", latest_start.contains("config") ? latest_start["config"] : json::object()},
          {"machine", latest_start.contains("machine") ? latest_start["machine"] : json::object()},
          {"backend", field(latest_start, "backend", std::string())},
          {"ranks", field(latest_start, "ranks", int64_t(0))},
          {"precision", field(latest_start, "precision", std::string())},
          {"evals", r.evals},
          {"rank_times", ranks},
          {"rank_series", ranks.is_object() ? ranks["series"] : json(nullptr)},
          {"plan", plan_vs}};
}

// Flattens nested objects into dotted keys ("host.rss_bytes"); the start record's settings and
// machine stay out (they are one table each in the page).
void flatten(const json& j, const std::string& prefix, std::vector<std::pair<std::string, json>>& out) {
  for (auto& [k, v] : j.items()) {
    if (prefix.empty() && (k == "config" || k == "machine")) continue;
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object())
      flatten(v, key, out);
    else
      out.emplace_back(key, v);
  }
}

std::string csv_cell(const json& v) {
  std::string s;
  if (v.is_null()) return "";
  if (v.is_string()) s = v.get<std::string>();
  else if (v.is_boolean()) s = v.get<bool>() ? "true" : "false";
  else s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void write_csv(const std::vector<Run>& runs, const std::string& path) {
  std::vector<std::string> cols = {"run", "type", "time", "elapsed", "epoch", "step"};
  std::set<std::string> known(cols.begin(), cols.end());
  std::vector<std::vector<std::pair<std::string, json>>> rows;
  std::vector<std::string> row_run;
  for (const Run& r : runs)
    for (const json& rec : r.records) {
      rows.emplace_back();
      flatten(rec, "", rows.back());
      row_run.push_back(r.name);
      for (auto& [k, v] : rows.back())
        if (known.insert(k).second) cols.push_back(k);
    }
  std::string text;
  for (size_t c = 0; c < cols.size(); ++c) text += (c ? "," : "") + cols[c];
  text += "\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    std::map<std::string, json> m(rows[i].begin(), rows[i].end());
    m["run"] = row_run[i];
    for (size_t c = 0; c < cols.size(); ++c) {
      auto it = m.find(cols[c]);
      text += (c ? "," : "") + (it == m.end() ? std::string() : csv_cell(it->second));
    }
    text += "\n";
  }
  write_file_atomic(path, text, "the --csv file");
  log_info(str("wrote ", path, ": ", rows.size(), " records, ", cols.size(), " columns"));
}

int run_report(const ReportOptions& o) {
  SPOTRAIN_CHECK(!o.runs.empty(), "report: name at least one run folder");
  SPOTRAIN_CHECK(o.price_per_hour >= 0, "--price-per-hour must not be negative");
  std::vector<Run> runs;
  for (const std::string& a : o.runs) runs.push_back(load_run(a));
  for (const Run& r : runs) {
    if (r.superseded) log_info(str("report: ", r.metrics_path, ": left out ", r.superseded, " record(s) of steps a resume trained again"));
    if (r.torn) log_info(str("report: ", r.metrics_path, ": skipped ", r.torn, " line(s) that do not parse or are not records of the metrics schema"));
  }
  if (!o.csv.empty()) write_csv(runs, o.csv);
  if (o.csv.empty() || !o.output.empty()) {
    SPOTRAIN_CHECK(!chartjs_source().empty(),
                   "report: this spotrain was built without Chart.js, so it cannot draw a page; install "
                   "Debian's libjs-chart.js and rebuild (--csv works without it)");
    std::string output = o.output;
    if (output.empty())
      output = runs.size() == 1 && fs::is_directory(o.runs[0]) ? (fs::path(o.runs[0]) / "report.html").string()
                                                              : "report.html";
    json data = {{"title", o.title.empty() ? "spotrain report: " + runs[0].name + (runs.size() > 1 ? " and others" : "") : o.title},
                 {"generated", utc_time_iso()},
                 {"runs", json::array()}};
    for (const Run& r : runs) {
      data["runs"].push_back(page_data(r, o.price_per_hour));
      const json& rt = data["runs"].back()["rank_times"];
      if (rt.is_object()) {
        const json& s = rt["slowest"];
        auto pct = [&](const char* k) { return fmt_fixed(100 * s[k].get<double>(), 0); };
        log_info(str("report: ", r.name, ": ", rt["ranks"].size(), " ranks; the slowest, rank ", s["rank"].get<int64_t>(),
                     " on ", s["host"].get<std::string>(), ": compute ", fmt_fixed(s["compute_s"].get<double>(), 3),
                     " s/step (median of ", s["windows"].get<size_t>(), " windows), its step ", pct("compute_share"),
                     "% compute, ", pct("input_share"), "% input, ", pct("wait_share"), "% wait; named a straggler in ",
                     s["straggler_windows"].get<int64_t>(), " window(s)"));
      }
      const json& pv = data["runs"].back()["plan"];
      if (pv.is_object()) {
        auto both = [&](const char* k, int digits, double scale = 1) {
          const json &p = pv["predicted"][k], &m = pv["measured"][k];
          return str(p.is_number() ? fmt_fixed(p.get<double>() * scale, digits) : "?", " planned, ",
                     m.is_number() ? fmt_fixed(m.get<double>() * scale, digits) : "?", " measured");
        };
        const bool short_run = pv["predicted"]["hours"].is_number() && pv["predicted"]["hours"].get<double>() < 2;
        log_info(str("report: ", r.name, " against its plan (", pv["offer"].get<std::string>(), ", ",
                     pv["purchase"].get<std::string>(), "): ",
                     short_run ? "minutes " + both("hours", 1, 60.0) : "hours " + both("hours", 2), "; reclaims ",
                     both("reclaims", 1), "; goodput ", both("goodput", 3), "; cost USD ", both("cost", 2)));
      }
    }
    const std::string page =
        fill_page(report_page_template(), data.dump(-1, ' ', false, json::error_handler_t::replace));
    write_file_atomic(output, page, "the report");
    size_t records = 0;
    for (const Run& r : runs) records += r.records.size();
    log_info(str("wrote ", output, ": ", runs.size(), " run(s), ", records, " records (",
                 fmt_fixed(double(page.size()) / 1024.0, 0), " KiB, opens offline)"));
  }
  return 0;
}

}  // namespace

Command add_report(CLI::App& app) {
  auto opts = std::make_shared<ReportOptions>();
  auto* rep = app.add_subcommand(
      "report", "an HTML page (self-contained, opens offline) of one or more runs' metrics: curves over "
                "steps or wall time with checkpoint/stop/resume markers, phases, evaluations, settings, "
                "cost; or a CSV of the records");
  rep->add_option("runs", opts->runs, "run folders (--ckpt-dir) or metrics.jsonl files; several compare runs")
      ->required();
  rep->add_option("-o,--output", opts->output,
                  "the HTML file (default: RUN/report.html for one run folder, else ./report.html)");
  rep->add_option("--csv", opts->csv, "also (or, without -o, only) write every record as CSV to FILE");
  rep->add_option("--price-per-hour", opts->price_per_hour,
                  "what the job's machines cost per hour together, in USD: the page shows the cost of "
                  "the hours its processes ran");
  rep->add_option("--title", opts->title, "the page title");
  return {rep, [opts] { return run_report(*opts); }};
}

}  // namespace spotrain::cli
