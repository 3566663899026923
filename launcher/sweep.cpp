#include "launcher/sweep.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/format.h"
#include "analysis/predict.h"
#include "analysis/report.h"
#include "analysis/stats.h"
#include "config/knob_flags.h"
#include "launcher/cli.h"
#include "launcher/lab_runs.h"
#include "launcher/page.h"
#include "launcher/rank_agreement.h"
#include "launcher/run.h"
#include "record/files.h"
#include "runtime/errors.h"
#include "runtime/watchdog.h"
#include "train/stop_signals.h"

namespace ddplab {

CLI::App* add_sweep_command(CLI::App& app, SweepOptions& o) {
  CLI::App* sweep = app.add_subcommand("sweep", "bucket size x overlap grid: step time, exposed and hidden comm");
  o.base.steps = 20;
  add_train_flags(sweep, o.base, FlagSet::kSweep);
  sweep->add_option("--bucket-mb", o.bucket_mb, "bucket caps to try, MiB, comma-separated")
      ->transform(decimal_validator<double>())
      ->delimiter(',')
      ->capture_default_str();
  sweep->add_option("--overlap", o.overlap, "on, off, or on,off")->delimiter(',')->capture_default_str();
  sweep->add_option("--out-dir", o.out_dir, "folder for the run files and the summary (default runs/sweep_<time>)")
      ->check(non_empty_path());
  sweep->add_flag("--predict", o.predict,
                  "first a run at the default bucket cap and overlap; every point predicted from it (ddplab predict), "
                  "then measured (with --repeats, each round starts with its own such run)");
  sweep
      ->add_option("--calibration", o.calibration,
                   "with --predict: allreduce_perf -J file whose all-reduce times the predictions use, as "
                   "ddplab predict --calibration (where the first run's buckets are too alike in size to fit latency)")
      ->check(non_empty_path())
      ->type_name("FILE");
  sweep
      ->add_option("--repeats", o.repeats,
                   "measure every point K times, in K rounds over the grid (each round every point once), and take "
                   "the median: the grid's order and the machine's drift stop favouring one point")
      ->transform(decimal_validator<int>())
      ->type_name("K")
      ->capture_default_str();
  return sweep;
}

namespace {

struct SweepPoint {
  double bucket_mb;
  std::string overlap;
  RunSummary summary;                  // the median repeat's (for an even count the lower of the middle two)
  std::string path;                    // its run file
  std::vector<double> repeat_step_ms;  // every repeat's slowest step, in the order measured
  // The buckets its cap cut (first and last piece of each). Points with the same buckets and overlap are one
  // setting measured under two names (e.g. 25 and 100 MB when the gradients' largest bucket is 8 MB): their runs
  // are pooled, `setting_step_ms` is the median of all of them, and that is what ranks the points.
  std::vector<std::pair<int, int>> buckets;
  std::vector<double> same_buckets_as;  // the other caps of the same setting
  double setting_step_ms = 0;
  double setting_fastest_ms = 0, setting_slowest_ms = 0;  // its runs' range: the machine's noise
  // --predict: round k's prediction, from round k's own first run.
  std::vector<Prediction> repeat_predicted;
  // The median one of them (of an even count the lower middle one, as for the measurement); null without --predict.
  const Prediction* predicted() const {
    if (repeat_predicted.empty()) return nullptr;
    std::vector<const Prediction*> sorted;
    for (const Prediction& p : repeat_predicted) sorted.push_back(&p);
    std::sort(sorted.begin(), sorted.end(),
              [](const Prediction* a, const Prediction* b) { return a->step.step_ms < b->step.step_ms; });
    return sorted[(sorted.size() - 1) / 2];
  }
  double repeat_error_pct(size_t k) const {
    return 100 * (repeat_predicted[k].step.step_ms - repeat_step_ms[k]) / repeat_step_ms[k];
  }
  // Each round's prediction against the same round's measurement, the median over the rounds: the machine drifts
  // over a sweep's minutes (every point of a round 7-10% off the round before, seen on a quiet machine), and a
  // round's first run sees the drift its points see.
  double error_pct() const {
    std::vector<double> errors;
    for (size_t k = 0; k < repeat_predicted.size(); ++k) errors.push_back(repeat_error_pct(k));
    return median(errors);
  }
};

// A point's run in a round: bucket1_overlap_on (one round), bucket1_overlap_on_r2 (round 2 of several).
std::string point_run_name(const SweepOptions& o, double bucket_mb, const std::string& overlap, int round) {
  char name[80];
  if (o.repeats == 1)
    std::snprintf(name, sizeof name, "bucket%g_overlap_%s", bucket_mb, overlap.c_str());
  else
    std::snprintf(name, sizeof name, "bucket%g_overlap_%s_r%d", bucket_mb, overlap.c_str(), round + 1);
  return name;
}

// The run a round's predictions start from: predict_from, or predict_from_r<k> of several rounds.
std::string predict_run_name(const SweepOptions& o, int round) {
  return o.repeats == 1 ? "predict_from" : "predict_from_r" + std::to_string(round + 1);
}

// Every run file the sweep will write in its folder.
std::vector<std::string> sweep_outputs(const SweepOptions& o) {
  std::vector<std::string> names;
  for (int round = 0; round < o.repeats; ++round) {
    if (o.predict) names.push_back(predict_run_name(o, round) + ".h5");
    for (double b : o.bucket_mb)
      for (const std::string& overlap : o.overlap) names.push_back(point_run_name(o, b, overlap, round) + ".h5");
  }
  return names;
}

// --predict: a round's first run, at train's default bucket cap and overlap and the sweep's other flags, and the
// model built from it (on rank 0; the other ranks learn only whether that worked).
struct PredictSource {
  std::string path;
  std::optional<StepModel> model;
};
PredictSource run_predict_source(const SweepOptions& o, const std::optional<Calibration>& calibration, int round,
                                 const std::string& command_line, MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  TrainConfig config = o.base;
  config.quiet = true;
  const std::string name = predict_run_name(o, round);
  config.out = o.out_dir + "/" + name + ".h5";
  const SummarizedRun r = run_training(config, world, RunOptions{"sweep", command_line, name});
  PredictSource source{r.record.path, std::nullopt};
  std::string error;
  if (rank == 0) {
    try {
      source.model = build_model(r.record, calibration);
    } catch (const std::invalid_argument& e) {
      error = std::string("--predict: ") + e.what();
    }
  }
  error = broadcast_error(error, world);
  if (!error.empty()) throw UsageError(error);
  return source;
}

std::string predicted_text(const SweepPoint& p) {
  char text[64];
  std::snprintf(text, sizeof text, " %9.2f %+6.1f%%%s", p.predicted()->step.step_ms, p.error_pct(),
                p.predicted()->extrapolated.empty() ? "" : " *");
  return text;
}

// Predicted against measured over the grid: the error's spread, the footnotes, and the point the model recommends
// against the fastest measured one. Returns the JSON of the same. `sources`: each round's.
nlohmann::json print_prediction_summary(const std::vector<PredictSource>& sources,
                                        const std::vector<SweepPoint>& points, const SweepPoint& best_measured) {
  // The recommendation is round 1's model's, as `ddplab predict` on that one run makes it.
  std::vector<Prediction> rows;
  std::vector<double> errors;
  for (const SweepPoint& p : points) {
    rows.push_back(p.repeat_predicted.front());
    errors.push_back(std::fabs(p.error_pct()));
  }
  std::vector<double> own_errors;  // each round's run at its own setting, replayed by its own model
  nlohmann::json rounds = nlohmann::json::array();
  for (const PredictSource& source : sources) {
    const StepModel& m = *source.model;
    const double own = predict(m, m.measured).step.step_ms;
    own_errors.push_back(100 * (own - m.measured_step_ms) / m.measured_step_ms);
    rounds.push_back({{"run_file", source.path},
                      {"step_ms", m.measured_step_ms},
                      {"predicted_step_ms", own},
                      {"error_pct", own_errors.back()}});
  }
  const StepModel& first = *sources.front().model;
  const double tolerance = ranking_tolerance(first);
  const Recommendation chosen = recommend(rows, first.measured, tolerance);
  const SweepPoint* recommended = &points[chosen.row];
  if (const std::vector<std::string> footnotes = extrapolation_footnotes(rows); !footnotes.empty()) {
    std::printf("* extrapolated beyond what was measured:\n");
    for (const std::string& line : footnotes) std::printf("    %s\n", line.c_str());
  }
  const double median_error = median(errors), worst = *std::max_element(errors.begin(), errors.end());
  const double own_error = median(own_errors);
  const double vs_best = 100 * (recommended->setting_step_ms / best_measured.setting_step_ms - 1);
  if (sources.size() == 1)
    std::printf(
        "\npredicted from %s (--bucket-mb %g --overlap %s: %.2f ms/step; the model at that setting %.2f, "
        "%+.1f%%)\n",
        sources[0].path.c_str(), first.measured.bucket_mb, first.measured.overlap ? "on" : "off",
        first.measured_step_ms, rounds[0]["predicted_step_ms"].get<double>(), own_error);
  else
    std::printf(
        "\neach round predicted from its own first run at --bucket-mb %g --overlap %s (%s, ..._r%zu.h5; "
        "each model at that setting: median %+.1f%%)\npredicted: the rounds' median; error: the median "
        "over the rounds of a round's prediction against the same round's measurement\n",
        first.measured.bucket_mb, first.measured.overlap ? "on" : "off", sources[0].path.c_str(), sources.size(),
        own_error);
  if (first.calibration) std::printf("all-reduce times from the calibration %s\n", first.calibration->path.c_str());
  std::printf("|error| over the %zu points: median %.1f%%, max %.1f%%\n", errors.size(), median_error, worst);
  std::printf(
      "recommended by the model%s: --bucket-mb %g --overlap %s (predicted %.2f ms/step, measured %.2f: "
      "%+.1f%% against the fastest measured point)\n",
      sources.size() > 1 ? " of round 1" : "", recommended->bucket_mb, recommended->overlap.c_str(),
      rows[chosen.row].step.step_ms, recommended->setting_step_ms, vs_best);
  if (chosen.within_noise > 0)
    std::printf(
        "  %d other point(s) predicted within %.1f%% of the fastest (two standard errors of the run's step): "
        "too close to rank, so %s\n",
        chosen.within_noise, 100 * tolerance, chosen.own ? "the run's own setting" : "the fewest buckets among them");
  return {{"predicted_from",
           {{"run_file", sources[0].path},
            {"bucket_mb", first.measured.bucket_mb},
            {"overlap", first.measured.overlap ? "on" : "off"},
            {"step_ms", first.measured_step_ms},
            {"predicted_step_ms", rounds[0]["predicted_step_ms"]},
            {"error_pct", own_error},
            {"calibration", first.calibration ? nlohmann::json(first.calibration->path) : nlohmann::json(nullptr)},
            {"rounds", rounds}}},
          {"median_abs_error_pct", median_error},
          {"max_abs_error_pct", worst},
          {"recommended",
           {{"bucket_mb", recommended->bucket_mb},
            {"overlap", recommended->overlap},
            {"predicted_step_ms", rows[chosen.row].step.step_ms},
            {"step_ms", recommended->setting_step_ms},
            {"vs_best_measured_pct", vs_best},
            {"within_noise", chosen.within_noise},
            {"tolerance_pct", 100 * tolerance}}}};
}

// One point's run: the sweep's flags with the point's cap and overlap.
TrainConfig point_config(const SweepOptions& o, double bucket_mb, const std::string& overlap) {
  TrainConfig config = o.base;
  config.bucket_mb = bucket_mb;
  config.overlap = overlap == "on";
  config.quiet = true;
  return config;
}

// Bad flags end the sweep before any run (exit 2). Each point's config is checked as train checks its own, the cap
// by --bucket-mb's declared range; the checks of a world size (validate_launch, on the base) read neither the cap nor
// the overlap.
void validate_sweep(const SweepOptions& o) {
  validate(o.base);
  for (const std::string& v : o.overlap)
    require(v == "on" || v == "off", "--overlap takes on and/or off (got '" + v + "')");
  require(!o.bucket_mb.empty() && !o.overlap.empty(), "--bucket-mb and --overlap need at least one value each");
  require(o.calibration.empty() || o.predict, "--calibration times the predictions: it needs --predict");
  for (const std::string& overlap : o.overlap)
    for (double b : o.bucket_mb) {
      try {
        validate(point_config(o, b, overlap));
      } catch (const UsageError& e) {
        throw UsageError(fmt("point --bucket-mb %g --overlap %s: ", b, overlap.c_str()) + e.what());
      }
    }
  // A point's run file is named by its values as %g prints them (bucket1_overlap_on.h5): each must print apart.
  std::set<std::string> printed;
  for (double b : o.bucket_mb) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", b);
    require(printed.insert(text).second, "--bucket-mb lists " + std::string(text) +
                                             " twice (or two values that print alike): each point needs a run file "
                                             "of its own");
  }
  for (const std::string& v : o.overlap)
    require(std::count(o.overlap.begin(), o.overlap.end(), v) == 1, "--overlap lists " + v + " twice");
  require(o.repeats >= 1, "--repeats must be at least 1");
  require(!(o.predict && o.base.zero_stage == 1),
          "--predict needs --zero-stage 0 (the model predicts all-reduces, not the sharded update's collectives)");
}

void print_sweep_header(const SweepOptions& o, int size) {
  std::printf("ddplab sweep: %s x %s on %s, link %s%s, %s%s, in %s/\n",
              counted(static_cast<int>(o.bucket_mb.size()), "bucket size").c_str(),
              counted(static_cast<int>(o.overlap.size()), "overlap setting").c_str(), counted(size, "rank").c_str(),
              o.base.link.c_str(), o.base.zero_stage == 1 ? ", the update sharded (--zero-stage 1)" : "",
              steps_each(o.base).c_str(),
              o.repeats > 1 ? (", " + std::to_string(o.repeats) + " rounds (median)").c_str() : "", o.out_dir.c_str());
  print_few_steps_note(o.base);
  if (o.predict)
    std::printf("--predict: a first run at --bucket-mb %g --overlap %s predicts every point%s\n", o.base.bucket_mb,
                o.base.overlap ? "on" : "off", o.repeats > 1 ? " of its round" : "");
  std::fflush(stdout);
}

// The points in table order (overlap, then cap).
std::vector<SweepPoint> grid_points(const SweepOptions& o) {
  std::vector<SweepPoint> points;
  for (const std::string& overlap : o.overlap)
    for (double bucket_mb : o.bucket_mb) {
      SweepPoint point;
      point.bucket_mb = bucket_mb;
      point.overlap = overlap;
      points.push_back(std::move(point));
    }
  return points;
}

// The points' indices in the order a round measures them: a cap's overlap settings back to back (the machine's
// drift over the minutes of a sweep, seen up to 7% in forward, which no setting touches, stays out of the on/off
// comparison). Every other round runs it in reverse (each point's rounds spread evenly over the sweep).
std::vector<size_t> measuring_order(const SweepOptions& o) {
  std::vector<size_t> order;
  for (size_t cap = 0; cap < o.bucket_mb.size(); ++cap)
    for (size_t v = 0; v < o.overlap.size(); ++v) order.push_back(v * o.bucket_mb.size() + cap);
  return order;
}

// --predict: every point of a round predicted by the round's model, before any of them is measured.
void predict_points(const StepModel& model, std::vector<SweepPoint>& points) {
  for (SweepPoint& point : points) {
    PredictSetting setting = model.measured;
    setting.bucket_mb = point.bucket_mb;
    setting.overlap = point.overlap == "on";
    point.repeat_predicted.push_back(predict(model, setting));
  }
}

// One repeat of one point.
struct Measured {
  RunSummary summary;
  std::string path;
};

// Runs `point` once in round `round`: its step time and, in the first round, its buckets go to the point.
Measured measure_point(const SweepOptions& o, SweepPoint& point, int round, const std::string& command_line,
                       MPI_Comm world) {
  TrainConfig config = point_config(o, point.bucket_mb, point.overlap);
  const std::string name = point_run_name(o, point.bucket_mb, point.overlap, round);
  config.out = o.out_dir + "/" + name + ".h5";
  SummarizedRun r = run_training(config, world, RunOptions{"sweep", command_line, name});
  point.repeat_step_ms.push_back(r.summary.slowest_step_ms);
  if (round == 0)  // a cap cuts the same buckets every round
    for (const BucketRecord& b : r.record.buckets) point.buckets.emplace_back(b.first_piece, b.last_piece);
  return {std::move(r.summary), r.record.path};
}

// Each point's median repeat (for an even count the lower of the middle two) stands for it.
void keep_median_runs(std::vector<SweepPoint>& points, std::vector<std::vector<Measured>>& repeats) {
  for (size_t i = 0; i < points.size(); ++i) {
    std::vector<Measured>& runs = repeats[i];
    std::sort(runs.begin(), runs.end(), [](const Measured& a, const Measured& b) {
      return a.summary.slowest_step_ms < b.summary.slowest_step_ms;
    });
    Measured& median = runs[(runs.size() - 1) / 2];
    points[i].summary = std::move(median.summary);
    points[i].path = median.path;
  }
}

// Every round over the grid (with --predict each starts with its own run at the defaults); returns the rounds'
// prediction sources (empty without --predict).
std::vector<PredictSource> measure_grid(const SweepOptions& o, const std::optional<Calibration>& calibration,
                                        std::vector<SweepPoint>& points, const std::string& command_line,
                                        MPI_Comm world) {
  const std::vector<size_t> order = measuring_order(o);
  std::vector<std::vector<Measured>> repeats(points.size());
  std::vector<PredictSource> sources;
  const StopSignals signals;  // over every run: a signal between two of them stops the sweep before the next
  for (int round = 0; round < o.repeats; ++round) {
    if (o.predict) {
      stop_if_signalled("the run the predictions start from", o.base, world);
      sources.push_back(run_predict_source(o, calibration, round, command_line, world));
      if (const std::optional<StepModel>& model = sources.back().model) predict_points(*model, points);  // rank 0
    }
    for (size_t k = 0; k < order.size(); ++k) {
      const size_t i = order[round % 2 ? order.size() - 1 - k : k];
      stop_if_signalled(fmt("the point --bucket-mb %g --overlap %s", points[i].bucket_mb, points[i].overlap.c_str()),
                        o.base, world);
      repeats[i].push_back(measure_point(o, points[i], round, command_line, world));
    }
  }
  keep_median_runs(points, repeats);
  return sources;
}

// Points with the same buckets and overlap are one setting: their runs pooled into the setting's median and range.
void pool_same_settings(std::vector<SweepPoint>& points) {
  for (SweepPoint& p : points) {
    std::vector<double> pooled;
    for (const SweepPoint& q : points)
      if (q.overlap == p.overlap && q.buckets == p.buckets) {
        pooled.insert(pooled.end(), q.repeat_step_ms.begin(), q.repeat_step_ms.end());
        if (&q != &p) p.same_buckets_as.push_back(q.bucket_mb);
      }
    p.setting_step_ms = median(pooled);
    const auto [fastest, slowest] = std::minmax_element(pooled.begin(), pooled.end());
    p.setting_fastest_ms = *fastest, p.setting_slowest_ms = *slowest;
  }
}

void print_point_table(const SweepOptions& o, const std::vector<SweepPoint>& points) {
  std::printf("\n%9s %7s %7s %9s %10s %9s %8s %8s %8s %7s%s\n", "bucket_mb", "overlap", "buckets", "step_ms",
              "samples/s", "backward", "comm", "hidden", "exposed", "hidden%", o.predict ? " predicted   error" : "");
  for (const SweepPoint& p : points) {
    const RunSummary& s = p.summary;
    const StepRecord mean = mean_over_ranks(s);
    const int world = static_cast<int>(s.ranks.size());
    std::printf("%9g %7s %7zu %9.2f %10.0f %9.2f %8.2f %8.2f %8.2f %7s%s\n", p.bucket_mb, p.overlap.c_str(),
                p.buckets.size(), s.slowest_step_ms, s.samples_per_s, mean.backward_ms, mean.comm_ms,
                mean.hidden_comm_ms, mean.exposed_comm_ms,
                hidden_text(mean_hidden_fraction(s), mean.comm_ms, world).c_str(),
                p.predicted() ? predicted_text(p).c_str() : "");
  }
  std::printf(
      "step_ms: the slowest rank's mean; backward, comm, hidden, exposed: means over the ranks, ms per step; "
      "hidden%%: hidden over what backward could hide, the lesser of its time and comm's (-: no comm to hide)%s\n",
      o.predict ? "; predicted: the model's step_ms (*: extrapolated), error: (predicted - measured) / measured" : "");
}

std::string sweep_csv(const std::vector<SweepPoint>& points) {
  std::ostringstream csv;
  csv << "bucket_mb,overlap,slowest_step_ms,samples_per_s,backward_ms,comm_ms,hidden_comm_ms,exposed_comm_ms,"
         "hidden_fraction,run_file,predicted_step_ms,error_pct\n";
  for (const SweepPoint& p : points) {
    const RunSummary& s = p.summary;
    const StepRecord mean = mean_over_ranks(s);
    csv << p.bucket_mb << ',' << p.overlap << ',' << s.slowest_step_ms << ',' << s.samples_per_s << ','
        << mean.backward_ms << ',' << mean.comm_ms << ',' << mean.hidden_comm_ms << ',' << mean.exposed_comm_ms << ',';
    if (has_hidden_share(mean.comm_ms, static_cast<int>(s.ranks.size()))) csv << mean_hidden_fraction(s);
    csv << ',' << p.path << ',';
    if (p.predicted())
      csv << p.predicted()->step.step_ms << ',' << p.error_pct() << '\n';
    else
      csv << ",\n";
  }
  return csv.str();
}

nlohmann::json point_json(const SweepPoint& p) {
  nlohmann::json point = {
      {"bucket_mb", p.bucket_mb},
      {"overlap", p.overlap},
      {"step_ms", p.summary.slowest_step_ms},
      {"hidden_fraction", has_hidden_share(mean_over_ranks(p.summary).comm_ms, static_cast<int>(p.summary.ranks.size()))
                              ? nlohmann::json(mean_hidden_fraction(p.summary))
                              : nlohmann::json()},
      {"run_file", p.path},
      {"repeat_step_ms", p.repeat_step_ms},
      {"summary", to_json(p.summary)}};
  if (p.predicted()) {
    std::vector<double> repeat_predicted, repeat_error;
    for (size_t k = 0; k < p.repeat_predicted.size(); ++k) {
      repeat_predicted.push_back(p.repeat_predicted[k].step.step_ms);
      repeat_error.push_back(p.repeat_error_pct(k));
    }
    point["repeat_predicted_step_ms"] = repeat_predicted;
    point["repeat_error_pct"] = repeat_error;
    point["predicted_step_ms"] = p.predicted()->step.step_ms;
    point["error_pct"] = p.error_pct();
    point["extrapolated"] = p.predicted()->extrapolated;
  }
  if (!p.same_buckets_as.empty()) {
    point["same_buckets_as"] = p.same_buckets_as;
    point["setting_step_ms"] = p.setting_step_ms;
  }
  return point;
}

// Each setting measured under several caps, once, at its smallest cap.
void print_shared_settings(const std::vector<SweepPoint>& points) {
  for (const SweepPoint& p : points) {
    if (p.same_buckets_as.empty() ||
        *std::min_element(p.same_buckets_as.begin(), p.same_buckets_as.end()) < p.bucket_mb)
      continue;
    std::ostringstream caps;
    caps << p.bucket_mb;
    for (double cap : p.same_buckets_as) caps << ", " << cap;
    // Its runs' spread is the machine's noise: settings measured closer than that are not told apart by one run.
    std::printf(
        "%s MiB, overlap %s: the same %zu bucket(s), one setting: %.2f ms/step over its %zu runs (median; "
        "%.2f-%.2f, %.0f%% apart: the machine's noise)\n",
        caps.str().c_str(), p.overlap.c_str(), p.buckets.size(), p.setting_step_ms,
        p.repeat_step_ms.size() * (1 + p.same_buckets_as.size()), p.setting_fastest_ms, p.setting_slowest_ms,
        100 * (p.setting_slowest_ms / p.setting_fastest_ms - 1));
  }
}

// The fastest setting (the first of equals, in table order).
const SweepPoint& fastest_setting(const std::vector<SweepPoint>& points) {
  return *std::min_element(points.begin(), points.end(), [](const SweepPoint& a, const SweepPoint& b) {
    return a.setting_step_ms < b.setting_step_ms;
  });
}

// The machine's noise, where the sweep measured it (a setting run more than once: --repeats, or one setting under
// several caps): the widest spread of one setting's runs, as a fraction.
double measured_noise(const std::vector<SweepPoint>& points) {
  double noise = 0;
  for (const SweepPoint& p : points)
    if (p.setting_fastest_ms > 0) noise = std::max(noise, p.setting_slowest_ms / p.setting_fastest_ms - 1);
  return noise;
}

// Whether some setting ran more than once: otherwise the noise was not measured (null, not a noise of 0).
bool noise_measured(const std::vector<SweepPoint>& points) {
  return std::any_of(points.begin(), points.end(),
                     [](const SweepPoint& p) { return p.repeat_step_ms.size() * (1 + p.same_buckets_as.size()) > 1; });
}

// The other settings within the noise of the best: this sweep does not tell them apart from it. One point per
// setting (a setting measured under several caps, once).
std::vector<const SweepPoint*> not_told_apart(const std::vector<SweepPoint>& points, const SweepPoint& best,
                                              double noise) {
  std::vector<const SweepPoint*> tied;
  for (const SweepPoint& p : points) {
    const auto same_setting = [&p](const SweepPoint* q) { return q->overlap == p.overlap && q->buckets == p.buckets; };
    if (noise > 0 && !same_setting(&best) && std::none_of(tied.begin(), tied.end(), same_setting) &&
        p.setting_step_ms <= best.setting_step_ms * (1 + noise))
      tied.push_back(&p);
  }
  return tied;
}

void print_best(const SweepPoint& best, double noise, const std::vector<const SweepPoint*>& tied) {
  std::printf("\nbest: --bucket-mb %g --overlap %s (%.2f ms/step%s)\n", best.bucket_mb, best.overlap.c_str(),
              best.setting_step_ms, best.same_buckets_as.empty() ? "" : ", its setting's runs under every cap");
  if (tied.empty()) return;
  std::printf("not told apart from it by this sweep (within the %.0f%% that one setting's runs spread here):\n",
              100 * noise);
  for (const SweepPoint* p : tied)
    std::printf("  --bucket-mb %g --overlap %s (%.2f ms/step)\n", p->bucket_mb, p->overlap.c_str(), p->setting_step_ms);
}

nlohmann::json sweep_json(const SweepOptions& o, int size, const std::vector<SweepPoint>& points,
                          const SweepPoint& best, double noise, const std::vector<const SweepPoint*>& tied) {
  nlohmann::json json_points = nlohmann::json::array();
  for (const SweepPoint& p : points) json_points.push_back(point_json(p));
  nlohmann::json summary = {
      {"sweep", "bucket_mb x overlap"},
      {"model", to_string(o.base.model)},
      {"world_size", size},
      {"link", o.base.link},
      {"steps", o.base.steps},
      {"repeats", o.repeats},
      {"points", json_points},
      {"best", {{"bucket_mb", best.bucket_mb}, {"overlap", best.overlap}, {"step_ms", best.setting_step_ms}}}};
  summary["noise_pct"] = noise_measured(points) ? nlohmann::json(100 * noise) : nlohmann::json();
  summary["not_told_apart"] = nlohmann::json::array();
  for (const SweepPoint* p : tied)
    summary["not_told_apart"].push_back(
        {{"bucket_mb", p->bucket_mb}, {"overlap", p->overlap}, {"step_ms", p->setting_step_ms}});
  return summary;
}

}  // namespace

int run_sweep(SweepOptions o, const std::string& command_line) {
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  std::optional<Calibration> calibration;  // rank 0's, where the predictions are made
  {
    // Before the first point arms the watchdog with --timeout-s: a rank stopped in these checks ends the job too.
    const watchdog::StartupWait agreeing("the ranks' agreement on the sweep's points and its folder");
    std::vector<std::string> caps;
    for (double cap : o.bucket_mb) caps.push_back(fmt("%.17g", cap));
    require_same_options("sweep", {{"--bucket-mb", joined(caps)},
                                   {"--overlap", joined(o.overlap)},
                                   {"--predict", o.predict ? "on" : "off"},
                                   {"--calibration", o.calibration},
                                   {"--repeats", std::to_string(o.repeats)}});
    // The training flags agree first, so that the sweep's own checks decide alike on every rank.
    require_same_config(o.base, world);
    std::string refused;
    try {
      validate_sweep(o);
      // Read where the predictions are made, rank 0's, and now: a file it cannot use ends the sweep before any run.
      if (rank == 0 && !o.calibration.empty()) calibration = read_calibration(o.calibration);
    } catch (const UsageError& e) {
      refused = e.what();
    } catch (const std::runtime_error& e) {
      refused = std::string("--calibration: ") + e.what();
    }
    if (const std::string reason = first_failing_reason(refused, world); !reason.empty()) throw UsageError(reason);
    validate_launch(o.base, world);  // what every point's run would refuse, before the folder is made
    o.out_dir = prepare_out_dir(o.out_dir, "sweep", o.base.force, sweep_outputs(o), world);
  }
  if (rank == 0) print_sweep_header(o, size);
  std::vector<SweepPoint> points = grid_points(o);
  const std::vector<PredictSource> sources = measure_grid(o, calibration, points, command_line, world);
  if (rank != 0) return 0;
  pool_same_settings(points);
  print_point_table(o, points);
  print_shared_settings(points);
  const SweepPoint& best = fastest_setting(points);
  const double noise = measured_noise(points);
  const std::vector<const SweepPoint*> tied = not_told_apart(points, best, noise);
  print_best(best, noise, tied);
  // Told on the terminal as on the page: the best of single runs may be a step's luck.
  if (!noise_measured(points))
    std::printf(
        "one run per setting: the machine's noise is not measured, and near settings may be its luck "
        "(--repeats 3 measures it)\n");
  nlohmann::json summary = sweep_json(o, size, points, best, noise, tied);
  if (o.predict) summary.update(print_prediction_summary(sources, points, best));
  write_text_file(o.out_dir + "/summary.csv", sweep_csv(points), /*force=*/true);
  write_text_file(o.out_dir + "/summary.json", summary.dump(2) + "\n", /*force=*/true);
  std::vector<std::string> files;
  for (const SweepPoint& p : points) files.push_back(p.path);
  std::printf("summary: %s/summary.csv, %s/summary.json\n", o.out_dir.c_str(), o.out_dir.c_str());
  after_mpi([dir = o.out_dir, files] { draw_charts(dir, files, {"--sweep", dir + "/summary.json"}); });
  return 0;
}

}  // namespace ddplab
