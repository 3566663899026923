// What a training run writes when one of its writes fails midway (launcher/run.cpp): after a failed snapshot the end
// checkpoint is still written, since it may well be on another disk, and where it fails too the stop names both. The
// fault: the run file's folder is moved away once the first snapshot is in it, so every later write there fails.
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "launcher/run.h"
#include "record/hdf5.h"
#include "tests/mpi/mpi_test_util.h"
#include "train/step_rules.h"

namespace ddplab {
namespace {

namespace fs = std::filesystem;

// A small MLP with a snapshot every 5 steps, and steps enough that the run is still going when the folder goes.
TrainConfig snapshotting_run(const std::string& out, const std::string& checkpoint) {
  TrainConfig c;
  c.mlp.input_dim = 16;
  c.mlp.hidden_dim = 32;
  c.mlp.num_classes = 4;
  c.batch = 4;
  c.steps = 5000;
  c.warmup_steps = 0;
  c.blas_threads = 1;
  c.flush_every = 5;
  c.out = out;
  c.checkpoint = checkpoint;
  c.quiet = true;
  return c;
}

// Runs c while rank 0 moves `folder` away once the run's first snapshot is in it. Returns the stop every rank threw.
std::optional<TrainingStopped> run_losing(const TrainConfig& c, const std::string& folder) {
  std::atomic<bool> ended{false};
  std::thread mover;
  if (world_rank() == 0)
    mover = std::thread([&] {
      while (!ended && !fs::exists(c.out + ".partial")) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (!ended) fs::rename(folder, folder + "_gone");
    });
  std::optional<TrainingStopped> stop;
  std::string other;
  try {
    run_training(c, MPI_COMM_WORLD, RunOptions{});
  } catch (const TrainingStopped& e) {
    stop = e;
  } catch (const std::exception& e) {
    other = e.what();
  }
  ended = true;
  if (mover.joinable()) mover.join();
  EXPECT_EQ(other, "");
  return stop;
}

// The step a stop's line says the run stopped after: "... (after step N) ...".
int stopped_after(const std::string& line) {
  const size_t at = line.find("(after step ");
  return at == std::string::npos ? -1 : std::stoi(line.substr(at + 12));
}

TEST(RunWrites, AFailedSnapshotStillWritesTheEndCheckpointElsewhere) {
  const SharedTempDir dir([](const std::string& path) {
    fs::create_directory(path + "/runs");
    fs::create_directory(path + "/checkpoints");
  });
  const std::string runs = dir.path() + "/runs", checkpoint = dir.path() + "/checkpoints/ck.h5";
  const std::optional<TrainingStopped> stop = run_losing(snapshotting_run(runs + "/run.h5", checkpoint), runs);
  ASSERT_TRUE(stop) << "the run was not stopped";
  const std::string line = stop->what();
  EXPECT_EQ(stop->exit_code, kExitWriteFailed) << line;
  EXPECT_NE(line.find(runs + "/run.h5.partial"), std::string::npos) << line;
  EXPECT_EQ(line.find("checkpoint"), std::string::npos) << line;
  EXPECT_EQ(line.find(runs + "/run.h5:"), std::string::npos)
      << "no run file tried beside the failed snapshot: " << line;
  const int step = stopped_after(line);
  ASSERT_GT(step, 0) << line;
  if (world_rank() == 0) {
    ASSERT_TRUE(fs::exists(checkpoint)) << "no end checkpoint after: " << line;
    H5Id file(open_for_reading(checkpoint), H5Fclose);
    EXPECT_EQ(read_int_attr(file, "step"), step + 1) << "a resume starts after the step the run stopped at";
    EXPECT_EQ(std::distance(fs::directory_iterator(dir.path() + "/checkpoints"), fs::directory_iterator{}), 1)
        << "the checkpoint alone, no temporary beside it";
  }
}

TEST(RunWrites, AnEndCheckpointThatFailsTooIsNamedBesideTheSnapshot) {
  const SharedTempDir dir([](const std::string& path) { fs::create_directory(path + "/runs"); });
  const std::string runs = dir.path() + "/runs", checkpoint = runs + "/ck.h5";
  const std::optional<TrainingStopped> stop = run_losing(snapshotting_run(runs + "/run.h5", checkpoint), runs);
  ASSERT_TRUE(stop) << "the run was not stopped";
  const std::string line = stop->what();
  EXPECT_EQ(stop->exit_code, kExitWriteFailed) << line;
  const size_t snapshot = line.find(runs + "/run.h5.partial"), saved = line.find("cannot save checkpoint");
  EXPECT_NE(snapshot, std::string::npos) << line;
  EXPECT_NE(saved, std::string::npos) << line;
  EXPECT_LT(snapshot, saved) << "the snapshot's failure first: " << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
}

}  // namespace
}  // namespace ddplab
