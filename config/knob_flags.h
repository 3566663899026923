// The command-line flags of TrainConfig's knobs, from their one declaration (config/train_config.h: flag, help,
// default, range, "auto"): how `ddplab train`, suite, sweep and predict read them, and allreduce_perf the few of
// them it takes, so that every program says the same of the same knob.
#pragma once
#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "config/train_config.h"
#include "runtime/errors.h"

namespace ddplab {

// How the flags below are made; not for their callers.
namespace knob_flags_detail {

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

}  // namespace knob_flags_detail

// The check of a number flag's text: decimal, as a person types it (knob_flags_detail::as_decimal).
template <typename T>
CLI::Validator decimal_validator() {
  return CLI::Validator(knob_flags_detail::as_decimal<T>, "", std::is_integral_v<T> ? "DECIMAL" : "NUMBER");
}

// A path flag given an empty value: a variable left unset in a script, not a request for none or for the default.
inline CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& text) { return text.empty() ? std::string("needs a path (got an empty one)") : ""; }, "", "PATH");
}

// The flag's value as the error names it: "0", "-1", "0.5".
template <typename T>
std::string value_text(T value) {
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(value);
  } else {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(value));
    return text;
  }
}

namespace knob_flags_detail {

// A number's check, as its knob declares it (an "auto" still unresolved passes).
template <typename T>
void check_range(const Knob& knob, T value) {
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    const double v = static_cast<double>(value);
    if (!knob.flag || (knob.auto_text && v == knob.auto_value)) return;
    const std::string flag = knob.flag, got = " (got " + value_text(value) + ")";
    require(std::isfinite(v), flag + " must be a finite number" + got);
    if (knob.traits & kPositive) require(v > knob.min, flag + " must be positive" + got);
    require(v >= knob.min, std::is_integral_v<T> || knob.min != 0
                               ? flag + " must be at least " + value_text(static_cast<T>(knob.min)) + got
                               : flag + " must not be negative" + got);
    if (knob.traits & kBelowMax)
      require(v < knob.max, flag + " must be below " + value_text(knob.max) + got);
    else
      require(v <= knob.max, flag + " must be at most " + value_text(knob.max) + got);
  }
}

template <typename T>
struct IsAutoChoice : std::false_type {};
template <typename E>
struct IsAutoChoice<AutoChoice<E>> : std::true_type {};

// A choice's flag: its names (and "auto" where it takes it), refused otherwise with the list.
template <typename E>
E choice_flag_value(const std::string& text, const char* flag) {
  try {
    return parse_choice<E>(text, flag);
  } catch (const std::invalid_argument& e) {
    throw CLI::ValidationError(e.what());
  }
}

template <typename E>
AutoChoice<E> auto_choice_flag_value(const std::string& text, const char* flag) {
  if (text == "auto") return {};
  if (const std::optional<E> value = find_choice<E>(text)) return *value;
  throw CLI::ValidationError(std::string(flag) + " must be auto, " + choice_list<E>() + " (got '" + text + "')");
}

// A number knob's text that takes "auto": auto becomes the knob's stand-in value, else a finite decimal not below the
// knob's minimum, checked here (the stand-in itself is out of range, and typed as a number it would pass for auto).
// No description: the help would show the stand-in ("{auto->-1}").
template <typename T>
CLI::Validator auto_or_number(const Knob& knob) {
  const double min = knob.min;
  const std::string stand_in = value_text(static_cast<T>(knob.auto_value));
  const std::string below = min == 0 ? "must not be negative" : "must be at least " + value_text(static_cast<T>(min));
  return CLI::Validator(
      [min, stand_in, below](std::string& text) {
        if (text == "auto") {
          text = stand_in;
          return std::string();
        }
        if (std::string not_decimal = as_decimal<T>(text); !not_decimal.empty())
          return not_decimal.replace(not_decimal.find(" (got"), 0, " or auto");
        const double v = std::strtod(text.c_str(), nullptr);
        if (std::isnan(v) || std::isinf(v)) return std::string("must be a finite number or auto");
        return v >= min ? std::string() : below + " (got " + text + ")";
      },
      "", "AUTO_OR_AT_LEAST_MIN");
}

}  // namespace knob_flags_detail

// The flag of one knob, by the type of its value.
template <typename T>
CLI::Option* add_knob_flag(CLI::App* app, const Knob& knob, T& value) {
  using namespace knob_flags_detail;
  const char* flag = knob.flag;
  const std::string help = knob.help ? knob.help : "";
  if constexpr (std::is_same_v<T, bool>) {
    if (!(knob.traits & kOnOff)) return app->add_flag(flag, value, help);
    return app
        ->add_option_function<std::string>(
            flag, [&value, flag](const std::string& v) { value = choice_flag_value<OnOff>(v, flag) == OnOff::kOn; },
            help)
        ->default_str(value ? "on" : "off");
  } else if constexpr (kIsChoice<T>) {
    return app
        ->add_option_function<std::string>(
            flag, [&value, flag](const std::string& v) { value = choice_flag_value<T>(v, flag); }, help)
        ->default_str(to_string(value));
  } else if constexpr (IsAutoChoice<T>::value) {
    using E = typename T::value_type;
    return app
        ->add_option_function<std::string>(
            flag, [&value, flag](const std::string& v) { value = auto_choice_flag_value<E>(v, flag); }, help)
        ->default_str(value ? to_string(*value) : "auto");
  } else if constexpr (std::is_arithmetic_v<T>) {
    CLI::Option* option = app->add_option(flag, value, help);
    if (!knob.auto_text) return option->transform(decimal_validator<T>())->capture_default_str();
    return option->transform(auto_or_number<T>(knob))
        ->default_str(static_cast<double>(value) == knob.auto_value ? "auto" : value_text(value))
        ->type_name(knob.auto_text);
  } else {
    return app->add_option(flag, value, help)->capture_default_str();
  }
}

// Throws UsageError where `ddplab train` would refuse value for flag, by its knob's own check (config/train_config.h):
// for the lists of sweep and predict, which must offer no setting train refuses.
void check_knob_value(const std::string& flag, double value);
// Every numeric knob of c in its flag's range (a stored config, which no flag's check has seen). Throws UsageError.
void check_knob_ranges(const TrainConfig& c);
// The validator train's flag of a number knob that takes "auto" parses with (auto as the knob's stand-in), for the
// lists of sweep and predict. logic_error where no such knob has that flag.
CLI::Validator auto_or_number_of(const std::string& flag);

// The flags of the knobs named, as `ddplab train` declares them, for a program that takes a few of train's knobs
// (allreduce_perf's link); their ranges are checked by check_knob_ranges after the parse. logic_error for a name that
// no knob has.
void add_knob_flags(CLI::App* app, TrainConfig& c, std::initializer_list<std::string_view> flags);

}  // namespace ddplab
