#include "launcher/predict_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis/blame.h"
#include "analysis/format.h"
#include "analysis/predict.h"
#include "analysis/report.h"
#include "config/knob_flags.h"
#include "launcher/cli.h"
#include "launcher/report_commands.h"
#include "record/files.h"
#include "runtime/errors.h"

namespace ddplab {
namespace {

// The largest world predicted: a million ranks, past any machine's, and well inside the model's int counts.
constexpr int kMaxPredictedRanks = 1 << 20;

struct PredictArgs {
  std::string file, calibration, json;
  bool force = false;
  std::vector<double> bucket_mb, first_bucket_mb, last_bucket_mb;
  std::vector<std::string> overlap, link, comm, comm_dtype, update, bucket_rule;
  std::vector<int> ranks, ranks_per_node, ranks_per_gpu;
};

std::string on_off(bool on) { return on ? "on" : "off"; }
// An end bucket's cap as its flag takes it: MiB, or auto (cut as the others).
std::string end_cap(double mb) { return mb == kAutoEndBucketMb ? "auto" : fmt("%g", mb); }
nlohmann::json end_cap_json(double mb) { return mb == kAutoEndBucketMb ? nlohmann::json("auto") : nlohmann::json(mb); }
const char* update_name(const PredictSetting& s) { return s.bucketed_update ? "bucket" : "whole"; }
// The table's column: "1", "2x2".
std::string nodes_column(const PredictSetting& s) {
  return s.nodes() == 1 ? "1" : std::to_string(s.nodes()) + "x" + std::to_string(s.ranks_on_a_node());
}

// A list names each value once, as sweep's do: a repeat would print the same row twice and count it as another
// setting predicted. Throws UsageError naming the first repeat.
void require_no_repeats(const std::vector<std::string>& list, const std::string& flag) {
  for (size_t i = 0; i < list.size(); ++i)
    if (std::find(list.begin(), list.begin() + i, list[i]) != list.begin() + i)
      throw UsageError(flag + " lists " + list[i] + " twice");
}

// Every combination of the lists, each list defaulting to the run's own value; validated before any work. notes: what
// was left out, for the caller to print once every other check has passed (a refused command prints one line).
std::vector<PredictSetting> settings_to_predict(const PredictArgs& a, const PredictSetting& run,
                                                std::vector<std::string>& notes) {
  const auto or_run = [](const auto& list, const auto& own) {
    return list.empty() ? std::vector<std::decay_t<decltype(own)>>{own} : list;
  };
  // What train would refuse is no setting to recommend: its knobs' own checks.
  for (double mb : a.bucket_mb) check_knob_value("--bucket-mb", mb);
  for (double mb : a.first_bucket_mb) check_knob_value("--first-bucket-mb", mb);
  for (double mb : a.last_bucket_mb) check_knob_value("--last-bucket-mb", mb);
  for (int n : a.ranks)
    require(n >= 1 && n <= kMaxPredictedRanks,
            "--ranks " + std::to_string(n) + ": a world of 1 to " + std::to_string(kMaxPredictedRanks) + " ranks");
  std::vector<bool> overlaps;
  for (const std::string& o : a.overlap) {
    const std::optional<OnOff> on_off = find_choice<OnOff>(o);
    require(on_off.has_value(), "--overlap " + o + ": expected on or off");
    overlaps.push_back(on_off == OnOff::kOn);
  }
  std::vector<bool> bucketed;
  for (const std::string& u : a.update) {
    require(u == "whole" || u == "bucket", "--update " + u + ": expected whole or bucket");
    bucketed.push_back(u == "bucket");
  }
  for (int k : a.ranks_per_node)
    require(k >= 1, "--ranks-per-node " + std::to_string(k) + ": a node has at least one rank");
  std::vector<std::optional<int>> sharing;  // nullopt: the run's own
  for (int g : a.ranks_per_gpu) {
    require(g >= 1, "--ranks-per-gpu " + std::to_string(g) + ": a GPU has at least one rank");
    sharing.push_back(g);
  }
  std::vector<LinkClasses> links;
  std::vector<AllreduceImpl> impls;
  std::vector<WireDtype> wires;
  std::vector<BucketRule> rules;
  try {
    // Each --link is one link with classes ("intra=none,inter=25gbe"), or a list of presets for every hop
    // ("10gbe,25gbe"); either way parse_links reads each link, as train does.
    for (const std::string& l : a.link)
      if (l.find('=') != std::string::npos) {
        links.push_back(parse_links(l));
      } else {
        std::vector<std::string> presets;
        for (size_t pos = 0; pos <= l.size();) {
          const size_t comma = std::min(l.find(',', pos), l.size());
          presets.push_back(l.substr(pos, comma - pos));
          links.push_back(parse_links(presets.back()));
          pos = comma + 1;
        }
        require_no_repeats(presets, "--link");
      }
    for (const std::string& c : a.comm) impls.push_back(parse_choice<AllreduceImpl>(c, "--comm"));
    for (AllreduceImpl impl : impls)
      require(impl != AllreduceImpl::kNccl, "--comm nccl: predict models the CPU collectives (ring, mpi, hier)");
    for (const std::string& d : a.comm_dtype) wires.push_back(parse_choice<WireDtype>(d, "--comm-dtype"));
    for (const std::string& r : a.bucket_rule) rules.push_back(parse_choice<BucketRule>(r, "--bucket-rule"));
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  // World sizes and nodes of K ranks: the run's K, or one node where the run had one (K 0).
  std::vector<std::pair<int, int>> shapes;  // ranks, ranks per node
  // A world no larger than a node is one node (--ranks 2,4,8,16 --ranks-per-node 8: one node up to 8).
  for (int n : or_run(a.ranks, run.ranks))
    for (int k : or_run(a.ranks_per_node, run.ranks_per_node)) {
      if (k >= n) k = 0;
      require(k == 0 || n % k == 0, "--ranks-per-node " + std::to_string(k) + " does not divide " + std::to_string(n) +
                                        " ranks" +
                                        (a.ranks_per_node.empty() ? " (the run's nodes; give --ranks-per-node)" : ""));
      if (std::find(shapes.begin(), shapes.end(), std::make_pair(n, k)) == shapes.end()) shapes.emplace_back(n, k);
    }
  // At most a node's ranks share a GPU: --ranks 1,2 --ranks-per-gpu 1,2 is one row at one rank.
  const auto sharing_at = [&](int n, int k) {
    std::vector<std::optional<int>> at;
    for (const std::optional<int>& g : or_run(sharing, run.ranks_per_gpu)) {
      PredictSetting shape;  // as predict() clamps it: at most a node's ranks share a GPU
      shape.ranks = n;
      shape.ranks_per_node = k;
      const std::optional<int> clamped = g ? std::optional<int>(std::min(*g, shape.ranks_on_a_node())) : g;
      if (std::find(at.begin(), at.end(), clamped) == at.end()) at.push_back(clamped);
    }
    return at;
  };
  std::vector<PredictSetting> out;
  bool no_wire = false, one_node = false;  // combinations left out
  for (const LinkClasses& link : or_run(links, run.link))
    for (const auto& [n, k] : shapes)
      for (AllreduceImpl impl : or_run(impls, run.impl))
        for (WireDtype wire : or_run(wires, run.wire))
          for (bool overlap : or_run(overlaps, run.overlap))
            for (BucketRule rule : or_run(rules, run.bucket_rule))
              for (double last : or_run(a.last_bucket_mb, run.last_bucket_mb))
                for (double first : or_run(a.first_bucket_mb, run.first_bucket_mb))
                  for (double cap : or_run(a.bucket_mb, run.bucket_mb))
                    for (bool per_bucket : or_run(bucketed, run.bucketed_update))
                      for (std::optional<int> per_gpu : sharing_at(n, k)) {
                        const bool wire_ok = impl != AllreduceImpl::kMpi || wire == WireDtype::kFp32;
                        const bool nodes_ok = impl != AllreduceImpl::kHier || k > 0;
                        if (wire_ok && nodes_ok)
                          out.push_back({cap, first, last, rule, overlap, link, n, k, impl, wire, per_bucket, per_gpu});
                        no_wire = no_wire || !wire_ok;
                        one_node = one_node || !nodes_ok;
                      }
  require(!out.empty(), no_wire ? "--comm mpi has no 16-bit wire: no setting left to predict"
                                : "--comm hier needs more than one node (give --ranks-per-node below the ranks)");
  // A K that makes every world one node changes nothing: a mistake (the run's world taken for a larger one).
  const std::vector<int> worlds = or_run(a.ranks, run.ranks);
  const int largest = *std::max_element(worlds.begin(), worlds.end());
  for (int k : a.ranks_per_node)
    require(k < largest, "--ranks-per-node " + std::to_string(k) + " is at least every world size predicted (" +
                             counted(largest, "rank") + " at most): each would be one node; give --ranks larger " +
                             "than it, or leave it out");
  if (no_wire) notes.push_back("--comm mpi has no 16-bit wire; those combinations are left out");
  if (one_node) notes.push_back("--comm hier needs more than one node; its one-node combinations are left out");
  return out;
}

std::string setting_flags(const PredictSetting& s) {
  char text[256];
  std::snprintf(text, sizeof text,
                "--bucket-mb %g --first-bucket-mb %s --last-bucket-mb %s --bucket-rule %s --overlap %s --comm %s "
                "--comm-dtype %s",
                s.bucket_mb, end_cap(s.first_bucket_mb).c_str(), end_cap(s.last_bucket_mb).c_str(),
                to_string(s.bucket_rule), on_off(s.overlap).c_str(), to_string(s.impl), to_string(s.wire));
  return std::string(text) + (s.bucketed_update ? " --optimizer-in-backward on" : "");
}

// hidden% as `ddplab report` computes it for a run (hidden_fraction, analysis/summary.h), so that the two read
// alike: hidden / min(the backward beside the buckets, their comm). 100 where there is no comm to hide.
double hidden_pct(const SimulatedStep& s) { return 100 * hidden_fraction(s.hidden_ms, s.backward_ms, s.comm_ms); }

// Why this row is the one to take, in one sentence.
std::string reason(const Prediction& best, const Prediction& own) {
  const SimulatedStep& s = best.step;
  const char* hide = best.buckets == 1 ? "hides" : "hide";
  char text[512];
  // Named as `ddplab report`'s blame names a run (analysis/blame.h): comm-bound from a fifth of the step exposed.
  if (best.setting.ranks == 1)
    std::snprintf(text, sizeof text, "compute-bound: one rank, no all-reduce");
  else if (s.exposed_ms > 0.05 * s.step_ms)
    std::snprintf(text, sizeof text,
                  "%s: %s at --bucket-mb %g %s %.2f of %.2f ms of all-reduce (hidden%% %.0f%%), %.2f ms (%.0f%% "
                  "of the step) stays exposed",
                  s.exposed_ms >= kCommBoundShare * s.step_ms ? "comm-bound" : "balanced",
                  counted(best.buckets, "bucket").c_str(), best.setting.bucket_mb, hide, s.hidden_ms, s.comm_ms,
                  hidden_pct(s), s.exposed_ms, 100 * s.exposed_ms / s.step_ms);
  else
    std::snprintf(text, sizeof text,
                  "compute-bound: %s at --bucket-mb %g %s %.2f of %.2f ms of all-reduce (hidden%% %.0f%%) "
                  "behind %.2f ms of backward",
                  counted(best.buckets, "bucket").c_str(), best.setting.bucket_mb, hide, s.hidden_ms, s.comm_ms,
                  hidden_pct(s), s.backward_ms);
  std::string sentence = text;
  // Exposed is the wait after this rank's backward for the last all-reduce to end: past the all-reduce's unhidden
  // part, the rest is the other ranks' lateness (their backward, which their buckets wait for).
  const double waiting_for_others = s.exposed_ms - (s.comm_ms - s.hidden_ms);
  if (best.setting.ranks > 1 && s.exposed_ms > 0.05 * s.step_ms && waiting_for_others > 0.05)
    sentence += fmt(", %.2f ms of it waiting for the other ranks' backward", waiting_for_others);
  if (setting_flags(best.setting) == setting_flags(own.setting)) return sentence + "; it is the run's own setting";
  // Slower where the settings asked for leave the run's own out (--overlap off alone, say), or where fewer buckets
  // were preferred within the run's noise.
  const double gain = 100 * (own.step.step_ms - s.step_ms) / own.step.step_ms;
  if (std::fabs(gain) < 0.05) return sentence + "; the run's own setting is as fast";
  std::snprintf(text, sizeof text, "; %.1f%% %s than the run's own setting (%.2f ms)", std::fabs(gain),
                gain > 0 ? "faster" : "slower", own.step.step_ms);
  return sentence + text;
}

nlohmann::json row_json(const StepModel& m, const Prediction& p) {
  const SimulatedStep& s = p.step;
  return {{"link", link_spec(p.setting.link)},
          {"ranks", p.setting.ranks},
          {"ranks_per_node", p.setting.ranks_on_a_node()},
          {"nodes", p.setting.nodes()},
          {"ranks_per_gpu", p.setting.ranks_per_gpu.value_or(1)},
          {"comm", to_string(p.setting.impl)},
          {"comm_dtype", to_string(p.setting.wire)},
          {"overlap", p.setting.overlap},
          {"update", update_name(p.setting)},
          {"bucket_mb", p.setting.bucket_mb},
          {"first_bucket_mb", end_cap_json(p.setting.first_bucket_mb)},
          {"last_bucket_mb", end_cap_json(p.setting.last_bucket_mb)},
          {"bucket_rule", to_string(p.setting.bucket_rule)},
          {"buckets", p.buckets},
          {"step_ms", s.step_ms},
          {"samples_per_s", p.samples_per_s},
          {"tokens_per_s", p.tokens_per_s},
          {"backward_ms", s.backward_ms},
          {"comm_ms", s.comm_ms},
          {"exposed_comm_ms", s.exposed_ms},
          {"hidden_comm_ms", s.hidden_ms},
          {"hidden_pct", s.comm_ms > 0 ? nlohmann::json(hidden_pct(s)) : nlohmann::json()},
          {"weak_scaling_pct", 100 * weak_scaling_efficiency(m, p)},
          {"comm_source", p.comm_source},
          {"extrapolated", p.extrapolated}};
}

nlohmann::json comm_fit_json(const std::optional<CommFit>& fit) {
  if (!fit) return nullptr;
  return {{"alone", {{"alpha_us", fit->alone.alpha_ms * 1000}, {"ms_per_mib", fit->alone.beta_ms_per_byte * kMiB}}},
          {"latency_from_link", fit->latency_from_link}};
}

// The model of the run in the file, with the calibration file's all-reduce times when one is given.
StepModel load_model(const PredictArgs& a) {
  const RunRecord run = read_input(a.file);
  try {  // the model computes with the settings: each within what train takes (a file edited or damaged may not be)
    check_knob_ranges(config_from_json(run.config));
  } catch (const UsageError& e) {
    throw UsageError("cannot read run file " + a.file + ": config: " + e.what());
  }
  const float grad_clip = run.config.value("grad_clip", 0.0f);
  require(grad_clip <= 0 || std::find(a.update.begin(), a.update.end(), "bucket") == a.update.end(),
          "--update bucket: " + a.file + " clips its gradients (--grad-clip " + fmt("%g", grad_clip) +
              "), whose norm needs every bucket reduced before any update");
  std::optional<Calibration> calibration;
  try {
    if (!a.calibration.empty()) calibration = read_calibration(a.calibration);
    return build_model(run, calibration);
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
}

// The run's own setting, what the model says of it, and what the model is built from.
void print_model_summary(const std::string& file, const StepModel& model, const Prediction& self, double self_error) {
  const PredictSetting& own = model.measured;
  std::printf("predict: %s: %s, %s, link %s, %s %s, buckets (%s), overlap %s: measured %.2f ms/step\n", file.c_str(),
              counted(own.ranks, "rank").c_str(), shape_text(own).c_str(), link_spec(own.link).c_str(),
              to_string(own.impl), to_string(own.wire),
              bucket_layout_text(own.bucket_mb, own.first_bucket_mb, own.last_bucket_mb, own.bucket_rule).c_str(),
              on_off(own.overlap).c_str(), model.measured_step_ms);
  std::printf("  the model at the run's own setting: %.2f ms/step (%+.1f%%)\n", self.step.step_ms, self_error);
  std::printf("  backward beside an all-reduce: %.2fx as long, %s\n", 1 + model.backward_slowdown,
              model.slowdown_source.c_str());
  if (model.comm_fit) {
    const AlphaBeta& alone = model.comm_fit->alone;
    std::printf(
        "  all-reduce, fitted on the run's buckets: %.1f us per message step + %.3f ms per MiB alone (%s, link "
        "%s)\n",
        alone.alpha_ms * 1000, alone.beta_ms_per_byte * kMiB, model.fitted_hops.c_str(),
        model.fitted_link.name.c_str());
  }
  if (model.host.ranks_per_gpu > 1)
    std::printf(
        "  beside backward: %d ranks take turns on one GPU, and an all-reduce between them waits for backward's end "
        "(as measured on an H200)\n",
        model.host.ranks_per_gpu);
  else if (model.host.lost_yield_ms)
    std::printf(
        "  beside backward: an all-reduce stalls %.2f ms per message step (its comm thread's yield lost to a compute "
        "thread, measured at the run's start)\n",
        *model.host.lost_yield_ms);
  else if (model.host.full())
    std::printf(
        "  beside backward: %s x %s fill the host's %s; the file does not say what a yield lost to compute costs "
        "(an older file), so an all-reduce beside backward stalls until backward ends\n",
        counted(model.host.ranks, "rank").c_str(), counted(model.host.threads, "thread").c_str(),
        counted(model.host.cores, "core").c_str());
  for (const std::string& note : model.notes) std::printf("  note: %s\n", note.c_str());
}

// Predicts every setting, printing the table row by row.
void print_prediction_table(const StepModel& model, const std::vector<Prediction>& rows) {
  const bool tokens = model.tokens_per_rank > 0;
  int link_width = 10;
  for (const Prediction& p : rows)
    link_width = std::max(link_width, static_cast<int>(link_spec(p.setting.link).size()));
  // A GPU run's rows say how many ranks take turns on each GPU.
  const auto per_gpu = [&](const char* text) { return model.on_gpu ? fmt(" %7s", text) : std::string(); };
  std::printf("\n%-*s %5s %5s%s %-4s %-4s %-7s %-6s %9s %8s %8s %-6s %7s %9s %11s %8s %8s %8s %7s %5s\n", link_width,
              "link", "ranks", "nodes", per_gpu("per_gpu").c_str(), "comm", "wire", "overlap", "update", "bucket_MiB",
              "first_MiB", "last_MiB", "rule", "buckets", "step_ms", tokens ? "tokens/s" : "samples/s", "comm_ms",
              "exposed", "hidden", "hidden%", "weak%");
  for (const Prediction& p : rows) {
    const PredictSetting& s = p.setting;
    const SimulatedStep& x = p.step;
    std::printf(
        "%-*s %5d %5s%s %-4s %-4s %-7s %-6s %9g %8s %8s %-6s %7d %9.2f %11.0f %8.2f %8.2f %8.2f %7s %4.0f%%%s\n",
        link_width, link_spec(s.link).c_str(), s.ranks, nodes_column(s).c_str(),
        per_gpu(std::to_string(p.setting.ranks_per_gpu.value_or(1)).c_str()).c_str(), to_string(s.impl),
        to_string(s.wire), on_off(s.overlap).c_str(), update_name(s), s.bucket_mb, end_cap(s.first_bucket_mb).c_str(),
        end_cap(s.last_bucket_mb).c_str(), to_string(s.bucket_rule), p.buckets, x.step_ms,
        tokens ? p.tokens_per_s : p.samples_per_s, x.comm_ms, x.exposed_ms, x.hidden_ms,
        hidden_text(hidden_pct(x) / 100, x.comm_ms, s.ranks).c_str(), 100 * weak_scaling_efficiency(model, p),
        p.extrapolated.empty() ? "" : " *");
  }
  std::printf(
      "ms per step; hidden%%: hidden over what backward could hide, the lesser of its time and comm's; weak%%: "
      "the step at one rank over the step at this many, each rank keeping its batch\n");
}

// Where each implementation's all-reduce came from (Prediction::comm_source): the file stands in for the run's
// fit only for what it measured at sizes that fit; the rest kept the run's fit, or the link model alone.
void print_calibration_sources(const Calibration& calibration, const std::vector<Prediction>& rows) {
  std::vector<std::string> sources;
  for (const Prediction& p : rows) {
    const std::string item = std::string(to_string(p.setting.impl)) + " " + to_string(p.setting.wire) + " from " +
                             (p.comm_source == "calibration" ? "it" : "the " + p.comm_source);
    if (std::find(sources.begin(), sources.end(), item) == sources.end()) sources.push_back(item);
  }
  std::string text;
  for (const std::string& item : sources) text += (text.empty() ? "" : ", ") + item;
  std::printf("calibration: %s (%s, link %s): %s\n", calibration.path.c_str(),
              counted(calibration.ranks, "rank").c_str(), calibration.link.c_str(), text.c_str());
}

void print_extrapolation_footnotes(const std::vector<Prediction>& rows) {
  const std::vector<std::string> footnotes = extrapolation_footnotes(rows);
  if (footnotes.empty()) return;
  std::printf("* extrapolated beyond what was measured:\n");
  for (const std::string& line : footnotes) std::printf("    %s\n", line.c_str());
}

// The tunables are buckets, overlap, implementation and wire; the link and the world size are given. The rows'
// indices per link and world size, groups in the order they first appear.
std::vector<std::vector<size_t>> group_by_link_and_world(const std::vector<Prediction>& rows) {
  std::vector<std::string> group_names;
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < rows.size(); ++i) {
    const PredictSetting& s = rows[i].setting;
    const std::string group = link_spec(s.link) + "|" + std::to_string(s.ranks) + "|" +
                              std::to_string(s.ranks_on_a_node()) + "|" + std::to_string(s.ranks_per_gpu.value_or(1));
    const auto it = std::find(group_names.begin(), group_names.end(), group);
    if (it == group_names.end()) {
      group_names.push_back(group);
      groups.push_back({i});
    } else {
      groups[it - group_names.begin()].push_back(i);
    }
  }
  return groups;
}

// Why row p is recommended over the run's own setting on p's link and world size, and how it was chosen.
std::string recommendation_reason(const StepModel& model, const Prediction& p, const Recommendation& chosen,
                                  double tolerance) {
  PredictSetting baseline = model.measured;
  baseline.link = p.setting.link;
  baseline.ranks = p.setting.ranks;
  baseline.ranks_per_node = p.setting.ranks_per_node;
  baseline.ranks_per_gpu = p.setting.ranks_per_gpu;
  std::string why = reason(p, predict(model, baseline));
  // The own knobs win a tie before fewer buckets where no all-reduce runs (one rank), and the own setting always.
  const char* so = chosen.own || setting_flags(p.setting) == setting_flags(baseline) ? "the run's own setting"
                                                                                     : "the fewest buckets among them";
  if (chosen.within_noise > 0 && model.steps.size() < 2) {  // one steady step: no spread to measure the noise by
    why += "; " + counted(chosen.within_noise, "other setting") + " predicted the same step exactly (the run's noise " +
           "is unknown: one steady step), so " + so;
  } else if (chosen.within_noise > 0) {
    char text[200];
    std::snprintf(text, sizeof text,
                  "; %s predicted within %.1f%% of the fastest (two standard errors of the run's step): too close to "
                  "rank, so %s",
                  counted(chosen.within_noise, "other setting").c_str(), 100 * tolerance, so);
    why += text;
  }
  return why;
}

// One recommendation for each link and world size among the candidates, printed; returned for the JSON file. The
// table's rows are the first `shown` candidates; the others are the searched bucket caps (kBucketCapsToTry).
nlohmann::json print_recommendations(const StepModel& model, const std::vector<Prediction>& candidates, size_t shown) {
  // Per group, rows closer than the run's own noise are not ranked by the model (recommend, analysis/predict.h).
  const double tolerance = ranking_tolerance(model);
  std::vector<std::pair<size_t, Recommendation>> best;  // index in `candidates`, and how it was chosen
  for (const std::vector<size_t>& group : group_by_link_and_world(candidates)) {
    std::vector<Prediction> members;
    for (size_t i : group) members.push_back(candidates[i]);
    const Recommendation r = recommend(members, model.measured, tolerance);
    best.emplace_back(group[r.row], r);
  }
  std::printf("\n");
  if (candidates.size() > shown) {
    std::string caps;
    for (double mb : kBucketCapsToTry) caps += (caps.empty() ? "" : ",") + fmt("%g", mb);
    std::printf("(the recommendations weigh the bucket caps %s MiB beside the run's: --bucket-mb %s shows them)\n",
                caps.c_str(), caps.c_str());
  }
  nlohmann::json recommended = nlohmann::json::array();
  for (const auto& [i, chosen] : best) {
    const Prediction& p = candidates[i];
    const std::string why = recommendation_reason(model, p, chosen, tolerance);
    const int per_gpu = p.setting.ranks_per_gpu.value_or(1);  // resolved by predict()
    const std::string shape = shape_text(p.setting) + (per_gpu > 1 ? fmt(", %d a GPU", per_gpu) : "");
    std::printf("recommended (link %s, %d rank%s, %s): %s: %.2f ms/step%s\n  %s\n", link_spec(p.setting.link).c_str(),
                p.setting.ranks, p.setting.ranks == 1 ? "" : "s", shape.c_str(), setting_flags(p.setting).c_str(),
                p.step.step_ms, p.extrapolated.empty() ? "" : " *", why.c_str());
    recommended.push_back({{"link", link_spec(p.setting.link)},
                           {"ranks", p.setting.ranks},
                           {"ranks_per_gpu", per_gpu},
                           {"ranks_per_node", p.setting.ranks_on_a_node()},
                           {"row", i < shown ? nlohmann::json(i) : nlohmann::json(nullptr)},  // null: searched
                           {"setting", row_json(model, p)},
                           {"within_noise", chosen.within_noise},
                           {"tolerance_pct", 100 * tolerance},
                           {"reason", why}});
  }
  return recommended;
}

void write_predictions_json(const PredictArgs& a, const StepModel& model, const Prediction& self, double self_error,
                            const std::vector<Prediction>& rows, const nlohmann::json& recommended) {
  nlohmann::json rows_json = nlohmann::json::array();
  for (const Prediction& p : rows) rows_json.push_back(row_json(model, p));
  const std::optional<Calibration>& calibration = model.calibration;
  nlohmann::json j = {
      {"run", a.file},
      {"measured",
       {{"step_ms", model.measured_step_ms}, {"error_pct", self_error}, {"predicted", row_json(model, self)}}},
      {"model",
       {{"backward_slowdown", model.backward_slowdown},
        {"slowdown_source", model.slowdown_source},
        {"comm_fit", comm_fit_json(model.comm_fit)},
        {"calibration", calibration ? nlohmann::json(calibration->path) : nlohmann::json(nullptr)},
        {"notes", model.notes}}},
      {"rows", rows_json},
      {"recommended", recommended}};
  write_text_file(a.json, j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", a.force);
  std::printf("predictions: %s\n", a.json.c_str());
}

void run_predict(const PredictArgs& a) {
  // Everything is checked before anything is computed or written.
  if (!a.json.empty()) {
    const std::string problem = check_output_path(a.json, a.force, {a.file, a.calibration});
    if (!problem.empty()) throw UsageError(problem);
  }
  const StepModel model = load_model(a);
  std::vector<std::string> notes;
  const std::vector<PredictSetting> settings = settings_to_predict(a, model.measured, notes);
  // MPI_Allreduce over a GPU run's buckets is no setting to recommend: the model's MPI is the host's, and train
  // refuses it on the GPU. (hier stays: the flat ring against a two-level one across nodes is what a GPU cluster's
  // prediction compares.)
  require(model.on_gpu || a.ranks_per_gpu.empty(),
          "--ranks-per-gpu: " + a.file + " trained on the CPU, where ranks share no GPU");
  // The CPU's update in backward runs on threads of its own beside backward, which the model does not time (PREDICT.md,
  // "What it leaves out"): the update bucket by bucket after backward is the GPU's.
  require(
      model.on_gpu || std::find(a.update.begin(), a.update.end(), "bucket") == a.update.end(),
      "--update bucket: " + a.file + " trained on the CPU; the update bucket by bucket is the GPU's (--device cuda)");
  if (model.on_gpu)
    for (const PredictSetting& s : settings)
      require(s.impl != AllreduceImpl::kMpi, "--comm mpi: " + a.file +
                                                 " trained on the GPU (--device cuda), where train takes --comm nccl "
                                                 "or ring (predict models them as the ring; hier across nodes)");
  std::vector<Prediction> rows;
  for (const PredictSetting& s : settings) rows.push_back(predict(model, s));
  // Where neither the run nor the calibration measured the setting's all-reduce, the link model alone times it, and
  // an unemulated link has none: such a row would read as free communication.
  for (const Prediction& p : rows)
    if (p.setting.ranks > 1 && p.comm_source == "link model" && !p.setting.link.emulated())
      throw UsageError(
          "--ranks " + std::to_string(p.setting.ranks) + " --comm " + to_string(p.setting.impl) + " over link " +
          link_spec(p.setting.link) + ": " +
          (model.calibration ? model.calibration->path + " times no " + to_string(p.setting.impl) + " all-reduce and " +
                                   a.file + " measured none of its own"
                             : a.file + " measured no all-reduce (one rank)") +
          ", so nothing times the communication; give --link (e.g. 10gbe) or --calibration FILE (allreduce_perf "
          "--hot-cache -J FILE on this host; for a GPU run, of the GPU's all-reduce: --impls gpu-ring-ipc -J FILE, "
          "say)");
  for (const std::string& note : notes) std::printf("note: %s\n", note.c_str());

  const Prediction self = predict(model, model.measured);
  const double self_error = 100 * (self.step.step_ms - model.measured_step_ms) / model.measured_step_ms;
  print_model_summary(a.file, model, self, self_error);
  print_prediction_table(model, rows);
  if (model.calibration) print_calibration_sources(*model.calibration, rows);
  print_extrapolation_footnotes(rows);
  // Where no bucket caps are named, the recommendation weighs kBucketCapsToTry beside each row's own, as a sweep
  // would try them: it should answer which cap, not only whether the run's own is best among the one it was given.
  // Not at one rank: nothing is all-reduced, and the cap changes nothing.
  std::vector<Prediction> candidates = rows;
  if (a.bucket_mb.empty())
    for (const PredictSetting& s : settings)
      for (double mb : kBucketCapsToTry)
        if (mb != s.bucket_mb && s.ranks > 1) {
          PredictSetting searched = s;
          searched.bucket_mb = mb;
          candidates.push_back(predict(model, searched));
        }
  const nlohmann::json recommended = print_recommendations(model, candidates, rows.size());
  std::fflush(stdout);

  if (a.json.empty()) return;
  write_predictions_json(a, model, self, self_error, rows, recommended);
}

}  // namespace

void add_predict_command(CLI::App& app, FileCommand& parsed) {
  auto args = std::make_shared<PredictArgs>();
  CLI::App* cmd = app.add_subcommand(
      "predict", "predicted step time for other bucket sizes, overlap, links and world sizes (docs/PREDICT.md)");
  cmd->add_option("file", args->file, "a run file (HDF5) to model from")->required()->type_name("RUN.h5");
  cmd->add_option("--bucket-mb", args->bucket_mb,
                  "bucket caps in MiB, >= 0 (0: a bucket per gradient piece; default: the run's)")
      ->transform(decimal_validator<double>())
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--first-bucket-mb", args->first_bucket_mb,
                  "caps of the first bucket to become ready, MiB >= 0 or auto (cut as the others; default: the "
                  "run's)")
      ->transform(auto_or_number_of("--first-bucket-mb"))
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--last-bucket-mb", args->last_bucket_mb,
                  "caps of the bucket that closes backward, MiB >= 0 or auto (cut as the others, as PyTorch does; "
                  "default: the run's)")
      ->transform(auto_or_number_of("--last-bucket-mb"))
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--overlap", args->overlap, "on, off or on,off (default: the run's)")
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option(
         "--link", args->link,
         "links for every hop: none, 1gbe, 10gbe, 25gbe, 100gbe-ib, pcie4, nvlink4, nvlink4-nccl, ndr400-x8, as a "
         "list; or one link per "
         "class of hop, intra=P,inter=P (repeat --link for several; default: the run's)")
      ->type_name("LIST");
  cmd->add_option("--ranks", args->ranks, "world sizes (default: the run's)")
      ->transform(decimal_validator<int>())
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--ranks-per-node", args->ranks_per_node,
                  "nodes of K consecutive ranks, each K dividing every world size larger than it (a smaller one "
                  "is one node; default: the run's nodes)")
      ->transform(decimal_validator<int>())
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--ranks-per-gpu", args->ranks_per_gpu,
                  "GPU runs: ranks taking turns on one GPU, at most the world (each one's compute that many times as "
                  "long, its all-reduces after backward); default: the run's on its own link, else 1")
      ->transform(decimal_validator<int>())
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--bucket-rule", args->bucket_rule, "within, reach (default: the run's)")
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--comm", args->comm, "ring, mpi, hier (default: the run's)")->delimiter(',')->type_name("LIST");
  cmd->add_option("--comm-dtype", args->comm_dtype, "fp32, bf16, fp16 (default: the run's)")
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option(
         "--update", args->update,
         "whole (after the last all-reduce), bucket (each bucket's as soon as it is reduced, beside the closing "
         "all-reduce: --device cuda --optimizer-in-backward on; GPU runs only), or whole,bucket for both (default: the "
         "run's)")
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--calibration", args->calibration, "allreduce_perf -J file: all-reduce times to use")
      ->check(non_empty_path())
      ->type_name("FILE");
  CLI::Option* json =
      cmd->add_option("--json", args->json, "also write the table and recommendations as JSON to the file OUT")
          ->check(non_empty_path())
          ->type_name("OUT");
  cmd->add_flag("--force", args->force, "overwrite an existing --json file")->needs(json);
  // Every list flag's values as given (a --link's presets are checked where its text is split).
  cmd->parse_complete_callback([cmd] {
    for (const CLI::Option* option : cmd->get_options()) require_no_repeats(option->results(), option->get_name());
  });
  cmd->callback([args, &parsed] { parsed = [args] { run_predict(*args); }; });
}

}  // namespace ddplab
