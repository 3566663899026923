#include "launcher/page.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <system_error>

#include "analysis/report.h"
#include "runtime/errors.h"

namespace ddplab {
namespace fs = std::filesystem;

std::string scripts_dir() {
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (error) return "";
  // Installed: <prefix>/<bindir>/ddplab finds <prefix>/<datadir>/ddplab/scripts, wherever the prefix was moved.
  const fs::path installed = (exe.parent_path() / DDPLAB_SCRIPTS_FROM_BIN).lexically_normal();
  if (fs::is_regular_file(installed / "charts.py", error)) return installed.string();
  // Run from its build tree: the scripts of the source it was built from (edits take effect without installing).
  const std::string build = fs::weakly_canonical(DDPLAB_BINARY_DIR, error).string() + "/";
  if (exe.string().rfind(build, 0) == 0) return std::string(DDPLAB_SOURCE_DIR) + "/scripts";
  return "";
}

// The last line the script wrote (its one-line error), for the caller's message.
std::string last_line(const std::string& log) {
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

namespace {

// A stop (Ctrl-C, SIGTERM, SIGHUP) while charts.py runs, where the command leaves those signals at their default
// (`report --html`; `train` has its StopSignals, and its page is finished): passed on to charts.py, which removes what
// it was writing, and raised again once it has ended and the command has removed its temporary folder. Ended at
// once, ddplab left charts.py writing the page seconds later, and the folder behind.
constexpr int kStops[] = {SIGINT, SIGTERM, SIGHUP};
volatile sig_atomic_t g_stop_received = 0;
volatile sig_atomic_t g_chart_pid = 0;

void pass_on_stop(int signal) {
  if (!g_stop_received) g_stop_received = signal;
  if (g_chart_pid > 0) kill(static_cast<pid_t>(g_chart_pid), signal);
}

class StopsPassedOn {
 public:
  StopsPassedOn() {
    g_stop_received = 0;
    struct sigaction action = {};
    action.sa_handler = pass_on_stop;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kStops); ++i) {
      sigaction(kStops[i], nullptr, &previous_[i]);
      installed_[i] = previous_[i].sa_handler == SIG_DFL && sigaction(kStops[i], &action, nullptr) == 0;
    }
  }
  ~StopsPassedOn() {
    g_chart_pid = 0;
    for (size_t i = 0; i < std::size(kStops); ++i)
      if (installed_[i]) sigaction(kStops[i], &previous_[i], nullptr);
  }
  StopsPassedOn(const StopsPassedOn&) = delete;
  StopsPassedOn& operator=(const StopsPassedOn&) = delete;
  void started(pid_t pid) {
    g_chart_pid = pid;
    if (g_stop_received) kill(pid, g_stop_received);  // the stop came while it was being started
  }
  void ended() { g_chart_pid = 0; }
  static int received() { return g_stop_received; }

 private:
  struct sigaction previous_[std::size(kStops)];
  bool installed_[std::size(kStops)] = {};
};

}  // namespace

void end_if_stopped(const ChartFailure& failure) {
  if (failure.stop_signal) raise(failure.stop_signal);  // its handler is the default again: the process ends by it
}

// Started from an argument list, not through a shell, so a path may hold any byte.
ChartFailure run_chart_script(const std::vector<std::string>& script_args, const std::string& log) {
  const std::string dir = scripts_dir();
  if (dir.empty()) return {"no scripts/charts.py beside this ddplab (install it with cmake --install)"};
  std::vector<std::string> args = {DDPLAB_PYTHON, dir + "/charts.py"};
  args.insert(args.end(), script_args.begin(), script_args.end());
  std::ofstream(log) << "# " << args[1] << "\n";  // which script drew them, for the reader and the install test
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t output;
  posix_spawn_file_actions_init(&output);
  posix_spawn_file_actions_addopen(&output, STDOUT_FILENO, log.c_str(), O_WRONLY | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&output, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0, waited = -1;
  int status = 0;
  bool started = false;
  {
    StopsPassedOn stops;
    started = posix_spawn(&pid, argv[0], &output, nullptr, argv.data(), environ) == 0;
    posix_spawn_file_actions_destroy(&output);
    if (started) {
      stops.started(pid);
      // Its end is waited for without reaping it: until stops.ended(), a stop is passed on to this pid, which the
      // system may give to another process once it is reaped.
      siginfo_t info;
      while (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
      }
      stops.ended();
      while ((waited = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
      }
    }
  }
  // Read with the handlers restored: a stop caught up to then is raised by end_if_stopped, never lost.
  if (const int stop_signal = StopsPassedOn::received())
    return {std::string("stopped by ") + strsignal(stop_signal), false, false, "", stop_signal};
  if (!started) return {"cannot start " + args[0]};
  const bool exited = waited == pid && WIFEXITED(status);
  if (exited && WEXITSTATUS(status) == 0) return {};
  const std::string why = last_line(log);
  if (exited && WEXITSTATUS(status) == 2 && !why.empty() && why[0] != '#') return {why, /*refused_input=*/true};
  const std::string prefix = "charts.py: error: ";  // its line names what it could not write: ddplab's line then
  if (exited && WEXITSTATUS(status) == kExitWriteFailed && why.rfind(prefix, 0) == 0)
    return {why.substr(prefix.size()), false, /*write_failed=*/true};
  return {(why.empty() || why[0] == '#' ? "charts.py failed" : why) + "; its log: " + log, false, false, log};
}

ChartFailure write_run_page(const std::vector<SummarizedRun>& runs, const std::string& page) {
  std::string pattern = (fs::temp_directory_path() / "ddplab_page.XXXXXX").string();
  if (!mkdtemp(pattern.data())) {
    const int error = errno;
    return {"cannot create a temporary folder for the charts in " + fs::temp_directory_path().string() + ": " +
                std::strerror(error),
            false, /*write_failed=*/true};
  }
  const std::string work = pattern;
  nlohmann::json reports = nlohmann::json::array();
  std::vector<std::string> args = {work + "/charts", "--page", page, "--report", work + "/report.json"};
  for (const SummarizedRun& run : runs) {
    reports.push_back(report_json(run));
    args.push_back(run.record.path);
  }
  std::ofstream report(work + "/report.json");
  report << reports.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  report.close();
  std::error_code ignored;
  if (!report) {  // a full temporary folder
    fs::remove_all(work, ignored);
    return {"cannot write " + work + "/report.json (the charts' report)", false, /*write_failed=*/true};
  }
  const ChartFailure failure = run_chart_script(args, work + "/charts.log");
  if (failure.log.empty()) fs::remove_all(work, ignored);  // else its log stays, named, for the reader
  end_if_stopped(failure);
  return failure;
}

std::string default_page_path(const std::string& run_file) {
  const bool h5 = run_file.size() > 3 && run_file.compare(run_file.size() - 3, 3, ".h5") == 0;
  return (h5 ? run_file.substr(0, run_file.size() - 3) : run_file) + ".report.html";
}

void print_page_line(const std::string& page, const std::string& error) {
  if (error.empty())
    std::printf("page: %s (one self-contained file: open it in a browser)\n", page.c_str());
  else
    std::printf("page: not written (%s)\n", error.c_str());
  std::fflush(stdout);
}

namespace {
std::vector<std::function<void()>>& after_mpi_queue() {
  static std::vector<std::function<void()>> queue;
  return queue;
}
}  // namespace

void after_mpi(std::function<void()> work) { after_mpi_queue().push_back(std::move(work)); }

void run_after_mpi() {
  std::vector<std::function<void()>> queue;
  queue.swap(after_mpi_queue());
  for (const std::function<void()>& work : queue) work();
}

void write_train_page(const SummarizedRun& run, bool quiet) {
  const std::string page = default_page_path(run.record.path);
  const ChartFailure failure = write_run_page({run}, page);
  if (!quiet)
    print_page_line(page, failure.why);
  else if (failure)  // --quiet prints only errors, and a page asked for and not written is one
    std::fprintf(stderr, "ddplab: page %s not written (%s)\n", page.c_str(), failure.why.c_str());
}

}  // namespace ddplab
