#include "runtime/settings.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/agreement.h"

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

namespace {

// The checks: an integer in the knob's range, one of its choices, or any text.
int64_t parse_integer(const Knob& knob, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || x < knob.min || x > knob.max)
    throw BadSetting(std::string(knob.name) + " must be an integer in [" + std::to_string(knob.min) + ", " +
                     std::to_string(knob.max) + "], got '" + text + "'");
  if (x % knob.multiple_of != 0)  // 1 to 3 bytes a slice read as no slicing at all
    throw BadSetting(std::string(knob.name) + " must be a multiple of " + std::to_string(knob.multiple_of) + ", got '" +
                     text + "'");
  return static_cast<int64_t>(x);
}
void check_choice(const Knob& knob, const std::string& value) {
  const std::string choices = knob.choices;
  std::string listed;
  bool known = false;
  for (size_t start = 0; start <= choices.size();) {
    const size_t bar = std::min(choices.find('|', start), choices.size());
    const std::string option = choices.substr(start, bar - start);
    known = known || option == value;
    listed += (listed.empty() ? "" : " or ") + option;
    start = bar + 1;
  }
  if (!known) throw BadSetting(std::string(knob.name) + " must be " + listed + ", got '" + value + "'");
}
void check(const Knob& knob, const std::string& text) {
  if (knob.choices) return check_choice(knob, text);
  if (knob.max >= knob.min) parse_integer(knob, text);
}

}  // namespace

int64_t integer(const Knob& knob, int64_t fallback) {
  const std::string text = read_once(knob, [&](const std::string& t) { check(knob, t); });
  return text.empty() ? fallback : parse_integer(knob, text);
}

int64_t integer(const Knob& knob) { return integer(knob, std::stoll(knob.default_text)); }

std::string choice(const Knob& knob) {
  const std::string text = read_once(knob, [&](const std::string& t) { check(knob, t); });
  return text.empty() ? knob.default_text : text;
}

void check_all() {
  for (const Knob* knob : kKnobs) read_once(*knob, [&](const std::string& t) { check(*knob, t); });
}

void check_same_on_every_rank(MPI_Comm comm) {
  std::vector<std::pair<std::string, std::string>> fields;
  for (const Knob* knob : kKnobs) {
    if (knob == &kBlasAuto) continue;  // a process's own BLAS kernels; the collectives never see it
    const std::string text = read_once(*knob, [&](const std::string& t) { check(*knob, t); });
    fields.emplace_back(knob->name, text.empty() ? "unset" : text);
  }
  if (const std::string differing = disagreement(fields, comm); !differing.empty())
    throw BadSetting("ranks were started with different settings: " + differing + "; every rank needs the same");
}

std::vector<std::string> describe() {
  std::vector<std::string> lines;
  for (const Knob* knob : kKnobs) {
    const std::string text = environment(*knob);
    const std::string value = text.empty() ? std::string(knob->default_text) + " (default)" : text + " (environment)";
    std::string meaning = knob->meaning;
    try {  // a value every other command refuses is said to be one here, where the refusals send the user
      if (!text.empty()) check(*knob, text);
    } catch (const BadSetting& e) {
      meaning = std::string("REFUSED: ") + e.what();
    }
    char line[512];
    std::snprintf(line, sizeof line, "%-30s %-42s %s", knob->name, value.c_str(), meaning.c_str());
    lines.push_back(line);
  }
  return lines;
}

}  // namespace ddplab::settings
