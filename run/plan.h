// Planning a training run on rented GPUs (`spotrain plan`'s library): the offers of a catalog,
// the speed of each GPU model (the user's `bench --json` files or what this project measured),
// the checkpoint and restart costs of a real run, the rows (offer x host count x purchase) with
// their wall time, reclaims, goodput and cost from the goodput model (run/goodput.h), and the
// choice among them. tools/spotrain/plan.cpp parses the command line, calls this and prints.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "run/global_batch.h"
#include "run/goodput.h"

namespace spotrain {

// ---- the catalog ----

struct Offer {
  std::string name, gpu;
  int gpus_per_host = 1;
  double on_demand = 0, spot = 0;   // USD per host-hour
  double spot_mtbf_h = 0;           // hours between reclaims of one spot host
  double notice_s = 0, network_gbps = 0;
};

// The offers of a TOML catalog (examples/offers.toml); `about` gets its date and note. Throws
// Error naming the file, the offer and the key for anything malformed.
std::vector<Offer> read_catalog(const std::string& path, nlohmann::json* about);

// ---- the work and its speed ----

struct PlanWork {
  std::string model = "resnet50", precision = "fp16";
  std::string data = "imagefolder:/data/imagenet";  // a run that reads files, or "synthetic"
  std::string optimizer = "sgd";                    // sgd | lars: which global batches converge
  // batch_size: the most images a GPU takes in one forward (the memory limit); global_batch:
  // the images of one optimizer step (0: GPUs x batch_size, whatever the fleet), which a
  // fleet reaches with per-GPU micro-batches of at most batch_size and accumulation.
  int image_size = 224, num_classes = 1000, batch_size = 256;
  int64_t global_batch = 0;
  int64_t epochs = 90, steps = 0, images_per_epoch = 1281167;   // steps > 0 replaces epochs
  bool reads_files() const { return data != "synthetic"; }
};

// The largest global batch at which published training reached the model's usual accuracy
// with this optimizer, and where it was shown (docs/RECIPES.md); max_global 0 where none is
// known (the model or the optimizer).
struct BatchEvidence {
  int64_t max_global = 0;
  std::string source;
};
BatchEvidence batch_evidence(const std::string& model, const std::string& optimizer);

struct Speed {
  double ips_per_gpu = 0;   // training images/s of one GPU (one rank)
  int batch = 0;            // the batch per GPU it was measured at
  std::string source;
  double scaling = 1;       // per-GPU speed with several GPUs in a host, against one
  std::string scaling_source = "assumed 1.0 (no multi-rank measurement)";
  bool from_files = false;  // an end-to-end rate of a run reading files (else compute only)
};

// One `spotrain bench --json` file.
struct BenchFile {
  std::string path, gpu, model, precision;  // gpu: the name it recorded, "" for the CPU
  std::string data = "synthetic";           // what it read (its "data")
  int image_size = 0, batch = 0, ranks = 1;
  double ips = 0, ips_per_rank = 0;
};
BenchFile read_bench(const std::string& path);

// Whether the GPU name a bench recorded ("NVIDIA H200", "" for the CPU) is a catalog's `gpu`
// ("H200", "CPU"): the name as a whole word, in any case.
bool same_gpu(const std::string& recorded, const std::string& wanted);

// The speed of one GPU of `gpu` for `w`: from `benches` (a one-rank file for the speed, a
// multi-rank one for the scaling), else from what this project measured; false, with why and
// the bench line to run, where neither has it. A run that reads files takes a rate measured
// end to end from files where one is known (the source says which it took); a compute-only
// rate (synthetic data) only where none is, said so.
bool speed_for(const PlanWork& w, const std::string& gpu, const std::vector<BenchFile>& benches, Speed* s,
               std::string* why);

// ---- what a real run's checkpoints and restarts cost ----

struct RunCosts {
  double ckpt_cost_s = 0.05, ckpt_write_s = 2, restart_s = 120, startup_s = 30;
  std::string ckpt_source = "default: a GPU's state copy into pinned memory, one DMA (docs/SCALING.md)";
  std::string write_source = "default (docs/SCALING.md)";
  std::string restart_source = "default: noticing the loss, a replacement host, start-up (docs/SCALING.md)";
  std::string startup_source = "default: loading the model and the data, the first steps";
  // How much longer a step of several ranks takes than the bench's rank alone: a synchronous
  // step waits for its slowest rank. From a run of several ranks, the median over its progress
  // windows of the slowest rank's compute and input against the median rank's (1: none known).
  double rank_spread = 1;
  std::string spread_source = "none measured: every rank as fast as the bench's";
};
// From a run folder (or its metrics.jsonl): the medians of its checkpoints' state copies and
// writes, its starts and its restarts, and its ranks' spread; the defaults for what it did not
// measure ("": all).
RunCosts costs_from(const std::string& dir);

// ---- the rows and the choice ----

struct PlanRow {
  const Offer* offer = nullptr;  // into the offers plan_offers was given
  bool spot = false;
  int hosts = 1;
  // A mix (PlanInput::mix): hosts of a second offer beside `hosts` of `offer`, as many GPUs per
  // host, each GPU's share of the global batch following its rate (the batch's counts).
  const Offer* with = nullptr;
  int with_hosts = 0;
  double price = 0;  // per host-hour (a mix's: its hosts' mean)
  double wall_s = 0, cost = 0, reclaims = 0;
  double work_s = 0;  // the steps at full speed: what of wall_s is training that survives
  BatchSplit batch;   // the global batch as this fleet reaches it (run/global_batch.h)
  bool unproven = false;  // its global batch is beyond the evidence (PlanInput::show_unproven)
  Goodput g;
  int all_hosts() const { return hosts + with_hosts; }
  int gpus() const { return all_hosts() * offer->gpus_per_host; }
  // "8x H100 80GB" or "8x H100 80GB x2 + 8x A100 80GB x1" (hosts of each).
  std::string fleet() const;
};

struct PlanInput {
  PlanWork work;
  int max_hosts = 64;          // host counts 1, 2, 4, ... up to this
  double overlap = 0.6;        // share of a step backward hides the all-reduce under
  std::string recovery = "today";  // today | survivors (docs/SCALING.md)
  RunCosts costs;
  bool show_unproven = false;  // keep rows beyond the batch evidence, marked, instead of leaving them out
  // Also fleets that mix two offers of other GPUs and as many GPUs per host (1, 2, 4, ... hosts
  // of each, up to max_hosts in all): each GPU's share of the global batch follows its rate.
  bool mix = false;
};

struct Planned {
  std::vector<PlanRow> rows;
  nlohmann::json speeds = nlohmann::json::array();    // per offer planned: its speed and source
  nlohmann::json left_out = nlohmann::json::array();  // offers without a speed: {offer, why}
  std::vector<std::string> hopeless;  // rows left out: reclaimed faster than they restart
  // Fleets left out for their global batch (no fit, or beyond the evidence): {offer, hosts, why}.
  nlohmann::json batch_left_out = nlohmann::json::array();
  BatchEvidence evidence;
  int64_t parameters = 0;             // the model's (its gradient is all-reduced each step)
};
// Every offer with a speed, at 1, 2, 4, ... hosts, spot and on demand.
Planned plan_offers(const PlanInput& in, const std::vector<Offer>& offers, const std::vector<BenchFile>& benches);

struct PlanChoice {
  const PlanRow* cheapest = nullptr;  // before the deadline
  const PlanRow* fastest = nullptr;   // within the budget
  // The cheapest before the deadline and within the budget, or the fastest within the budget
  // when only a budget is given; null when none meets them.
  const PlanRow* chosen = nullptr;
  bool meets(const PlanRow& r) const { return deadline_s <= 0 || r.wall_s <= deadline_s; }
  bool within(const PlanRow& r) const { return budget <= 0 || r.cost <= budget; }
  double deadline_s = 0, budget = 0;  // 0: none
};
PlanChoice choose_row(const std::vector<PlanRow>& rows, double deadline_s, double budget);

}  // namespace spotrain
