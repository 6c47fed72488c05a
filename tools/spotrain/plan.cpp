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
#include "layers/resnet.h"
#include "observe/metrics.h"
#include "run/config.h"
#include "run/goodput.h"
#include "tools/spotrain/commands.h"
#include "tools/spotrain/report_assets.h"

namespace spotrain::cli {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

struct PlanOptions {
  std::string catalog, model = "resnet50", precision = "fp16", data = "imagefolder:/data/imagenet";
  int image_size = 224, num_classes = 1000, batch_size = 256, max_hosts = 64;
  int64_t epochs = 90, steps = 0, images_per_epoch = 1281167;
  std::string deadline;
  double budget = 0;
  std::vector<std::string> bench;
  std::string from_run, json_out, csv_out, html_out, title, check_sweep;
  double overlap = 0.6;
  std::string recovery = "today";  // today | survivors (mpirun.sh HOST_DISCOVERY: docs/SCALING.md)
};

// ---- the catalog ---------------------------------------------------------------------------

struct Offer {
  std::string name, gpu;
  int gpus_per_host = 1;
  double on_demand = 0, spot = 0;   // USD per host-hour
  double spot_mtbf_h = 0;           // hours between reclaims of one spot host
  double notice_s = 0, network_gbps = 0;
};

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  std::string out;
  for (char c : s)
    if (!(c == ' ' && !out.empty() && out.back() == ' ')) out += c;
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::vector<Offer> read_catalog(const std::string& path, json* about) {
  SPOTRAIN_CHECK(fs::is_regular_file(path), "--catalog ", path, " is not a file (see examples/offers.toml)");
  toml::value doc;
  try {
    doc = toml::parse(path);
  } catch (const std::exception& e) {
    SPOTRAIN_THROW("catalog ", path, " is not valid TOML: ", one_line(e.what()));
  }
  SPOTRAIN_CHECK(doc.is_table(), "catalog ", path, " is not a table of offers");
  const auto& top = doc.as_table();
  for (const auto& [k, v] : top)
    SPOTRAIN_CHECK(k == "offer" || k == "date" || k == "note", "catalog ", path, ": unknown key '", k,
                   "' (the keys are date, note and [[offer]] tables)");
  *about = json::object();
  for (const char* k : {"date", "note"})
    if (top.count(k)) {
      SPOTRAIN_CHECK(top.at(k).is_string(), "catalog ", path, ": '", k, "' must be a string");
      (*about)[k] = top.at(k).as_string().str;
    }
  SPOTRAIN_CHECK(top.count("offer") && top.at("offer").is_array() && !top.at("offer").as_array().empty(),
                 "catalog ", path, " has no [[offer]] tables");
  std::vector<Offer> offers;
  const auto& list = top.at("offer").as_array();
  for (size_t i = 0; i < list.size(); ++i) {
    SPOTRAIN_CHECK(list[i].is_table(), "catalog ", path, ": offer ", i + 1, " is not a table");
    const auto& t = list[i].as_table();
    const std::string where = str("catalog ", path, ", offer ", i + 1);
    static const char* const keys[] = {"name", "gpu", "gpus_per_host", "on_demand_per_hour", "spot_per_hour",
                                       "spot_hours_between_reclaims", "notice_seconds", "network_gbps"};
    for (const auto& [k, v] : t)
      SPOTRAIN_CHECK(std::find(std::begin(keys), std::end(keys), k) != std::end(keys), where,
                     ": unknown key '", k, "' (the keys: name, gpu, gpus_per_host, on_demand_per_hour, "
                     "spot_per_hour, spot_hours_between_reclaims, notice_seconds, network_gbps)");
    for (const char* k : keys) SPOTRAIN_CHECK(t.count(k), where, " has no '", k, "'");
    auto text = [&](const char* k) {
      SPOTRAIN_CHECK(t.at(k).is_string() && !t.at(k).as_string().str.empty(), where, ": '", k,
                     "' must be a non-empty string");
      return t.at(k).as_string().str;
    };
    auto number = [&](const char* k) {
      const auto& v = t.at(k);
      SPOTRAIN_CHECK(v.is_floating() || v.is_integer(), where, ": '", k, "' must be a number");
      const double d = v.is_floating() ? v.as_floating() : double(v.as_integer());
      SPOTRAIN_CHECK(std::isfinite(d), where, ": '", k, "' must be finite");
      return d;
    };
    Offer o;
    o.name = text("name");
    o.gpu = text("gpu");
    const double gpus = number("gpus_per_host");
    SPOTRAIN_CHECK(gpus >= 1 && gpus <= 64 && gpus == std::floor(gpus), where, " (", o.name,
                   "): gpus_per_host must be a whole number from 1 to 64, got ", gpus);
    o.gpus_per_host = int(gpus);
    o.on_demand = number("on_demand_per_hour");
    o.spot = number("spot_per_hour");
    SPOTRAIN_CHECK(o.on_demand >= 0 && o.spot >= 0, where, " (", o.name, "): a price must not be negative, got ",
                   o.on_demand, " on demand and ", o.spot, " spot");
    o.spot_mtbf_h = number("spot_hours_between_reclaims");
    SPOTRAIN_CHECK(o.spot_mtbf_h > 0, where, " (", o.name,
                   "): spot_hours_between_reclaims must be above zero (hours between reclaims of one "
                   "host; a large number for a market that rarely reclaims), got ", o.spot_mtbf_h);
    o.notice_s = number("notice_seconds");
    SPOTRAIN_CHECK(o.notice_s >= 0, where, " (", o.name, "): notice_seconds must not be negative");
    o.network_gbps = number("network_gbps");
    SPOTRAIN_CHECK(o.network_gbps > 0, where, " (", o.name, "): network_gbps must be above zero");
    for (const Offer& other : offers)
      SPOTRAIN_CHECK(other.name != o.name, where, ": a second offer named '", o.name, "'");
    offers.push_back(o);
  }
  return offers;
}

// ---- speeds --------------------------------------------------------------------------------

struct Speed {
  double ips_per_gpu = 0;   // training images/s of one GPU (one rank)
  int batch = 0;            // the batch per GPU it was measured at
  std::string source;
  double scaling = 1;       // per-GPU speed with several GPUs in a host, against one
  std::string scaling_source = "assumed 1.0 (no multi-rank measurement)";
};

// What this project measured, with where (docs/PERFORMANCE.md). Only what was measured.
struct Measured {
  const char *gpu, *model, *precision;
  int image_size, batch;
  double ips;
  const char* source;
};
const Measured kMeasured[] = {
    {"H200", "resnet50", "fp16", 224, 256, 6826,
     "spotrain bench (synthetic data: compute only; from JPEG files with 15 loader threads it was 5,381) on one H200, "
     "2026-12-04 (docs/PERFORMANCE.md)"},
    {"H200", "resnet50", "bf16", 224, 256, 6138, "spotrain bench (synthetic data) on one H200, 2026-12-04 (docs/PERFORMANCE.md)"},
    {"H200", "resnet50", "tf32", 224, 256, 3793, "spotrain bench (synthetic data) on one H200, 2026-12-04 (docs/PERFORMANCE.md)"},
    {"CPU", "resnet50", "bf16", 224, 32, 20.4,
     "spotrain bench (synthetic data) on a 2-core AMD EPYC with AVX-512 BF16, 2 threads, 2026-12-04 (docs/PERFORMANCE.md)"},
    {"CPU", "resnet50", "fp32", 224, 32, 8.2,
     "spotrain bench (synthetic data) on a 2-core AMD EPYC, 2 threads, beside PyTorch (docs/PERFORMANCE.md)"},
};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Whether the GPU name a bench recorded ("NVIDIA H200", "" for the CPU) is the catalog's `gpu`.
bool same_gpu(const std::string& recorded, const std::string& wanted) {
  const std::string r = lower(recorded.empty() ? "cpu" : recorded), w = lower(wanted);
  const size_t at = r.find(w);
  if (at == std::string::npos) return false;
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  return (at == 0 || !word(r[at - 1])) && (at + w.size() == r.size() || !word(r[at + w.size()]));
}

struct BenchFile {
  std::string path, gpu, model, precision;  // gpu: the name it recorded, "" for the CPU
  int image_size = 0, batch = 0, ranks = 1;
  double ips = 0, ips_per_rank = 0;
};

BenchFile read_bench(const std::string& path) {
  std::ifstream in(path);
  SPOTRAIN_CHECK(in, "--bench ", path, " cannot be read");
  json j = json::parse(in, nullptr, false);
  SPOTRAIN_CHECK(j.is_object(), "--bench ", path, " is not a JSON object (write it with spotrain bench --json FILE)");
  auto need = [&](const char* k, bool num) {
    SPOTRAIN_CHECK(j.contains(k) && (num ? j[k].is_number() : j[k].is_string()), "--bench ", path, ": '", k,
                   "' is missing or not a ", num ? "number" : "string", " (written by spotrain bench --json?)");
  };
  need("model", false);
  need("precision", false);
  need("image_size", true);
  need("batch_size", true);
  need("images_per_sec", true);
  BenchFile b;
  b.path = path;
  b.model = j["model"];
  b.precision = j["precision"];
  b.image_size = j["image_size"];
  b.batch = j["batch_size"];
  b.ips = j["images_per_sec"];
  b.ranks = j.contains("ranks") && j["ranks"].is_number_integer() ? int(j["ranks"]) : 1;
  b.ips_per_rank = b.ips / std::max(b.ranks, 1);
  SPOTRAIN_CHECK(b.ips > 0 && std::isfinite(b.ips), "--bench ", path, ": images_per_sec must be positive");
  // The GPU it ran on; a bench of the CPU backend (or of a machine without a GPU) ran on "the CPU".
  if (j.contains("machine") && j["machine"].is_object()) {
    const json& m = j["machine"];
    const bool cpu = m.contains("backend") && m["backend"].is_string() &&
                     m["backend"].get<std::string>().rfind("cpu", 0) == 0;
    if (!cpu && m.contains("gpu") && m["gpu"].is_string() && m["gpu"] != "none") b.gpu = m["gpu"];
  }
  return b;
}

// The speed of one GPU of `gpu` for the run, or why there is none.
bool speed_for(const PlanOptions& o, const std::string& gpu, const std::vector<BenchFile>& benches,
               Speed* s, std::string* why) {
  const BenchFile* single = nullptr;
  const BenchFile* multi = nullptr;
  for (const BenchFile& b : benches) {
    if (!same_gpu(b.gpu, gpu) || b.model != o.model || b.precision != o.precision || b.image_size != o.image_size)
      continue;
    if (b.ranks > 1) {
      if (!multi || b.ranks > multi->ranks) multi = &b;
    } else if (!single) {
      single = &b;
    }
  }
  if (single || multi) {
    const BenchFile& b = single ? *single : *multi;
    s->ips_per_gpu = b.ips_per_rank;
    s->batch = b.batch;
    s->source = str("--bench ", b.path, " (", b.ranks, " rank", b.ranks > 1 ? "s" : "", ")");
    if (single && multi) {
      s->scaling = multi->ips_per_rank / single->ips_per_rank;
      s->scaling_source = str(fmt_fixed(s->scaling, 2), " per GPU at ", multi->ranks, " ranks (--bench ", multi->path, ")");
    } else if (multi) {
      s->scaling_source = str("the ", multi->ranks, "-rank measurement itself (--bench ", multi->path, ")");
    }
    return true;
  }
  for (const Measured& m : kMeasured)
    if (lower(m.gpu) == lower(gpu) && o.model == m.model && o.precision == m.precision &&
        o.image_size == m.image_size) {
      s->ips_per_gpu = m.ips;
      s->batch = m.batch;
      s->source = m.source;
      return true;
    }
  *why = str("no measured speed for ", o.model, " ", o.precision, " at ", o.image_size, "x", o.image_size, " on ",
             gpu, ": measure it on one with `spotrain bench --model ", o.model, " --precision ", o.precision,
             " --image-size ", o.image_size, " --batch-size ", o.batch_size, " --json ", lower(gpu),
             ".json` and pass --bench ", lower(gpu), ".json");
  return false;
}

// ---- checkpoint and restart costs -----------------------------------------------------------

struct Costs {
  double ckpt_cost_s = 0.05, ckpt_write_s = 2, restart_s = 120, startup_s = 30;
  std::string ckpt_source = "default: a GPU's state copy into pinned memory, one DMA (docs/SCALING.md)";
  std::string write_source = "default (docs/SCALING.md)";
  std::string restart_source = "default: noticing the loss, a replacement host, start-up (docs/SCALING.md)";
  std::string startup_source = "default: loading the model and the data, the first steps";
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Seconds since the epoch of a record's "time" (UTC ISO 8601 with milliseconds); -1 when absent.
double record_time(const json& r) {
  if (!r.contains("time") || !r["time"].is_string()) return -1;
  std::tm tm{};
  int ms = 0;
  const std::string t = r["time"];
  if (std::sscanf(t.c_str(), "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, &ms) < 6)
    return -1;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return double(timegm(&tm)) + ms / 1000.0;
}

Costs costs_from(const std::string& dir) {
  Costs c;
  if (dir.empty()) return c;
  const std::string path = fs::is_directory(dir) ? (fs::path(dir) / "metrics.jsonl").string() : dir;
  std::ifstream in(path);
  SPOTRAIN_CHECK(in, "--from-run ", dir, ": no metrics file ", path, " (a run folder of spotrain train)");
  // Every record, those a resume marked superseded too: their times and costs were real.
  std::vector<json> recs;
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && metrics_record_well_formed(j)) recs.push_back(std::move(j));
  }
  std::vector<double> held, written, restarts, startups;
  for (size_t i = 0; i < recs.size(); ++i) {
    const json& r = recs[i];
    if (r["type"] == "checkpoint") {
      if (r.contains("held_seconds") && r["held_seconds"].is_number()) held.push_back(r["held_seconds"]);
      if (r.contains("write_seconds") && r["write_seconds"].is_number() && r["write_seconds"] > 0)
        written.push_back(r["write_seconds"]);
    }
    if (r["type"] != "start") continue;
    // One process: its start, its resume (if it loaded a checkpoint), its first step record.
    const double started = record_time(r);
    double resumed = -1;
    int64_t from_step = 0;
    for (size_t k = i + 1; k < recs.size() && recs[k]["type"] != "start"; ++k) {
      const json& q = recs[k];
      if (q["type"] == "resume") {
        resumed = record_time(q);
        from_step = q.contains("step") && q["step"].is_number_integer() ? q["step"].get<int64_t>() : 0;
      }
      if (q["type"] == "step") {
        // The start-up: to the first step record, less the steps that window trained.
        const double t = record_time(q);
        const int64_t steps = q.contains("step") && q["step"].is_number_integer() ? q["step"].get<int64_t>() - from_step : 0;
        const double step_s = q.contains("step_seconds") && q["step_seconds"].is_number() ? q["step_seconds"].get<double>() : 0;
        if (started > 0 && t > started) startups.push_back(std::max(0.0, t - started - double(steps) * step_s));
        break;
      }
    }
    // A restart: from the previous process's last record to this one's resume (training again).
    const double before = i > 0 ? record_time(recs[i - 1]) : -1;
    if (before > 0 && resumed > before) restarts.push_back(resumed - before);
  }
  if (!held.empty()) {
    c.ckpt_cost_s = median(held);
    c.ckpt_source = str("the median state copy of ", held.size(), " checkpoint(s) in ", path);
  }
  if (!written.empty()) {
    c.ckpt_write_s = median(written);
    c.write_source = str("the median write of ", written.size(), " checkpoint(s) in ", path);
  }
  if (!startups.empty()) {
    c.startup_s = median(startups);
    c.startup_source = str("the median of ", startups.size(), " start(s) in ", path,
                           " (to the first step record, less the steps it timed)");
  }
  if (!restarts.empty()) {
    c.restart_s = median(restarts);
    c.restart_source = str("the median of ", restarts.size(), " restart(s) in ", path,
                           " (from the last record before each to its resume)");
  }
  return c;
}

// ---- the plan ---------------------------------------------------------------------------------

struct Row {
  const Offer* offer = nullptr;
  bool spot = false;
  int hosts = 1;
  double price = 0;  // per host-hour
  double wall_s = 0, cost = 0, reclaims = 0;
  double work_s = 0;  // the steps at full speed: what of wall_s is training that survives
  Goodput g;
};

json row_json(const Row& r, const PlanOptions& o) {
  return json{{"offer", r.offer->name},
              {"gpu", r.offer->gpu},
              {"purchase", r.spot ? "spot" : "on_demand"},
              {"hosts", r.hosts},
              {"gpus", r.hosts * r.offer->gpus_per_host},
              {"price_per_host_hour", r.price},
              {"wall_seconds", r.wall_s},
              {"expected_reclaims", r.reclaims},
              {"goodput", r.g.goodput},
              {"work_seconds", r.work_s},
              {"step_efficiency", r.g.step_efficiency},
              {"cost_usd", r.cost},
              {"checkpoint_interval_seconds", r.spot ? json(r.g.interval_s) : json(nullptr)},
              {"notice_covers_stop", r.g.notice_covers_stop},
              {"batch_per_gpu", o.batch_size}};
}

// A wall time as a person reads it: seconds under two minutes, minutes under two hours, else hours.
std::string hours(double s) {
  if (s < 120) return fmt_fixed(s, s < 10 ? 1 : 0) + " s";
  return s < 7200 ? fmt_fixed(s / 60.0, s < 600 ? 1 : 0) + " min" : fmt_fixed(s / 3600.0, s < 36000 ? 2 : 1) + " h";
}

// Seconds with the digits that matter: 0.31 s, 4.2 s, 120 s.
std::string secs(double s) { return fmt_fixed(s, s < 1 ? 2 : s < 10 ? 1 : 0); }

std::string describe(const Row& r) {
  return str(r.offer->name, ", ", r.hosts, r.hosts == 1 ? " host" : " hosts", ", ", r.spot ? "spot" : "on demand",
             ": ", hours(r.wall_s), ", $", fmt_fixed(r.cost, 2), r.spot ? str(", ", fmt_fixed(r.reclaims, 2),
             " reclaims expected") : std::string());
}

// The command that runs the chosen row: the launcher with its ranks, the run's settings, a
// checkpoint interval from the reclaim rate on spot, and the plan kept with the run.
std::string launch_line(const Row& r, const PlanOptions& o) {
  const bool survivors = r.spot && r.hosts > 1 && o.recovery == "survivors";
  std::string s = survivors ? "HOST_DISCOVERY='cat hosts.txt' MIN_HOSTS=1 " : "";
  if (r.offer->gpus_per_host > 1) s += str("RANKS_PER_NODE=", r.offer->gpus_per_host, " ");
  s += str("examples/resnet50/launch/mpirun.sh ", survivors ? "-" : "hosts.txt", " ", r.hosts * r.offer->gpus_per_host,
           " --model ", o.model, " --data ", o.data, " --precision ", o.precision, " --batch-size ", o.batch_size,
           " --image-size ", o.image_size);
  s += o.steps > 0 ? str(" --steps ", o.steps) : str(" --epochs ", o.epochs);
  if (r.spot) {
    std::ostringstream mtbf;  // as short as it is exact: 12h, 0.25h
    mtbf << r.offer->spot_mtbf_h << "h";
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
    t += str(csv_field(r.offer->name), ",", csv_field(r.offer->gpu), ",", r.spot ? "spot" : "on_demand", ",", r.hosts,
             ",", r.hosts * r.offer->gpus_per_host, ",", r.price, ",", fmt_fixed(r.wall_s / 3600.0, 4), ",",
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
  const double sweep_startup = startups.empty() ? 0.0 : median(startups);

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
  SPOTRAIN_CHECK(o.epochs > 0 || o.steps > 0, "--epochs or --steps must be positive");
  SPOTRAIN_CHECK(o.images_per_epoch > 0, "--images-per-epoch must be positive");
  SPOTRAIN_CHECK(o.batch_size > 0, "--batch-size must be positive");
  SPOTRAIN_CHECK(o.max_hosts >= 1 && o.max_hosts <= 65536, "--max-hosts must be in [1, 65536]");
  SPOTRAIN_CHECK(o.budget >= 0, "--budget must not be negative");
  SPOTRAIN_CHECK(o.overlap >= 0 && o.overlap <= 1, "--overlap must be in [0, 1]");
  SPOTRAIN_CHECK(o.recovery == "today" || o.recovery == "survivors", "--recovery must be today or survivors");
  check_resnet_options(o.model, "none");
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
  const Costs costs = costs_from(o.from_run);

  // The work, and what one step all-reduces (fp32 gradients of the model's parameters).
  ResNetOptions ro;
  ro.arch = o.model;
  ro.num_classes = o.num_classes;
  ro.in_channels = 3;
  std::vector<Param*> params;
  auto net = build_resnet(ro);
  net->collect_params(params);
  int64_t nparams = 0;
  for (Param* p : params) nparams += p->value.numel();
  const double images = o.steps > 0 ? 0.0 : double(o.epochs) * double(o.images_per_epoch);

  std::vector<Row> rows;
  std::vector<std::string> hopeless;  // rows left out: goodput next to nothing
  json speeds = json::array(), left_out = json::array();
  for (const Offer& of : offers) {
    Speed sp;
    std::string why;
    if (!speed_for(o, of.gpu, benches, &sp, &why)) {
      left_out.push_back({{"offer", of.name}, {"why", why}});
      continue;
    }
    speeds.push_back({{"offer", of.name}, {"gpu", of.gpu}, {"images_per_sec_per_gpu", sp.ips_per_gpu},
                      {"measured_at_batch", sp.batch}, {"source", sp.source},
                      {"multi_gpu_scaling", sp.scaling}, {"scaling_source", sp.scaling_source}});
    for (int hosts = 1; hosts <= o.max_hosts; hosts *= 2) {
      const int gpus = hosts * of.gpus_per_host;
      // A multi-rank bench measured GPUs within one host; between hosts the all-reduce term counts.
      const double per_gpu = sp.ips_per_gpu * (of.gpus_per_host > 1 ? sp.scaling : 1.0);
      const double global_batch = double(o.batch_size) * gpus;
      const double steps = o.steps > 0 ? double(o.steps) : std::ceil(images / global_batch);
      const double step_s = double(o.batch_size) / per_gpu;
      for (bool spot : {true, false}) {
        Row r;
        r.offer = &of;
        r.spot = spot;
        r.hosts = hosts;
        r.price = spot ? of.spot : of.on_demand;
        SpotJob job;
        job.hosts = hosts;
        job.step_s = step_s;
        job.grad_bytes = 4.0 * double(nparams);
        job.link_bytes_s = of.network_gbps * 1e9 / 8.0;
        job.overlap = o.overlap;
        job.survivors = o.recovery == "survivors";
        job.replacement_s = costs.restart_s;  // a replacement host is up about when a restart would be
        job.host_mtbf_s = spot ? of.spot_mtbf_h * 3600.0 : 0.0;
        job.notice_s = of.notice_s;
        job.ckpt_cost_s = costs.ckpt_cost_s;
        job.ckpt_write_s = costs.ckpt_write_s;
        job.restart_s = costs.restart_s;
        r.g = estimate_goodput(job);
        r.work_s = steps * step_s;
        r.wall_s = costs.startup_s + r.work_s / r.g.goodput;
        r.reclaims = spot ? r.wall_s * hosts / job.host_mtbf_s : 0.0;
        r.cost = r.wall_s / 3600.0 * hosts * r.price;
        if (!(r.g.goodput > 1e-6) || !std::isfinite(r.wall_s)) {  // reclaims faster than it restarts
          hopeless.push_back(str(of.name, " on ", hosts, " hosts, spot: the job would be reclaimed every ",
                                 fmt_fixed(r.g.job_mtbf_s, 1), " s, faster than it restarts"));
          continue;
        }
        rows.push_back(r);
      }
    }
  }
  for (const json& l : left_out)
    log_info(str("not planned: ", l["offer"].get<std::string>(), ": ", l["why"].get<std::string>()));
  for (const std::string& h : hopeless) log_info("not planned: " + h);
  SPOTRAIN_CHECK(!rows.empty(), "no offer of ", o.catalog, " can be planned: ",
                 left_out.empty() ? (hopeless.empty() ? std::string("none given") : hopeless[0])
                                  : str(left_out[0]["offer"].get<std::string>(), ": ", left_out[0]["why"].get<std::string>(),
                                        left_out.size() > 1 ? str(" (and ", left_out.size() - 1, " more above)") : ""));

  // The choice.
  auto meets = [&](const Row& r) { return deadline_s <= 0 || r.wall_s <= deadline_s; };
  auto within = [&](const Row& r) { return o.budget <= 0 || r.cost <= o.budget; };
  const Row* cheapest = nullptr;  // before the deadline
  const Row* fastest = nullptr;   // within the budget
  const Row* chosen = nullptr;    // cheapest before the deadline and within the budget, or
                                  // fastest within the budget when only a budget is given
  for (const Row& r : rows) {
    if (meets(r) && (!cheapest || r.cost < cheapest->cost)) cheapest = &r;
    if (within(r) && (!fastest || r.wall_s < fastest->wall_s)) fastest = &r;
    if (meets(r) && within(r)) {
      const bool better = !chosen || (deadline_s > 0 || o.budget <= 0 ? r.cost < chosen->cost
                                                                      : r.wall_s < chosen->wall_s);
      if (better) chosen = &r;
    }
  }

  // The table.
  std::printf("plan: %s %s at %dx%d, %s, batch %d per GPU; catalog %s%s; spot recovery: %s\n", o.model.c_str(),
              o.precision.c_str(), o.image_size, o.image_size,
              o.steps > 0 ? str(o.steps, " steps").c_str() : str(o.epochs, " epochs of ", o.images_per_epoch, " images").c_str(),
              o.batch_size, o.catalog.c_str(),
              about.contains("date") ? str(" (prices of ", about["date"].get<std::string>(), ")").c_str() : "",
              o.recovery == "survivors" ? "the survivors go on (HOST_DISCOVERY)" : "restart from the latest checkpoint");
  std::printf("%-24s %-9s %5s %5s %10s %9s %8s %11s %10s %s\n", "offer", "purchase", "hosts", "GPUs", "wall",
              "reclaims", "goodput", "cost (USD)", "ckpt every", deadline_s > 0 || o.budget > 0 ? "meets" : "");
  for (const Row& r : rows) {
    const std::string mark = deadline_s > 0 || o.budget > 0 ? (meets(r) && within(r) ? "yes" : "no") : "";
    std::printf("%-24s %-9s %5d %5d %10s %9s %8.3f %11.2f %10s %s%s\n", r.offer->name.substr(0, 24).c_str(),
                r.spot ? "spot" : "on demand", r.hosts, r.hosts * r.offer->gpus_per_host, hours(r.wall_s).c_str(),
                r.spot ? fmt_fixed(r.reclaims, 2).c_str() : "-", r.g.goodput, r.cost,
                r.spot ? (fmt_fixed(r.g.interval_s, 0) + " s").c_str() : "epoch ends", mark.c_str(),
                &r == chosen ? "  <- chosen" : "");
  }
  for (const json& s : speeds)
    log_info(str("speed of ", s["offer"].get<std::string>(), ": ", fmt_fixed(s["images_per_sec_per_gpu"].get<double>(), 1),
                 " images/s per GPU, ", s["source"].get<std::string>(),
                 s["measured_at_batch"] != o.batch_size
                     ? str(", measured at batch ", s["measured_at_batch"].get<int>(), ", not ", o.batch_size)
                     : std::string(),
                 "; several GPUs: ", s["scaling_source"].get<std::string>()));
  log_info(str("checkpoint cost ", fmt_fixed(costs.ckpt_cost_s, 3), " s (", costs.ckpt_source, "), write ",
               fmt_fixed(costs.ckpt_write_s, 2), " s (", costs.write_source, "), restart ",
               secs(costs.restart_s), " s (", costs.restart_source, "), start-up ", secs(costs.startup_s),
               " s (", costs.startup_source, "); the goodput model: docs/SCALING.md"));
  if (cheapest) log_info("cheapest" + (deadline_s > 0 ? " within " + o.deadline : std::string()) + ": " + describe(*cheapest));
  if (fastest) log_info("fastest" + (o.budget > 0 ? " within $" + fmt_fixed(o.budget, 2) : std::string()) + ": " + describe(*fastest));

  json plan{{"generated", utc_time_iso()},
            {"title", o.title.empty() ? str("spotrain plan: ", o.model, " ", o.precision, ", ",
                                            o.steps > 0 ? str(o.steps, " steps") : str(o.epochs, " epochs"))
                                      : o.title},
            {"work", {{"model", o.model}, {"precision", o.precision}, {"image_size", o.image_size},
                      {"batch_per_gpu", o.batch_size}, {"epochs", o.steps > 0 ? json(nullptr) : json(o.epochs)},
                      {"steps", o.steps > 0 ? json(o.steps) : json(nullptr)},
                      {"images_per_epoch", o.images_per_epoch}, {"parameters", nparams}}},
            {"catalog", {{"path", o.catalog}, {"about", about}}},
            {"recovery", o.recovery},
            {"deadline_seconds", deadline_s > 0 ? json(deadline_s) : json(nullptr)},
            {"budget_usd", o.budget > 0 ? json(o.budget) : json(nullptr)},
            {"speeds", speeds},
            {"left_out", left_out},
            {"costs", {{"checkpoint_cost_seconds", costs.ckpt_cost_s}, {"checkpoint_cost_source", costs.ckpt_source},
                       {"checkpoint_write_seconds", costs.ckpt_write_s}, {"checkpoint_write_source", costs.write_source},
                       {"restart_seconds", costs.restart_s}, {"restart_source", costs.restart_source},
                       {"startup_seconds", costs.startup_s}, {"startup_source", costs.startup_source}}},
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
  p->add_option("--model", o->model, "the model")->capture_default_str();
  p->add_option("--precision", o->precision, "fp32|tf32|bf16|fp16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}))->capture_default_str();
  p->add_option("--image-size", o->image_size, "image side")->capture_default_str();
  p->add_option("--num-classes", o->num_classes, "classes (the gradient size)")->capture_default_str();
  p->add_option("--batch-size", o->batch_size, "images per GPU and step")->capture_default_str();
  p->add_option("--epochs", o->epochs, "epochs of --images-per-epoch")->capture_default_str();
  p->add_option("--steps", o->steps, "steps instead of epochs (0 = use --epochs)");
  p->add_option("--images-per-epoch", o->images_per_epoch, "images per epoch (default: ImageNet-1k's)")
      ->capture_default_str();
  p->add_option("--data", o->data, "the --data of the launch line")->capture_default_str();
  p->add_option("--max-hosts", o->max_hosts, "host counts 1, 2, 4, ... up to this")->capture_default_str();
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
