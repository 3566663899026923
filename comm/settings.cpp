#include "comm/settings.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>

namespace ddplab::settings {
namespace {

// The environment's text for the knob, or "" when unset or empty.
std::string environment(const Knob& knob) {
  const char* v = std::getenv(knob.name);
  return v ? v : "";
}

// What the environment held for each knob read so far (checked), by name: read once, so that a value cannot
// change under a running job. An empty string: unset, the default applies.
std::mutex readings_mutex;
std::map<std::string, std::string> readings;

template <typename Check>
std::string read_once(const Knob& knob, const Check& check) {
  const std::lock_guard<std::mutex> lock(readings_mutex);
  auto it = readings.find(knob.name);
  if (it == readings.end()) {
    const std::string text = environment(knob);
    if (!text.empty()) check(text);  // throws before anything is cached
    it = readings.emplace(knob.name, text).first;
  }
  return it->second;
}

}  // namespace

bool is_set(const Knob& knob) { return !environment(knob).empty(); }

int64_t integer(const Knob& knob, int64_t fallback, int64_t min, int64_t max) {
  const auto parse = [&](const std::string& text) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(text.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || x < min || x > max)
      throw std::invalid_argument(std::string(knob.name) + " must be an integer in [" + std::to_string(min) + ", " +
                                  std::to_string(max) + "], got '" + text + "'");
    return static_cast<int64_t>(x);
  };
  const std::string text = read_once(knob, parse);
  return text.empty() ? fallback : parse(text);
}

int64_t integer(const Knob& knob, int64_t min, int64_t max) {
  return integer(knob, std::stoll(knob.default_text), min, max);
}

std::string choice(const Knob& knob, const std::vector<std::string>& choices) {
  const std::string text = read_once(knob, [&](const std::string& value) {
    std::string listed;
    bool known = false;
    for (const std::string& c : choices) {
      known = known || c == value;
      listed += (listed.empty() ? "" : " or ") + c;
    }
    if (!known) throw std::invalid_argument(std::string(knob.name) + " must be " + listed + ", got '" + value + "'");
  });
  return text.empty() ? knob.default_text : text;
}

std::vector<std::string> describe() {
  std::vector<std::string> lines;
  for (const Knob* knob : kKnobs) {
    const std::string text = environment(*knob);
    const std::string value = text.empty() ? std::string(knob->default_text) + " (default)" : text + " (environment)";
    char line[512];
    std::snprintf(line, sizeof line, "%-30s %-42s %s", knob->name, value.c_str(), knob->meaning);
    lines.push_back(line);
  }
  return lines;
}

}  // namespace ddplab::settings
