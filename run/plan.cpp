// The planning library (see plan.h).
#include "run/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <toml.hpp>

#include "core/error.h"
#include "core/log.h"
#include "layers/resnet.h"
#include "observe/metrics.h"
#include "run/rebalance.h"

namespace spotrain {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  std::string out;
  for (char c : s)
    if (!(c == ' ' && !out.empty() && out.back() == ' ')) out += c;
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// What this project measured, with where (docs/PERFORMANCE.md). Only what was measured.
struct Measured {
  const char *gpu, *model, *precision;
  int image_size, batch;
  double ips;
  bool from_files;  // end to end, from image files (else synthetic data: compute only)
  const char* source;
};
const Measured kMeasured[] = {
    {"H200", "resnet50", "fp16", 224, 256, 5381, true,
     "spotrain bench --data imagefolder: (JPEG files, 15 loader threads, end to end) on one H200, 2026-12-04 "
     "(docs/PERFORMANCE.md)"},
    {"H200", "resnet50", "fp16", 224, 256, 6826, false,
     "spotrain bench (synthetic data: compute only) on one H200, 2026-12-04 (docs/PERFORMANCE.md)"},
    {"H200", "resnet50", "bf16", 224, 256, 6138, false,
     "spotrain bench (synthetic data: compute only) on one H200, 2026-12-04 (docs/PERFORMANCE.md)"},
    {"H200", "resnet50", "tf32", 224, 256, 3793, false,
     "spotrain bench (synthetic data: compute only) on one H200, 2026-12-04 (docs/PERFORMANCE.md)"},
    {"CPU", "resnet50", "bf16", 224, 32, 20.4, false,
     "spotrain bench (synthetic data) on a 2-core AMD EPYC with AVX-512 BF16, 2 threads, 2026-12-04 (docs/PERFORMANCE.md)"},
    {"CPU", "resnet50", "fp32", 224, 32, 8.2, false,
     "spotrain bench (synthetic data) on a 2-core AMD EPYC, 2 threads, beside PyTorch (docs/PERFORMANCE.md)"},
};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

// ---- the catalog ----------------------------------------------------------------------------

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

// ---- speeds ---------------------------------------------------------------------------------

bool same_gpu(const std::string& recorded, const std::string& wanted) {
  const std::string r = lower(recorded.empty() ? "cpu" : recorded), w = lower(wanted);
  const size_t at = r.find(w);
  if (at == std::string::npos) return false;
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  return (at == 0 || !word(r[at - 1])) && (at + w.size() == r.size() || !word(r[at + w.size()]));
}

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
  if (j.contains("data") && j["data"].is_string()) b.data = j["data"];
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

bool speed_for(const PlanWork& o, const std::string& gpu, const std::vector<BenchFile>& benches, Speed* s,
               std::string* why) {
  // A run that reads files takes an end-to-end rate from files first; synthetic data takes a
  // compute-only one first. Either falls back to the other kind, said in the source.
  const bool files = o.reads_files();
  for (bool want_files : {files, !files}) {
    const BenchFile* single = nullptr;
    const BenchFile* multi = nullptr;
    for (const BenchFile& b : benches) {
      if (!same_gpu(b.gpu, gpu) || b.model != o.model || b.precision != o.precision ||
          b.image_size != o.image_size || (b.data != "synthetic") != want_files)
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
      s->from_files = want_files;
      s->source = str("--bench ", b.path, " (", b.ranks, " rank", b.ranks > 1 ? "s" : "", ", ",
                      want_files ? "end to end from " + b.data : std::string("synthetic data: compute only"), ")");
      if (single && multi) {
        s->scaling = multi->ips_per_rank / single->ips_per_rank;
        s->scaling_source =
            str(fmt_fixed(s->scaling, 2), " per GPU at ", multi->ranks, " ranks (--bench ", multi->path, ")");
      } else if (multi) {
        s->scaling_source = str("the ", multi->ranks, "-rank measurement itself (--bench ", multi->path, ")");
      }
      break;
    }
    for (const Measured& m : kMeasured)
      if (m.from_files == want_files && lower(m.gpu) == lower(gpu) && o.model == m.model &&
          o.precision == m.precision && o.image_size == m.image_size) {
        s->ips_per_gpu = m.ips;
        s->batch = m.batch;
        s->from_files = m.from_files;
        s->source = m.source;
        break;
      }
    if (s->ips_per_gpu > 0) break;
  }
  if (s->ips_per_gpu > 0) {
    if (files && !s->from_files)
      s->source += "; no rate from files was measured on this GPU: a run reading " + o.data +
                   " may be slower (measure it with spotrain bench --data " + o.data + ")";
    return true;
  }
  *why = str("no measured speed for ", o.model, " ", o.precision, " at ", o.image_size, "x", o.image_size, " on ",
             gpu, ": measure it on one with `spotrain bench --model ", o.model, " --precision ", o.precision,
             " --image-size ", o.image_size, " --batch-size ", o.batch_size, files ? " --data " + o.data : "",
             " --json ", lower(gpu), ".json` and pass --bench ", lower(gpu), ".json");
  return false;
}

// ---- the global batch ---------------------------------------------------------------------------

BatchEvidence batch_evidence(const std::string& model, const std::string& optimizer) {
  // ResNet-50 on ImageNet only: the published results are of it (docs/RECIPES.md).
  if (model != "resnet50") return {};
  if (optimizer == "lars")
    return {32768, "LARS trained ResNet-50 to a global batch of 32K without loss of accuracy (You, Gitman, "
                   "Ginsburg 2017, \"Large Batch Training of Convolutional Networks\", arXiv:1708.03888)"};
  return {8192, "SGD with the linear learning-rate rule and warm-up held ResNet-50's accuracy up to a global "
                "batch of 8,192 (Goyal et al. 2017, \"Accurate, Large Minibatch SGD\", arXiv:1706.02677)"};
}

// ---- checkpoint and restart costs ------------------------------------------------------------

RunCosts costs_from(const std::string& dir) {
  RunCosts c;
  if (dir.empty()) return c;
  const std::string path = fs::is_directory(dir) ? (fs::path(dir) / "metrics.jsonl").string() : dir;
  SPOTRAIN_CHECK(std::ifstream(path).good(), "--from-run ", dir, ": no metrics file ", path,
                 " (a run folder of spotrain train)");
  // Every record, those a resume marked superseded too: their times and costs were real.
  const std::vector<json> recs = read_metrics_file(path).records;
  std::vector<double> held, written, restarts, startups, spreads;
  for (size_t i = 0; i < recs.size(); ++i) {
    const json& r = recs[i];
    if (r["type"] == "step" && r.contains("ranks") && r["ranks"].is_array() && r["ranks"].size() > 1) {
      std::vector<double> busy;
      for (const json& k : r["ranks"])
        if (k.is_object() && k.value("compute_s", -1.0) >= 0) busy.push_back(k.value("compute_s", 0.0) + k.value("input_s", 0.0));
      std::sort(busy.begin(), busy.end());
      if (busy.size() > 1 && busy[(busy.size() - 1) / 2] > 0) spreads.push_back(busy.back() / busy[(busy.size() - 1) / 2]);
    }
    if (r["type"] == "checkpoint") {
      if (r.contains("held_seconds") && r["held_seconds"].is_number()) held.push_back(r["held_seconds"]);
      if (r.contains("write_seconds") && r["write_seconds"].is_number() && r["write_seconds"] > 0)
        written.push_back(r["write_seconds"]);
    }
    if (r["type"] != "start") continue;
    // One process: its start, its resume (if it loaded a checkpoint), its first step record.
    const double started = record_seconds(r);
    double resumed = NAN;
    int64_t from_step = 0;
    for (size_t k = i + 1; k < recs.size() && recs[k]["type"] != "start"; ++k) {
      const json& q = recs[k];
      if (q["type"] == "resume") {
        resumed = record_seconds(q);
        from_step = q.contains("step") && q["step"].is_number_integer() ? q["step"].get<int64_t>() : 0;
      }
      if (q["type"] == "step") {
        // The start-up: to the first step record, less the steps that window trained.
        const double t = record_seconds(q);
        const int64_t steps = q.contains("step") && q["step"].is_number_integer() ? q["step"].get<int64_t>() - from_step : 0;
        const double step_s = q.contains("step_seconds") && q["step_seconds"].is_number() ? q["step_seconds"].get<double>() : 0;
        if (std::isfinite(started) && t > started) startups.push_back(std::max(0.0, t - started - double(steps) * step_s));
        break;
      }
    }
    // A restart: from the previous process's last record to this one's resume (training again).
    const double before = i > 0 ? record_seconds(recs[i - 1]) : NAN;
    if (std::isfinite(before) && resumed > before) restarts.push_back(resumed - before);
  }
  if (!held.empty()) {
    c.ckpt_cost_s = median_of(held);
    c.ckpt_source = str("the median state copy of ", held.size(), " checkpoint(s) in ", path);
  }
  if (!written.empty()) {
    c.ckpt_write_s = median_of(written);
    c.write_source = str("the median write of ", written.size(), " checkpoint(s) in ", path);
  }
  if (!startups.empty()) {
    c.startup_s = median_of(startups);
    c.startup_source = str("the median of ", startups.size(), " start(s) in ", path,
                           " (to the first step record, less the steps it timed)");
  }
  if (!spreads.empty()) {
    c.rank_spread = std::max(1.0, median_of(spreads));
    c.spread_source = str("the median of ", spreads.size(), " progress window(s) in ", path,
                          " (the slowest rank's compute and input against the median rank's)");
  }
  if (!restarts.empty()) {
    c.restart_s = median_of(restarts);
    c.restart_source = str("the median of ", restarts.size(), " restart(s) in ", path,
                           " (from the last record before each to its resume)");
  }
  return c;
}

// ---- the rows and the choice ------------------------------------------------------------------

std::string PlanRow::fleet() const {
  return with ? str(offer->name, " x", hosts, " + ", with->name, " x", with_hosts) : offer->name;
}

namespace {

// One offer's hosts in a fleet, at its per-GPU speed.
struct FleetPart {
  const Offer* offer = nullptr;
  int hosts = 0;
  double ips_per_gpu = 0;
};

// The rows (spot and on demand) of a fleet of one offer's hosts, or of two offers' (their GPUs
// per host alike), into `out`; or why its global batch leaves it out.
void plan_fleet(const PlanInput& in, const std::vector<FleetPart>& parts, double images, Planned& out) {
  const PlanWork& w = in.work;
  const RunCosts& costs = in.costs;
  const Offer& first = *parts[0].offer;
  int hosts = 0;
  std::vector<double> rates;  // each GPU's images/s
  for (const FleetPart& p : parts) {
    hosts += p.hosts;
    rates.insert(rates.end(), size_t(p.hosts * p.offer->gpus_per_host), p.ips_per_gpu);
  }
  const int gpus = int(rates.size());
  const std::string name = parts.size() == 1 ? first.name : str(first.name, " + ", parts[1].offer->name);
  const json where = parts.size() == 1 ? json{{"offer", name}, {"hosts", hosts}}
                                       : json{{"offer", name}, {"hosts", {parts[0].hosts, parts[1].hosts}}};
  auto left_out = [&](const std::string& why) {
    json j = where;
    j["why"] = why;
    out.batch_left_out.push_back(j);
  };
  // The global batch as this fleet reaches it: fixed by the recipe (micro-batches of at most
  // --batch-size, accumulated), or GPUs x --batch-size; then held against the evidence.
  BatchSplit fit = first_split(gpus, w.batch_size, 1);
  std::string why_not;
  if (w.global_batch > 0 && !split_evenly(w.global_batch, gpus, w.batch_size, &fit, &why_not)) return left_out(why_not);
  const bool unproven = out.evidence.max_global > 0 && fit.global() > out.evidence.max_global;
  if (unproven && !in.show_unproven)
    return left_out(str("a global batch of ", fit.global(), " (", gpus, " GPUs x ", fit.micro,
                        fit.count(0) > 1 ? str(" x ", fit.count(0), " accumulated") : std::string(), ") is beyond the ",
                        out.evidence.max_global, " with evidence that ", w.optimizer, " reaches the accuracy: ",
                        out.evidence.source));
  // Each GPU's share of it follows its rate, as training's does by default (run/rebalance.h):
  // an even fleet keeps its even split; a mix moves micro-batches to the faster GPUs.
  const BatchSplit split = split_by_rate(fit.global(), fit.micro, rates, Rebalancer::kMargin);
  const double global_batch = double(split.global());
  const double steps = w.steps > 0 ? double(w.steps) : std::ceil(images / global_batch);
  // A step: each GPU's micro-batches at its measured images/s, the slowest setting the pace.
  // What a micro-batch costs beyond its images (its gradients added into the sum) was measured
  // on the CPU within the noise, K = 4 against K = 1 at the same micro-batch (-3.5% to +3.2%,
  // docs/PERFORMANCE.md, "Gradient accumulation"): none is counted. Not measured on a GPU. Several
  // GPUs wait for the slowest each step: the spread a run of several ranks measured.
  // Micro-batches halved for a mix cost kHalvingCost a halving more per image.
  double step_s = 0;
  for (size_t r = 0; r < rates.size(); ++r) step_s = std::max(step_s, double(split.counts[r] * split.micro) / rates[r]);
  for (int64_t m = split.micro; m < fit.micro; m *= 2) step_s *= 1 + kHalvingCost;
  step_s *= gpus > 1 ? costs.rank_spread : 1.0;
  for (bool spot : {true, false}) {
    PlanRow r;
    r.offer = &first;
    r.hosts = parts[0].hosts;
    if (parts.size() > 1) {
      r.with = parts[1].offer;
      r.with_hosts = parts[1].hosts;
    }
    r.batch = split;
    r.unproven = unproven;
    r.spot = spot;
    double fleet_price = 0, reclaim_rate = 0;  // per hour; reclaims per second of the fleet
    SpotJob job;
    job.notice_s = first.notice_s;
    job.link_bytes_s = first.network_gbps * 1e9 / 8.0;
    for (const FleetPart& p : parts) {
      fleet_price += p.hosts * (spot ? p.offer->spot : p.offer->on_demand);
      if (spot) reclaim_rate += p.hosts / (p.offer->spot_mtbf_h * 3600.0);
      job.notice_s = std::min(job.notice_s, p.offer->notice_s);
      job.link_bytes_s = std::min(job.link_bytes_s, p.offer->network_gbps * 1e9 / 8.0);
    }
    r.price = fleet_price / hosts;
    job.hosts = hosts;
    job.step_s = step_s;
    job.grad_bytes = 4.0 * double(out.parameters);
    job.overlap = in.overlap;
    job.survivors = in.recovery == "survivors";
    job.replacement_s = costs.restart_s;  // a replacement host is up about when a restart would be
    job.host_mtbf_s = spot ? double(hosts) / reclaim_rate : 0.0;
    job.ckpt_cost_s = costs.ckpt_cost_s;
    job.ckpt_write_s = costs.ckpt_write_s;
    job.restart_s = costs.restart_s;
    r.g = estimate_goodput(job);
    r.work_s = steps * step_s;
    r.wall_s = costs.startup_s + r.work_s / r.g.goodput;
    r.reclaims = spot ? r.wall_s * reclaim_rate : 0.0;
    r.cost = r.wall_s / 3600.0 * fleet_price;
    if (!(r.g.goodput > 1e-6) || !std::isfinite(r.wall_s)) {  // reclaims faster than it restarts
      out.hopeless.push_back(str(name, " on ", hosts, " hosts, spot: the job would be reclaimed every ",
                                 fmt_fixed(r.g.job_mtbf_s, 1), " s, faster than it restarts"));
      continue;
    }
    out.rows.push_back(r);
  }
}

}  // namespace

Planned plan_offers(const PlanInput& in, const std::vector<Offer>& offers, const std::vector<BenchFile>& benches) {
  const PlanWork& w = in.work;
  Planned out;
  // The work, and what one step all-reduces (fp32 gradients of the model's parameters).
  ResNetOptions ro;
  ro.arch = w.model;
  ro.num_classes = w.num_classes;
  ro.in_channels = 3;
  std::vector<Param*> params;
  auto net = build_resnet(ro);
  net->collect_params(params);
  for (Param* p : params) out.parameters += p->value.numel();
  const double images = w.steps > 0 ? 0.0 : double(w.epochs) * double(w.images_per_epoch);
  out.evidence = batch_evidence(w.model, w.optimizer);
  std::vector<FleetPart> rated;  // the offers with a speed (hosts 0)
  for (const Offer& of : offers) {
    Speed sp;
    std::string why;
    if (!speed_for(w, of.gpu, benches, &sp, &why)) {
      out.left_out.push_back({{"offer", of.name}, {"why", why}});
      continue;
    }
    out.speeds.push_back({{"offer", of.name}, {"gpu", of.gpu}, {"images_per_sec_per_gpu", sp.ips_per_gpu},
                          {"measured_at_batch", sp.batch}, {"source", sp.source},
                          {"multi_gpu_scaling", sp.scaling}, {"scaling_source", sp.scaling_source}});
    // A multi-rank bench measured GPUs within one host; between hosts the all-reduce term counts.
    rated.push_back({&of, 0, sp.ips_per_gpu * (of.gpus_per_host > 1 ? sp.scaling : 1.0)});
    for (int hosts = 1; hosts <= in.max_hosts; hosts *= 2)
      plan_fleet(in, {{&of, hosts, rated.back().ips_per_gpu}}, images, out);
  }
  // Mixes (PlanInput::mix): hosts of two offers of other GPUs, as many GPUs per host, in one job.
  for (size_t a = 0; in.mix && a < rated.size(); ++a)
    for (size_t b = a + 1; b < rated.size(); ++b) {
      const Offer &oa = *rated[a].offer, &ob = *rated[b].offer;
      if (oa.gpus_per_host != ob.gpus_per_host || same_gpu(oa.gpu, ob.gpu)) continue;
      for (int ha = 1; ha < in.max_hosts; ha *= 2)
        for (int hb = 1; ha + hb <= in.max_hosts; hb *= 2)
          plan_fleet(in, {{&oa, ha, rated[a].ips_per_gpu}, {&ob, hb, rated[b].ips_per_gpu}}, images, out);
    }
  return out;
}

PlanChoice choose_row(const std::vector<PlanRow>& rows, double deadline_s, double budget) {
  PlanChoice c;
  c.deadline_s = deadline_s;
  c.budget = budget;
  for (const PlanRow& r : rows) {
    if (c.meets(r) && (!c.cheapest || r.cost < c.cheapest->cost)) c.cheapest = &r;
    if (c.within(r) && (!c.fastest || r.wall_s < c.fastest->wall_s)) c.fastest = &r;
    if (c.meets(r) && c.within(r)) {
      const bool better = !c.chosen || (deadline_s > 0 || budget <= 0 ? r.cost < c.chosen->cost
                                                                       : r.wall_s < c.chosen->wall_s);
      if (better) c.chosen = &r;
    }
  }
  return c;
}

}  // namespace spotrain
