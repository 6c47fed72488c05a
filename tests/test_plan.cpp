// `spotrain plan` end to end, and its library (run/plan.h) on its own: the table, the choice and its launch line from a catalog; the JSON,
// CSV and HTML (rendered in headless Chromium); speeds from bench files; costs from a run
// folder; bad catalogs; the model against the committed spot sweep; and the loop closed (a run
// started from a plan keeps it, and `report` sets the plan beside what the run measured).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "headless_page.h"
#include "observe/metrics.h"
#include "run/plan.h"
#include "run_command.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kBin = SPOTRAIN_BIN;
const std::string kSrc = SPOTRAIN_SOURCE_DIR;
// The H200 run's own `bench --json` (fp16, 6825.83 images/s per GPU).
const std::string kH200Bench = kSrc + "/tests/data/bench-h200-fp16-2026-12-04.json";

std::string scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("spotrain_plan_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// A bench file for an offer the project never measured, at DIR/a100.json: the H200's, its GPU
// an A100 and its speed 2500 images/s.
void write_a100_bench(const std::string& dir) {
  json a100 = json::parse(read_file(kH200Bench));
  a100["machine"]["gpu"] = "NVIDIA A100-SXM4-80GB";
  a100["images_per_sec"] = 2500.0;
  write_file(dir + "/a100.json", a100.dump());
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

// One offer of a catalog, TOML; `extra` replaces or adds keys (written last wins is not TOML,
// so the caller passes whole lines for the keys it changes).
std::string offer(const std::string& name, const std::string& gpu, int gpus, double on_demand, double spot,
                  double mtbf_h = 20, double notice = 30, double gbps = 100) {
  std::ostringstream s;
  s << "[[offer]]\nname = \"" << name << "\"\ngpu = \"" << gpu << "\"\ngpus_per_host = " << gpus
    << "\non_demand_per_hour = " << on_demand << "\nspot_per_hour = " << spot
    << "\nspot_hours_between_reclaims = " << mtbf_h << "\nnotice_seconds = " << notice
    << "\nnetwork_gbps = " << gbps << "\n\n";
  return s.str();
}

// The launch line a plan printed (its "launch: " line), and what the launcher makes of it with
// DRY_RUN=1 in `dir`, given `hosts` as hosts.txt.
struct Launched {
  std::string cmd;
  CommandResult dry;
};
Launched dry_run_launch(const std::string& plan_out, const std::string& dir, const std::string& hosts) {
  Launched l;
  std::smatch m;
  if (!std::regex_search(plan_out, m, std::regex(R"(\nlaunch: ([^\n]+))"))) return l;
  l.cmd = m[1];
  std::string cmd = l.cmd;
  cmd.replace(cmd.find("examples/"), 9, kSrc + "/examples/");
  write_file(dir + "/hosts.txt", hosts);
  l.dry = run_command("cd " + dir + " && DRY_RUN=1 SPOTRAIN=" + kBin + " " + cmd);
  return l;
}

// The last line a failed command printed: the one that must name the cause.
std::string last_line(const std::string& out) {
  auto l = lines(out);
  return l.empty() ? std::string() : l.back();
}

}  // namespace

// The issue's command: the example catalog, ResNet-50 for 90 epochs, a 24 h deadline.
TEST(Plan, TheExampleCatalogGivesATableAChoiceAndItsLaunchLine) {
  const std::string d = scratch("example");
  auto r = run_command(kBin + " plan --catalog " + kSrc + "/examples/offers.toml --model resnet50 --epochs 90 --deadline 24h --json " +
                       d + "/plan.json");
  ASSERT_EQ(r.code, 0) << r.out;
  // The issue's fastest row of before, 512 GPUs at 256 each (a global batch of 131,072, which
  // plain SGD would not train to ResNet-50's accuracy), is left out with its reason.
  bool left_131k = false;
  const json planned = json::parse(read_file(d + "/plan.json"));
  for (const json& l : planned["left_out_for_batch"])
    left_131k |= l["offer"] == "8x H200 141GB" && l["hosts"] == 64 &&
                 l["why"].get<std::string>().find("global batch of 131072") != std::string::npos;
  EXPECT_TRUE(left_131k) << read_file(d + "/plan.json");
  // The offers whose GPU this project has not measured are named, with how to measure them.
  for (const char* gpu : {"A100", "V100", "H100"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex(std::string("not planned: [^\\n]*") + gpu +
                                                    "[^\\n]*spotrain bench --model resnet50[^\\n]*--json")))
        << gpu << "\n" << r.out;
  // Rows: the two H200 offers x host counts 1..64 x spot and on demand, less the fleets whose
  // global batch (GPUs x 256) is beyond the 8,192 with evidence for SGD: 1x at 64 hosts, 8x from
  // 8 hosts on; each named once with the evidence.
  for (const char* offer : {"1x H200 141GB from 64 hosts", "8x H200 141GB from 8 hosts"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex(std::string("not planned: ") + offer +
                                                    ": a global batch of 16384 [^\\n]*beyond the 8192[^\\n]*Goyal")))
        << offer << "\n" << r.out;
  int rows = 0;
  std::set<std::string> purchases;
  for (const std::string& l : lines(r.out)) {
    std::smatch m;
    if (std::regex_match(l, m, std::regex(R"((1x|8x) H200 141GB\s+(spot|on demand)\s+(\d+)\s+(\d+)\s+.*\s(yes|no)(  <- chosen)?)"))) {
      ++rows;
      purchases.insert(m[2]);
      EXPECT_EQ(std::stoi(m[4]), std::stoi(m[3]) * (m[1] == "8x" ? 8 : 1)) << l;
    }
  }
  EXPECT_EQ(rows, (6 + 3) * 2) << r.out;
  EXPECT_EQ(purchases.size(), 2u);
  EXPECT_NE(r.out.find("cheapest within 24h: "), std::string::npos) << r.out;
  std::smatch chosen, launch;
  ASSERT_TRUE(std::regex_search(r.out, chosen, std::regex(R"(\nchosen: ([^\n]+))"))) << r.out;
  ASSERT_TRUE(std::regex_search(r.out, launch, std::regex(R"(\nlaunch: ([^\n]+))"))) << r.out;
  const std::string line = launch[1];
  EXPECT_NE(line.find("examples/resnet50/launch/mpirun.sh "), std::string::npos) << line;
  EXPECT_NE(line.find("--model resnet50"), std::string::npos) << line;
  EXPECT_NE(line.find("--epochs 90"), std::string::npos) << line;
  if (chosen[1].str().find("spot") != std::string::npos) {
    EXPECT_TRUE(std::regex_search(line, std::regex(R"(--ckpt-every auto --mtbf [0-9.]+h)"))) << line;
  }
  // Where the numbers come from is printed with them: a run reading files (the default --data)
  // at the rate measured end to end from JPEG files.
  EXPECT_NE(r.out.find("5381.0 images/s per GPU, spotrain bench --data imagefolder: (JPEG files"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("the goodput model: docs/SCALING.md"), std::string::npos) << r.out;
}

// The launch line runs: the launcher, dry, takes it as it is (hostfile, ranks per node, the
// plan kept with the run).
TEST(Plan, TheLaunchLineIsOneTheLauncherTakes) {
  const std::string d = scratch("launch");
  write_file(d + "/offers.toml", offer("8x H200", "H200", 8, 60, 18, 12));
  auto r = run_command("cd " + d + " && " + kBin + " plan --catalog offers.toml --epochs 1 --max-hosts 2 --json plan.json");
  ASSERT_EQ(r.code, 0) << r.out;
  const Launched l = dry_run_launch(r.out, d, "node01 slots=8\nnode02 slots=8\n");
  ASSERT_FALSE(l.cmd.empty()) << r.out;
  EXPECT_NE(l.cmd.find("RANKS_PER_NODE=8 "), std::string::npos) << l.cmd;
  EXPECT_NE(l.cmd.find("--plan plan.json"), std::string::npos) << l.cmd;
  ASSERT_EQ(l.dry.code, 0) << l.cmd << "\n" << l.dry.out;
  EXPECT_NE(l.dry.out.find("+ mpirun --hostfile hosts.txt -np "), std::string::npos) << l.dry.out;
}

// --mix: hosts of two offers in one job, each GPU's share of the global batch by its speed. With
// a deadline that one H200 misses and two H200s meet at a higher price, the cheapest fleet that
// meets it is an A100 beside an H200 (3 of every 4 micro-batches to the H200); its launch line
// is one the launcher and `spotrain train` take, and its row says which hosts it mixes.
TEST(Plan, AMixOfTwoOffersIsPricedAndItsLaunchLineRuns) {
  const std::string d = scratch("mix");
  write_file(d + "/offers.toml", offer("a100", "A100", 1, 3.2, 0.95) + offer("h200", "H200", 1, 9, 4.0));
  write_a100_bench(d);
  const std::string args = " plan --catalog offers.toml --epochs 90 --data synthetic --max-hosts 2 --deadline 4h --bench " +
                           kH200Bench + " --bench a100.json --json plan.json";
  auto plain = run_command("cd " + d + " && " + kBin + args);
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(plain.out.find(" + "), std::string::npos) << "no mix without --mix:\n" << plain.out;
  auto r = run_command("cd " + d + " && " + kBin + args + " --mix");
  ASSERT_EQ(r.code, 0) << r.out;
  json p = json::parse(read_file(d + "/plan.json"));
  const json& chosen = p["chosen"];
  ASSERT_TRUE(chosen["mix"].is_object()) << chosen.dump();
  EXPECT_EQ(chosen["mix"]["offers"], json({"a100", "h200"}));
  EXPECT_EQ(chosen["mix"]["hosts"], json({1, 1}));
  EXPECT_EQ(chosen["purchase"], "spot");
  // 512 images a step: micro-batches of 128, one on the A100 and three on the H200.
  EXPECT_EQ(chosen["global_batch"], 512);
  EXPECT_EQ(chosen["batch_per_gpu"], 128);
  EXPECT_EQ(chosen["mix"]["micro_batches"], json({1, 3}));
  // A step: the H200's three micro-batches (the slower side), each of half the 256 images the
  // speed was measured at (kHalvingCost more per image), over the images an epoch holds.
  const double step = 3 * 128 / 6825.83 * (1 + spotrain::kHalvingCost), steps = std::ceil(90 * 1281167.0 / 512);
  for (const json& row : p["rows"])
    if (row["offer"] == chosen["offer"] && row["purchase"] == "on_demand") {
      EXPECT_NEAR(row["wall_seconds"].get<double>(), p["costs"]["startup_seconds"].get<double>() + steps * step, 1.0);
    }
  EXPECT_NE(r.out.find("A100 x1 + H200 x1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("hosts.txt: 1 host(s) of a100 and 1 of h200"), std::string::npos) << r.out;
  const Launched l = dry_run_launch(r.out, d, "a100-1 slots=1\nh200-1 slots=1\n");
  ASSERT_FALSE(l.cmd.empty()) << r.out;
  EXPECT_NE(l.cmd.find(" 2 --model resnet50 "), std::string::npos) << l.cmd;
  EXPECT_NE(l.cmd.find("--batch-size 128 --image-size 224 --accum-steps 2"), std::string::npos) << l.cmd;
  ASSERT_EQ(l.dry.code, 0) << l.cmd << "\n" << l.dry.out;
  EXPECT_NE(l.dry.out.find("+ mpirun --hostfile hosts.txt -np 2 "), std::string::npos) << l.dry.out;
  // What the ranks would run: the settings parse and check.
  const std::string train = l.cmd.substr(l.cmd.find(" --model "));
  auto check = run_command("cd " + d + " && " + kBin + " train" + train + " --dry-run");
  EXPECT_EQ(check.code, 0) << train << "\n" << check.out;
}

// The JSON holds what the table printed, and the choice is what its rule says.
TEST(Plan, TheJsonAndCsvAgreeWithTheChoice) {
  const std::string d = scratch("json");
  write_file(d + "/offers.toml", "date = \"2026-12\"\n" + offer("one", "H200", 1, 8, 2.4, 20) +
                                     offer("eight", "H200", 8, 60, 18, 12, 30, 3200));
  auto r = run_command(kBin + " plan --catalog " + d + "/offers.toml --epochs 90 --deadline 2h --budget 20 --max-hosts 8 --json " +
                       d + "/plan.json --csv " + d + "/plan.csv");
  ASSERT_EQ(r.code, 0) << r.out;
  json p = json::parse(read_file(d + "/plan.json"));
  // "eight" at 8 hosts (64 GPUs x 256 = 16,384) is beyond SGD's evidence: left out, with why.
  ASSERT_EQ(p["rows"].size(), (4u + 3u) * 2u);
  ASSERT_EQ(p["left_out_for_batch"].size(), 1u) << p["left_out_for_batch"].dump();
  EXPECT_EQ(p["left_out_for_batch"][0]["offer"], "eight");
  EXPECT_EQ(p["left_out_for_batch"][0]["hosts"], 8);
  EXPECT_EQ(p["batch_evidence"]["max_global_batch"], 8192);
  const double deadline = p["deadline_seconds"], budget = p["budget_usd"];
  EXPECT_EQ(deadline, 7200);
  EXPECT_EQ(budget, 20);
  const json* cheapest = nullptr;
  for (const json& row : p["rows"]) {
    const double wall = row["wall_seconds"], cost = row["cost_usd"], g = row["goodput"];
    EXPECT_NEAR(cost, wall / 3600 * row["hosts"].get<double>() * row["price_per_host_hour"].get<double>(), 1e-6 * cost);
    EXPECT_GT(g, 0);
    EXPECT_LE(g, 1);
    if (row["purchase"] == "on_demand") {
      EXPECT_EQ(row["expected_reclaims"], 0);
      EXPECT_TRUE(row["checkpoint_interval_seconds"].is_null());
    } else {
      EXPECT_GT(row["expected_reclaims"].get<double>(), 0);
      EXPECT_GT(row["checkpoint_interval_seconds"].get<double>(), 0);
    }
    if (wall <= deadline && cost <= budget && (!cheapest || cost < (*cheapest)["cost_usd"].get<double>())) cheapest = &row;
  }
  // Spot reclaims cost goodput: never above on demand at the same offer and hosts.
  for (const json& a : p["rows"])
    for (const json& b : p["rows"])
      if (a["offer"] == b["offer"] && a["hosts"] == b["hosts"] && a["purchase"] == "spot" && b["purchase"] == "on_demand") {
        EXPECT_LE(a["goodput"].get<double>(), b["goodput"].get<double>() + 1e-12);
      }
  ASSERT_NE(cheapest, nullptr) << p.dump(1);
  EXPECT_EQ(p["chosen"], *cheapest) << "the cheapest that meets the deadline and the budget";
  EXPECT_EQ(p["cheapest"], *cheapest);
  EXPECT_NE(r.out.find("chosen: " + (*cheapest)["offer"].get<std::string>()), std::string::npos) << r.out;
  EXPECT_NE(p["launch"].get<std::string>().find("--plan " + d + "/plan.json"), std::string::npos);
  auto csv = lines(read_file(d + "/plan.csv"));
  ASSERT_EQ(csv.size(), 1 + p["rows"].size());
  EXPECT_EQ(csv[0].rfind("offer,gpu,purchase,hosts,gpus,", 0), 0u) << csv[0];
}

// A deadline nobody meets is an answer, not an error: the nearest miss, and no launch line.
TEST(Plan, ADeadlineNoOfferMeetsNamesTheNearestMiss) {
  const std::string d = scratch("miss");
  write_file(d + "/offers.toml", offer("one", "H200", 1, 8, 2.4));
  auto r = run_command(kBin + " plan --catalog " + d + "/offers.toml --epochs 90 --deadline 10m --max-hosts 4");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(last_line(r.out), std::regex(R"(^no offer meets the 10m deadline; the nearest miss: one, 4 hosts, (spot|on demand): )")))
      << r.out;
  EXPECT_EQ(r.out.find("launch:"), std::string::npos) << r.out;
  auto b = run_command(kBin + " plan --catalog " + d + "/offers.toml --epochs 90 --budget 1 --max-hosts 4");
  EXPECT_EQ(b.code, 0) << b.out;
  EXPECT_NE(last_line(b.out).find("no offer meets the $1.00 budget; the nearest miss: one, "), std::string::npos) << b.out;
}

// Bad input: one line, naming the file and the offer, exit 1; never a crash.
TEST(Plan, BadCatalogsAreOneErrorLine) {
  const std::string d = scratch("bad");
  struct Case {
    std::string name, catalog, flags, expect;
  };
  const std::string good = offer("ok", "H200", 1, 8, 2.4);
  std::string negative = offer("cheap", "H200", 1, -1, 2.4);
  std::string zero = offer("never", "H200", 1, 8, 2.4, 0);
  std::string unknown_key = good;
  unknown_key.insert(unknown_key.find("gpu ="), "gpus = 8\n");
  const std::vector<Case> cases = {
      {"unknown_gpu", offer("mystery", "Z9000", 1, 1, 0.5), "",
       "can be planned: mystery: no measured speed for resnet50 fp16 at 224x224 on Z9000: measure it on one with `spotrain bench"},
      {"negative", negative, "", ", offer 1 (cheap): a price must not be negative, got -1 on demand"},
      {"zero_mtbf", zero, "", ", offer 1 (never): spot_hours_between_reclaims must be above zero"},
      {"malformed", "[[offer]\nname = 'x'\n", "", " is not valid TOML: "},
      {"unknown_key", unknown_key, "", ", offer 1: unknown key 'gpus' (the keys: name, gpu,"},
      {"missing_key", "[[offer]]\nname = \"x\"\n", "", ", offer 1 has no 'gpu'"},
      {"no_offers", "date = \"2026\"\n", "", " has no [[offer]] tables"},
      {"bad_deadline", good, "--deadline soon", "--deadline: bad duration 'soon'"},
      {"bad_bench", good, "--bench " + d + "/nothing.json", "--bench " + d + "/nothing.json cannot be read"},
      {"bad_from_run", good, "--from-run " + d, "--from-run " + d + ": no metrics file"},
  };
  for (const Case& c : cases) {
    const std::string cat = d + "/" + c.name + ".toml";
    write_file(cat, c.catalog);
    auto r = run_command(kBin + " plan --catalog " + cat + " --epochs 90 " + c.flags);
    EXPECT_EQ(r.code, 1) << c.name << ": " << r.out;
    const std::string last = last_line(r.out);
    EXPECT_EQ(last.rfind("error: ", 0), 0u) << c.name << ": " << r.out;
    EXPECT_NE(last.find(c.expect), std::string::npos) << c.name << ": " << r.out;
    EXPECT_EQ(r.out.find("terminate"), std::string::npos) << c.name << ": " << r.out;
  }
  auto missing = run_command(kBin + " plan --catalog " + d + "/none.toml");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(last_line(missing.out).find("--catalog " + d + "/none.toml is not a file"), std::string::npos) << missing.out;
}

// Speeds from bench files: the H200 run's own `bench --json`, matched by the GPU it recorded,
// and a figure for an offer the project never measured.
TEST(Plan, BenchFilesGiveTheSpeed) {
  const std::string d = scratch("bench");
  write_file(d + "/offers.toml", offer("h200", "H200", 1, 8, 2.4) + offer("a100", "A100", 1, 3.2, 1.0));
  write_a100_bench(d);
  auto r = run_command(kBin + " plan --catalog " + d + "/offers.toml --epochs 1 --max-hosts 1 --data synthetic --json " + d +
                       "/plan.json --bench " + kH200Bench + " --bench " + d + "/a100.json");
  ASSERT_EQ(r.code, 0) << r.out;
  json p = json::parse(read_file(d + "/plan.json"));
  ASSERT_EQ(p["speeds"].size(), 2u) << p["speeds"].dump();
  EXPECT_TRUE(p["left_out"].empty());
  for (const json& s : p["speeds"]) {
    const bool h200 = s["offer"] == "h200";
    EXPECT_NEAR(s["images_per_sec_per_gpu"].get<double>(), h200 ? 6825.83 : 2500.0, 0.01) << s.dump();
    EXPECT_NE(s["source"].get<std::string>().find("--bench "), std::string::npos) << s.dump();
  }
  // One epoch at that speed: the on-demand wall is the start-up plus the images over the speed.
  for (const json& row : p["rows"])
    if (row["purchase"] == "on_demand") {
      const double ips = row["offer"] == "h200" ? 6825.83 : 2500.0;
      const double steps = std::ceil(1281167.0 / 256);
      EXPECT_NEAR(row["wall_seconds"].get<double>(), p["costs"]["startup_seconds"].get<double>() + steps * 256 / ips, 0.1);
    }
  // A run that reads files: the H200 at the rate measured end to end from files (this project's),
  // the A100, with no rate from files, at its compute-only bench, said so.
  auto files = run_command(kBin + " plan --catalog " + d + "/offers.toml --epochs 1 --max-hosts 1 --json " + d +
                           "/files.json --bench " + kH200Bench + " --bench " + d + "/a100.json");
  ASSERT_EQ(files.code, 0) << files.out;
  json f = json::parse(read_file(d + "/files.json"));
  for (const json& s : f["speeds"]) {
    const bool h200 = s["offer"] == "h200";
    EXPECT_NEAR(s["images_per_sec_per_gpu"].get<double>(), h200 ? 5381.0 : 2500.0, 0.01) << s.dump();
    EXPECT_NE(s["source"].get<std::string>().find(h200 ? "end to end" : "no rate from files was measured"),
              std::string::npos) << s.dump();
  }
}

// The model against the committed sweep of preempted runs: each run's measured goodput within
// 15% of what the model gives it; and a run far from the model fails the check.
TEST(Plan, TheModelHoldsAgainstTheSpotSweep) {
  const std::string sweep = kSrc + "/bench/data/spot_sweep-2026-12-04.jsonl";
  auto r = run_command(kBin + " plan --check-sweep " + sweep);
  EXPECT_EQ(r.code, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"((\d+) run\(s\): the model within 15% of (\d+);)"))) << r.out;
  EXPECT_GE(std::stoi(m[1]), 27) << "the sweep of docs/SCALING.md";
  EXPECT_EQ(m[1], m[2]) << r.out;

  const std::string d = scratch("sweep");
  std::ifstream in(sweep);
  std::string first;
  std::getline(in, first);
  json off = json::parse(first);
  off["goodput"] = off["goodput"].get<double>() * 1.5;  // a run the model does not explain
  write_file(d + "/off.jsonl", first + "\n" + off.dump() + "\n");
  auto bad = run_command(kBin + " plan --check-sweep " + d + "/off.jsonl");
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("2 run(s): the model within 15% of 1;"), std::string::npos) << bad.out;
  write_file(d + "/torn.jsonl", first + "\n{\"hosts\": 2\n");
  auto torn = run_command(kBin + " plan --check-sweep " + d + "/torn.jsonl");
  EXPECT_EQ(torn.code, 1);
  EXPECT_NE(last_line(torn.out).find("line 2 is not a JSON object"), std::string::npos) << torn.out;
}

// The page: cost against finish time per offer and purchase, the cheapest and the fastest
// marked, the deadline and the budget drawn; offline; the chosen row highlighted.
TEST(Plan, ThePageRendersInHeadlessChromiumWithoutTheNetwork) {
  if (!chromium_installed()) {
    if (std::getenv("SPOTRAIN_REQUIRE_BROWSER")) FAIL() << "chromium is not installed (scripts/install-deps.sh --test)";
    GTEST_SKIP() << "chromium is not installed (Debian package chromium; scripts/install-deps.sh --test adds it)";
  }
  const std::string d = scratch("page");
  const std::string page = d + "/plan.html";
  // Every fleet drawn (--show-unproven: those beyond the batch evidence too), at the
  // compute-only rates (--data synthetic), as the page's 7 points per series expect.
  auto r = run_command(kBin + " plan --catalog " + kSrc +
                       "/examples/offers.toml --epochs 90 --deadline 3h --budget 12 --data synthetic --show-unproven -o " + page);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string html = read_file(page);
  EXPECT_NE(html.find("Content-Security-Policy"), std::string::npos);
  EXPECT_FALSE(std::regex_search(html, std::regex(R"((src|href)\s*=\s*["']?(https?:)?//)")))
      << "the page refers to something on the network";
  auto dom = headless_dom(page);
  ASSERT_EQ(dom.code, 0) << dom.out.substr(0, 2000);
  const std::string text = selfcheck_text(dom.out);
  ASSERT_FALSE(text.empty()) << "the page's script did not finish: " << dom.out.substr(0, 2000);
  json c = json::parse(text);
  EXPECT_TRUE(c["violations"].empty()) << c["violations"];
  EXPECT_TRUE(c["resources"].empty()) << "the page fetched: " << c["resources"];
  ASSERT_EQ(c["series"].size(), 4u) << "2 planned offers x (spot, on demand): " << c.dump();
  std::set<std::string> colors;
  for (const json& s : c["series"]) {
    EXPECT_EQ(s["points"], 7) << s.dump();
    colors.insert(s["color"].get<std::string>());
  }
  EXPECT_EQ(colors.size(), 4u) << "each offer and purchase a colour of its own";
  EXPECT_EQ(c["marks"], json({"cheapest", "fastest"}));
  EXPECT_EQ(c["limits"], json({"deadline", "budget"}));
  for (const char* k : {"series", "cheapest", "fastest", "limits"})
    EXPECT_GT(c["pixels"][k].get<int>(), 30) << k << " is not drawn: " << c["pixels"].dump();
  EXPECT_EQ(c["chosen_row_highlighted"], 1);
}

// The loop closed on this machine: bench the CPU, plan from that file, train the chosen run with
// --plan (the folder keeps it), and `report` sets the plan beside what the run measured.
TEST(PlanLoop, ARunStartedFromAPlanKeepsItAndTheReportSetsItBeside) {
  const std::string d = scratch("loop");
  auto b = run_command(kBin + " bench --model resnet20 --image-size 32 --batch-size 8 --steps 3 --warmup 1 --threads 2 "
                              "--device cpu --json " + d + "/cpu.json");
  ASSERT_EQ(b.code, 0) << b.out;
  write_file(d + "/offers.toml", offer("this machine", "CPU", 1, 0.10, 0.03, 2, 0, 10));
  auto p = run_command(kBin + " plan --catalog " + d + "/offers.toml --model resnet20 --precision fp32 --image-size 32 "
                              "--num-classes 10 --batch-size 8 --steps 30 --max-hosts 1 --bench " + d +
                              "/cpu.json --json " + d + "/plan.json");
  ASSERT_EQ(p.code, 0) << p.out;
  json plan = json::parse(read_file(d + "/plan.json"));
  ASSERT_TRUE(plan["chosen"].is_object()) << plan.dump(1);
  const std::string run = d + "/run";
  // Stopped at step 20 (as a reclaim with a notice would), then resumed to the end: one restart.
  const std::string train = kBin + " train --data synthetic --model resnet20 --image-size 32 --batch-size 8 --steps 30 "
                                   "--threads 2 --log-every 5 --ckpt-every 10 --ckpt-dir " + run + " --plan " + d + "/plan.json";
  auto t = run_command("SPOTRAIN_FAULT=term:0:20 " + train);
  ASSERT_EQ(t.code, 75) << t.out;
  t = run_command(train + " --resume auto");
  ASSERT_EQ(t.code, 0) << t.out;
  ASSERT_TRUE(fs::exists(run + "/plan.json"));
  EXPECT_EQ(json::parse(read_file(run + "/plan.json")), plan);
  EXPECT_EQ(read_file(run + "/config.toml").find(d + "/plan.json"), std::string::npos)
      << "the plan is a file of the folder, not a setting a resume would need";
  // The checkpoint records carry what --from-run prices a checkpoint at.
  bool held = false;
  std::ifstream metrics(run + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    json rec = json::parse(line);
    if (rec["type"] == "checkpoint") {
      EXPECT_GE(rec["held_seconds"].get<double>(), 0.0) << line;
      EXPECT_GE(rec["write_seconds"].get<double>(), 0.0) << line;
      held = true;
    }
  }
  EXPECT_TRUE(held);
  auto from = run_command(kBin + " plan --catalog " + d + "/offers.toml --model resnet20 --precision fp32 --image-size 32 "
                                 "--num-classes 10 --batch-size 8 --steps 30 --max-hosts 1 --bench " + d +
                                 "/cpu.json --from-run " + run);
  ASSERT_EQ(from.code, 0) << from.out;
  EXPECT_TRUE(std::regex_search(from.out, std::regex(R"(checkpoint cost [0-9.]+ s \(the median state copy of \d+ checkpoint\(s\) in )")))
      << from.out;
  EXPECT_TRUE(std::regex_search(from.out, std::regex(R"(start-up [0-9.]+ s \(the median of 2 start\(s\) in )"))) << from.out;
  EXPECT_TRUE(std::regex_search(from.out, std::regex(R"(restart [0-9.]+ s \(the median of 1 restart\(s\) in )"))) << from.out;

  auto rep = run_command(kBin + " report " + run);
  ASSERT_EQ(rep.code, 0) << rep.out;
  EXPECT_TRUE(std::regex_search(rep.out, std::regex(R"(report: run against its plan \(this machine, (on_demand|spot)\): minutes [0-9.]+ planned, [0-9.]+ measured; reclaims)")))
      << rep.out;
  const std::string html = read_file(run + "/report.html");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(html, m, std::regex(R"(const REPORT = (\{.*\});\n)"))) << "no data in the page";
  json data = json::parse(m[1].str());
  const json& pv = data["runs"][0]["plan"];
  ASSERT_TRUE(pv.is_object()) << data["runs"][0].dump().substr(0, 500);
  EXPECT_NEAR(pv["predicted"]["hours"].get<double>(), plan["chosen"]["wall_seconds"].get<double>() / 3600, 1e-9);
  EXPECT_EQ(pv["measured"]["reclaims"], 1) << "one restart";
  EXPECT_GT(pv["measured"]["hours"].get<double>(), 0);
  EXPECT_GT(pv["measured"]["goodput"].get<double>(), 0);
  EXPECT_LE(pv["measured"]["goodput"].get<double>(), 1.0);

  // The page shows it: the plan's section, its four rows, in headless Chromium.
  if (chromium_installed()) {
    auto dom = headless_dom(run + "/report.html");
    ASSERT_EQ(dom.code, 0);
    std::smatch sec;
    ASSERT_TRUE(std::regex_search(dom.out, sec, std::regex(R"(<div id="plan-section"( hidden="")?>([\s\S]*?)<h2>Curves)")))
        << dom.out.substr(0, 2000);
    EXPECT_FALSE(sec[1].matched) << "the plan's section is hidden";
    const std::string body = sec[2];
    for (const char* what : {"measured / planned", ">wall time (h)<", ">reclaims (measured: restarts)<", ">goodput<", ">cost (USD)<"})
      EXPECT_NE(body.find(what), std::string::npos) << what << "\n" << body;
  } else if (std::getenv("SPOTRAIN_REQUIRE_BROWSER")) {
    FAIL() << "chromium is not installed (scripts/install-deps.sh --test)";
  }

  // A plan file that is not one: one line, and nothing started.
  write_file(d + "/notaplan.json", "{\"rows\": []}");
  auto bad = run_command(kBin + " train --data synthetic --model resnet20 --image-size 32 --batch-size 8 --steps 2 "
                                "--threads 2 --ckpt-dir " + d + "/bad --plan " + d + "/notaplan.json");
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(last_line(bad.out).find("--plan " + d + "/notaplan.json holds no plan with a chosen offer"), std::string::npos) << bad.out;
}

// ---- the planning library (run/plan.h) and the shared metrics reader, without the command ----

namespace {

spotrain::PlanRow row_of(const spotrain::Offer* of, double wall_s, double cost) {
  spotrain::PlanRow r;
  r.offer = of;
  r.wall_s = wall_s;
  r.cost = cost;
  return r;
}

}  // namespace

// The rule: the cheapest row before the deadline (and within a budget); with a budget alone, the
// fastest within it; none when nothing meets both.
TEST(PlanLibrary, TheChoiceIsTheCheapestBeforeTheDeadlineOrTheFastestWithinTheBudget) {
  spotrain::Offer of;
  const std::vector<spotrain::PlanRow> rows = {row_of(&of, 10 * 3600, 100), row_of(&of, 5 * 3600, 300),
                                               row_of(&of, 20 * 3600, 50)};
  auto c = spotrain::choose_row(rows, 12 * 3600, 0);
  EXPECT_EQ(c.chosen, &rows[0]) << "cheapest of those within 12 h";
  EXPECT_EQ(c.cheapest, &rows[0]);
  EXPECT_EQ(c.fastest, &rows[1]);
  c = spotrain::choose_row(rows, 0, 200);
  EXPECT_EQ(c.chosen, &rows[0]) << "fastest within $200";
  c = spotrain::choose_row(rows, 0, 0);
  EXPECT_EQ(c.chosen, &rows[2]) << "no limit: the cheapest";
  c = spotrain::choose_row(rows, 6 * 3600, 200);
  EXPECT_EQ(c.chosen, nullptr) << "the only row within 6 h costs $300";
  EXPECT_EQ(c.cheapest, &rows[1]);
}

// An offer whose GPU has no measured speed is left out with the bench line that would measure
// it; the others get rows at 1, 2, 4 hosts, spot and on demand, whose time falls with hosts.
TEST(PlanLibrary, AnOfferWithoutASpeedIsLeftOutWithTheBenchLineToRun) {
  std::vector<spotrain::Offer> offers(2);
  offers[0].name = "h200";
  offers[0].gpu = "H200";
  offers[0].on_demand = 30;
  offers[0].spot = 10;
  offers[0].spot_mtbf_h = 12;
  offers[0].network_gbps = 100;
  offers[1] = offers[0];
  offers[1].name = "mystery";
  offers[1].gpu = "X9000";
  spotrain::PlanInput in;
  in.max_hosts = 4;
  const spotrain::Planned p = spotrain::plan_offers(in, offers, {});
  ASSERT_EQ(p.left_out.size(), 1u);
  EXPECT_EQ(p.left_out[0]["offer"], "mystery");
  EXPECT_NE(p.left_out[0]["why"].get<std::string>().find("spotrain bench --model resnet50"), std::string::npos);
  ASSERT_EQ(p.rows.size(), 6u);
  EXPECT_GT(p.parameters, 25000000);
  for (size_t i = 2; i < p.rows.size(); ++i)
    if (p.rows[i].spot == p.rows[i - 2].spot) {
      EXPECT_LT(p.rows[i].work_s, p.rows[i - 2].work_s);
    }
}

// One reader for report and plan: torn lines counted, times and medians NaN where absent.
TEST(MetricsReader, TornLinesAreCountedAndMissingTimesAreNaN) {
  const std::string dir = scratch("reader");
  write_file(dir + "/metrics.jsonl",
             "{\"type\":\"start\",\"time\":\"2026-12-01T07:59:12.825Z\"}\n{\"type\":\"step\",\"st\n"
             "[1,2]\n{\"type\":\"end\"}\n");
  const spotrain::MetricsFile f = spotrain::read_metrics_file(dir + "/metrics.jsonl");
  ASSERT_EQ(f.records.size(), 2u);
  EXPECT_EQ(f.torn, 2);
  EXPECT_NEAR(spotrain::record_seconds(f.records[0]), 1796111952.825, 1e-3);
  EXPECT_TRUE(std::isnan(spotrain::record_seconds(f.records[1])));
  EXPECT_TRUE(std::isnan(spotrain::iso_seconds("yesterday")));
  EXPECT_TRUE(std::isnan(spotrain::median_of({})));
  EXPECT_EQ(spotrain::median_of({3, 1, 2}), 2);
  EXPECT_THROW(spotrain::read_metrics_file(dir + "/none.jsonl"), spotrain::Error);
}

// --from-run: a run of several ranks gives the plan its ranks' spread (a synchronous step
// waits for the slowest rank), the median over its windows; the plan's multi-GPU steps take it.
TEST(Plan, AMeasuredSpreadOfRankSpeedsSlowsTheStepsOfSeveralGpus) {
  const std::string d = scratch("spread");
  const std::string metrics = d + "/metrics.jsonl";
  {
    std::ofstream f(metrics);
    auto ranks = [](double slow) {
      return nlohmann::json::array({{{"rank", 0}, {"compute_s", 0.10}, {"input_s", 0.0}, {"wait_s", 0.1}},
                                    {{"rank", 1}, {"compute_s", 0.11}, {"input_s", 0.0}, {"wait_s", 0.1}},
                                    {{"rank", 2}, {"compute_s", slow}, {"input_s", 0.0}, {"wait_s", 0.0}}});
    };
    f << nlohmann::json{{"type", "start"}, {"time", "2026-12-01T00:00:00.000Z"}, {"ranks", 3}}.dump() << "\n";
    for (int i = 1; i <= 3; ++i)
      f << nlohmann::json{{"type", "step"}, {"step", 10 * i}, {"time", "2026-12-01T00:00:10.000Z"},
                          {"step_seconds", 0.2}, {"ranks", ranks(i == 3 ? 0.5 : 0.165)}}.dump() << "\n";
  }
  const spotrain::RunCosts c = spotrain::costs_from(d);
  EXPECT_NEAR(c.rank_spread, 1.5, 1e-9);  // 0.165 / 0.11 twice, 0.5 / 0.11 once: the median
  EXPECT_NE(c.spread_source.find("3 progress window(s)"), std::string::npos) << c.spread_source;
  EXPECT_EQ(spotrain::costs_from("").rank_spread, 1.0);
}
