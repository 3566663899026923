// The flags of `ddplab train` (shared by `ddplab suite`, whose cases start from them) and their validation.
#pragma once
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>

#include "config/train_config.h"

namespace ddplab {

// Which of the train flags a command offers. `suite` and `sweep` run many cases and name their files themselves, so
// they leave out the flags about one run's files and its injected fault (--out, --checkpoint, --checkpoint-every,
// --resume, --fault, --fault-rank, --fault-step); `sweep` also takes --bucket-mb and --overlap as lists of its own.
enum class FlagSet { kTrain, kSuite, kSweep };
void add_train_flags(CLI::App* app, TrainConfig& config, FlagSet flags = FlagSet::kTrain);
// Throws UsageError (runtime/errors.h) naming the first bad flag: each knob's own check (config/train_config.h), then
// the rules between knobs.
void validate(const TrainConfig& config);
// What a job of `ranks` ranks adds: the ranks a flag names exist, each rank gets a sequence, and --data's and
// --val-data's tokens fit the model, this rank reading share scan_part of scan_parts of the shards (the caller picks
// the shares and agrees the ranks' verdicts). Throws UsageError.
void validate_for_ranks(const TrainConfig& config, int ranks, int scan_part = 0, int scan_parts = 1);

// A number as a person types it, in decimal, for every numeric flag (the knobs', and the lists and counts of suite,
// sweep and predict). Returns why not, or "" (CLI11's validator convention); may rewrite text for the parser.
// Whole numbers: CLI11 reads a leading 0 as octal and 0x as hex (`--steps 010` ran 8 steps): leading zeros are
// dropped, other bases refused, and so is a value T cannot hold (--seed -1 or 2^64 was clamped to 2^64 - 1).
// Reals: the whole text one decimal number ("" ran as 0, 0x1p3 as 8); nan and inf pass here for the finite check.
template <typename T>
std::string as_decimal(std::string& text) {
  if constexpr (std::is_integral_v<T>) {
    const size_t digits = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
    if (digits == text.size() || text.find_first_not_of("0123456789", digits) != std::string::npos)
      return "must be a whole number in decimal (got '" + text + "')";
    const size_t first = text.find_first_not_of('0', digits);
    text = (text[0] == '-' ? "-" : "") + (first == std::string::npos ? "0" : text.substr(first));
    T parsed{};
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
    if (error != std::errc() || end != text.data() + text.size())
      return "must be a whole number from " + std::to_string(std::numeric_limits<T>::min()) + " to " +
             std::to_string(std::numeric_limits<T>::max()) + " (got '" + text + "')";
  } else {
    char* end = nullptr;
    std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || text.find_first_of("xX") != std::string::npos)
      return "must be a decimal number (got '" + text + "')";
  }
  return "";
}
// Throws UsageError where `ddplab train` would refuse value for flag, by its knob's own check (config/train_config.h):
// for the lists of sweep and predict, which must offer no setting train refuses.
void check_knob_value(const std::string& flag, double value);
// Every numeric knob of c in its flag's range (a stored config, which no flag's check has seen). Throws UsageError.
void check_knob_ranges(const TrainConfig& c);
// The validator train's flag of a number knob that takes "auto" parses with (auto as the knob's stand-in), for the
// lists of sweep and predict. logic_error where no such knob has that flag.
CLI::Validator auto_or_number_of(const std::string& flag);

template <typename T>
CLI::Validator decimal_validator() {
  return CLI::Validator(as_decimal<T>, "", std::is_integral_v<T> ? "DECIMAL" : "NUMBER");
}

}  // namespace ddplab
