// The goodput model of a data-parallel job on hosts that may be reclaimed (docs/SCALING.md), in
// one place: `spotrain plan` prices offers with it, --ckpt-every auto takes its checkpoint
// interval from it (run/ckpt_interval.h), `plan --check-sweep` holds it against the
// preempted runs bench/spot_sim.py measured, and --straggler-action leave weighs a slow host
// with it (decide_leave). Goodput: the share of paid host time that becomes
// training progress that survives.
#pragma once
#include <string>

namespace spotrain {

// Young's first-order optimum of the checkpoint interval, sqrt(2 C M), in seconds of training,
// for a checkpoint costing training C seconds and a job failing every M seconds on average.
double young_daly_interval(double cost_s, double job_mtbf_s);

// The failure part of goodput with a checkpoint every T seconds of training costing C, a
// restart costing R, and failures every M seconds (exponential): Daly's expected wall time per
// T of work, M e^(R/M) (e^((T+C)/M) - 1), where failures strike during restarts too; or, with
// fail_in_restart false, (M + R)(e^((T+C)/M) - 1), where they strike only while training.
double daly_failure_goodput(double T, double C, double R, double M, bool fail_in_restart = true);

// The survivors' recovery (a hard reclaim loses no work: the survivors save the last step every
// rank finished, the job goes on at once on the hosts left, N/(N-1) slower per step until the
// replacement is up `replacement_s` later, then grows back onto it at a stop and a start):
// M / (M + R_s + step/2 + replacement/N + R_g).
double survivors_failure_goodput(double M, double survivor_restart_s, double step_s,
                                 double replacement_s, int hosts, double grow_restart_s);

// One synchronous data-parallel job on `hosts` hosts.
struct SpotJob {
  int hosts = 1;
  double step_s = 1;           // compute of one step, every host alike (the batch per GPU is fixed)
  double grad_bytes = 0;       // all-reduced per step, between hosts
  double link_bytes_s = 0;     // bandwidth between hosts (0 with one host)
  double hop_latency_s = 10e-6;
  double overlap = 0.6;        // share of the step that backward hides communication under
  double host_mtbf_s = 0;      // mean time between reclaims of one host; 0: never reclaimed
  double notice_s = 0;         // warning before a reclaim (a cloud's spot notice)
  double ckpt_cost_s = 0.05;   // what a background checkpoint costs training
  double ckpt_write_s = 2;     // writing one (a stop waits for it)
  double restart_s = 120;      // from a reclaim to training again
  bool survivors = false;      // the survivors' recovery (docs/SCALING.md) instead of a restart (hosts > 1)
  double survivor_restart_s = 31, grow_restart_s = 10, replacement_s = 120;
};

struct Goodput {
  double job_mtbf_s = 0;       // host MTBF / hosts; 0 when never reclaimed
  double interval_s = 0;       // Young/Daly checkpoint interval (0 when never reclaimed)
  double comm_exposed_s = 0;   // per step, beyond what backward hides
  double step_efficiency = 1;  // step / (step + exposed communication)
  double failure_goodput = 1;  // what reclaims leave of the time
  double goodput = 1;          // the product
  bool notice_covers_stop = false;  // a notice long enough for a step and a checkpoint: no work lost
};
Goodput estimate_goodput(const SpotJob& job);

// A preempted run that bench/spot_sim.py measured (its JSON line): its own hosts, MTBF,
// seconds of surviving steps, wall time, restarts, preemptions, checkpoints and what they held
// training, its restart time and its start-up.
struct MeasuredSpotRun {
  std::string recovery = "today";  // "today" or "survivors"
  double hosts = 1, mtbf_s = 0, step_time_s = 0, wall_s = 0, lost_s = 0;
  double restarts = 0, preemptions = 0, checkpoints = 0, checkpoint_held_s = 0;
  double restart_s = 0;  // from a process's last record to the next one's first step, mean
  double startup_s = 0;  // from a start to its first step (the first process's is taken alike)
  double goodput = 0;    // what it measured
};
// The goodput the model gives such a run from its own measured costs and its own count of
// failures (a run's few failures are a Poisson draw: only with its own count does one run
// compare): wall = the start-up + the surviving steps + each restart + each hard reclaim's
// expected lost work, half a checkpoint interval and half a checkpoint (none with the
// survivors' recovery). Nothing of it is taken from the run's wall time.
double predicted_goodput(const MeasuredSpotRun& run);

// The same run at the expected number of failures instead of its own (Daly's term with the
// job MTBF = host MTBF / hosts, failures only while training as the simulator preempts): what
// a plan predicts before the run; single runs scatter around it as their count of failures does.
double expected_goodput(const MeasuredSpotRun& run);

// Whether a job ends sooner without a slow host (--straggler-action leave): the rest of the
// run at today's step time, against a restart plus the rest on the other ranks, each then
// taking ranks / (ranks - leaving) of the work (the global batch is kept): the slowest
// remaining rank's compute and input scaled so, plus what the step spends beyond its slowest
// rank (the all-reduce's exposed part: the least any rank waited).
struct LeaveCase {
  int ranks = 2, leaving = 1;   // ranks in the job, and on the host that would leave
  double step_s = 0;            // the job's step now (its slowest rank's compute, input and wait)
  double others_busy_s = 0;     // the slowest remaining rank's compute and input per step
  double exposed_s = 0;         // per step beyond the slowest rank: the least wait of any rank
  int64_t steps_left = 0;
  double restart_s = 0;         // a stop with a checkpoint and a start on the others
  // Shares that follow rates (run/rebalance.h): the remaining ranks' images per second of
  // compute, summed: a step on the others then takes global_batch / others_rate (0: shares stay
  // even, and others_busy_s scales by ranks / rest).
  double others_rate = 0;
  int64_t global_batch = 0;
};
struct LeaveDecision {
  double with_s = 0, without_s = 0;  // the rest of the run: with the host, and leaving it
  double step_without_s = 0;         // a step on the others
  bool pays = false;                 // without_s < with_s
};
LeaveDecision decide_leave(const LeaveCase& c);

}  // namespace spotrain
