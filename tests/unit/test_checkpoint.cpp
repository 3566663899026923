// Checkpoints (record/checkpoint.h): a bitwise round trip of parameters and optimizer state for the MLP and the
// transformer, a resumed run that repeats the uninterrupted one's losses bit for bit, every refusal of a bad or
// mismatched file (one line naming the problem, nothing changed), and saving that leaves nothing half-written.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/rng.h"
#include "model/mlp.h"
#include "model/transformer.h"
#include "record/checkpoint.h"
#include "record/files.h"
#include "record/hdf5.h"
#include "runtime/errors.h"

namespace ddplab {
namespace {

namespace fs = std::filesystem;

MlpConfig SmallMlp(int hidden = 16, int layers = 2) {
  MlpConfig c;
  c.input_dim = 12;
  c.hidden_dim = hidden;
  c.num_hidden_layers = layers;
  c.num_classes = 5;
  return c;
}

OptimizerConfig Sgd(float momentum) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.lr = 0.05f;
  c.momentum = momentum;
  return c;
}

constexpr int kBatch = 4, kSeqLen = 24;

// One training step on the batch of step `step`, a pure function of the step as in the trainer. Returns the loss.
float TrainStep(Mlp<float>& model, Optimizer<float>& opt, int step) {
  const int in = model.config().input_dim;
  std::vector<float> x(static_cast<size_t>(kBatch) * in);
  std::vector<int32_t> y;
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(normal(step, i));
  for (int i = 0; i < kBatch; ++i)
    y.push_back(static_cast<int32_t>(hash64(step + 1000, i) % model.config().num_classes));
  model.zero_grad();
  const float loss = model.forward(x.data(), y.data(), kBatch);
  model.backward();
  opt.step(model.flat_params(), model.flat_grads());
  return loss;
}

float TrainStep(Transformer<float>& model, Optimizer<float>& opt, int step) {
  const TransformerConfig& c = model.config();
  std::vector<int32_t> tokens(static_cast<size_t>(kBatch) * kSeqLen, -1), lengths, targets;
  for (int i = 0; i < kBatch; ++i) {
    lengths.push_back(kSeqLen - 5 * i);
    for (int t = 0; t < lengths.back(); ++t)
      tokens[i * kSeqLen + t] = static_cast<int32_t>(hash64(step, i * kSeqLen + t) % c.vocab);
    targets.push_back(static_cast<int32_t>(hash64(step + 1000, i) % c.num_classes));
  }
  model.zero_grad();
  const float loss = model.forward(tokens.data(), lengths.data(), targets.data(), kBatch, kSeqLen);
  model.backward();
  opt.step(model.flat_params(), model.flat_grads());
  return loss;
}

// A model with its optimizer, as the trainer holds them.
template <typename Model>
struct Replica {
  template <typename Config>
  Replica(const Config& model_config, uint64_t seed, const OptimizerConfig& opt_config)
      : model(model_config, seed), opt(opt_config, model.flat_size()) {}
  std::vector<float> params() const { return {model.flat_params(), model.flat_params() + model.flat_size()}; }
  float step(int s) { return TrainStep(model, opt, s); }
  Model model;
  Optimizer<float> opt;
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddplab_test_checkpoint_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  template <typename Model>
  std::string Save(const Replica<Model>& r, const std::string& name, int64_t step = 3) {
    const std::string path = dir_ + "/" + name;
    CheckpointInfo info;
    info.step = step;
    info.config_json = R"({"model":"test"})";
    save_checkpoint(path, false, r.model.parameters(), r.model.flat_params(), r.opt, info);
    return path;
  }

  // An MLP trained 3 steps with AdamW, saved.
  std::string SavedMlp(const std::string& name, const OptimizerConfig& opt = {}) {
    Replica<Mlp<float>> r(SmallMlp(), 7, opt);
    for (int s = 0; s < 3; ++s) r.step(s);
    return Save(r, name);
  }

  // The one-line UsageError load_checkpoint() gives for `path` into `r`, after checking that it names the file
  // and left the replica untouched; "(no error)" if it loaded.
  template <typename Model>
  std::string LoadError(const std::string& path, Replica<Model>& r) {
    const std::vector<float> params = r.params(), m = r.opt.first_moment(), v = r.opt.second_moment();
    const int t = r.opt.steps_taken();
    try {
      load_checkpoint(path, r.model.parameters(), r.model.flat_params(), r.opt);
    } catch (const UsageError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("cannot load checkpoint " + path + ": ", 0), 0u) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      EXPECT_TRUE(SameBits(r.params(), params) && SameBits(r.opt.first_moment(), m) &&
                  SameBits(r.opt.second_moment(), v) && r.opt.steps_taken() == t)
          << "a refused load changed the model or the optimizer";
      return message;
    }
    return "(no error)";
  }
  std::string LoadErrorIntoMlp(const std::string& path, const MlpConfig& c = SmallMlp(),
                               const OptimizerConfig& o = {}) {
    Replica<Mlp<float>> r(c, 99, o);
    return LoadError(path, r);
  }

  // Runs `edit` on the open file.
  template <typename Edit>
  static void EditFile(const std::string& path, Edit edit) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    edit(f);
    H5Fclose(f);
  }

  static std::vector<char> Bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void WriteBytes(const std::string& path, const char* data, size_t n) {
    std::ofstream(path, std::ios::binary).write(data, static_cast<std::streamsize>(n));
  }

  std::vector<std::string> FilesInDir() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
    return names;
  }

  std::string dir_;
};

#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// ---- round trip and resume -------------------------------------------------------------------------------------

// Trains 3 steps, saves, loads into a fresh replica (other seed, no state): every byte of parameters and state
// matches, and the next step gives the same parameters on both.
template <typename Model, typename Config>
void CheckRoundTrip(const std::string& path_in_dir, const Config& config, const OptimizerConfig& o) {
  Replica<Model> trained(config, 7, o), fresh(config, 99, o);
  for (int s = 0; s < 3; ++s) trained.step(s);
  CheckpointInfo info;
  info.step = 3;
  info.config_json = R"({"seed":7})";
  save_checkpoint(path_in_dir, false, trained.model.parameters(), trained.model.flat_params(), trained.opt, info);
  ASSERT_FALSE(SameBits(fresh.params(), trained.params()));

  const CheckpointInfo loaded =
      load_checkpoint(path_in_dir, fresh.model.parameters(), fresh.model.flat_params(), fresh.opt);
  EXPECT_EQ(loaded.step, 3);
  EXPECT_EQ(loaded.config_json, info.config_json);
  EXPECT_FALSE(loaded.git_commit.empty());
  EXPECT_FALSE(loaded.ddplab_version.empty());
  EXPECT_EQ(fresh.opt.steps_taken(), 3);
  EXPECT_TRUE(SameBits(fresh.params(), trained.params()));
  EXPECT_TRUE(SameBits(fresh.opt.first_moment(), trained.opt.first_moment()));
  EXPECT_TRUE(SameBits(fresh.opt.second_moment(), trained.opt.second_moment()));
  EXPECT_EQ(trained.step(3), fresh.step(3));
  EXPECT_TRUE(SameBits(fresh.params(), trained.params()));
}

TEST_F(Checkpoint, MlpRoundTripIsBitwiseForAdamWAndSgdWithMomentum) {
  CheckRoundTrip<Mlp<float>>(dir_ + "/adamw.h5", SmallMlp(), OptimizerConfig{});
  CheckRoundTrip<Mlp<float>>(dir_ + "/sgd.h5", SmallMlp(), Sgd(0.9f));
}

TEST_F(Checkpoint, TinyTransformerRoundTripIsBitwise) {
  CheckRoundTrip<Transformer<float>>(dir_ + "/tiny.h5", TransformerConfig::preset("tiny"), OptimizerConfig{});
}

// Six steps in one go, or three, a checkpoint, and three more in a fresh process's objects: the same losses and
// the same final parameters, bit for bit.
template <typename Model, typename Config>
void CheckResumeRepeatsTheLossCurve(const std::string& path, const Config& config) {
  Replica<Model> whole(config, 7, {});
  std::vector<float> losses;
  for (int s = 0; s < 6; ++s) losses.push_back(whole.step(s));

  Replica<Model> first(config, 7, {});
  std::vector<float> resumed_losses;
  for (int s = 0; s < 3; ++s) resumed_losses.push_back(first.step(s));
  CheckpointInfo info;
  info.step = 3;
  save_checkpoint(path, false, first.model.parameters(), first.model.flat_params(), first.opt, info);

  Replica<Model> second(config, 1234, {});
  const int64_t start = load_checkpoint(path, second.model.parameters(), second.model.flat_params(), second.opt).step;
  for (int64_t s = start; s < 6; ++s) resumed_losses.push_back(second.step(static_cast<int>(s)));
  EXPECT_TRUE(SameBits(resumed_losses, losses));
  EXPECT_TRUE(SameBits(second.params(), whole.params()));
}

TEST_F(Checkpoint, ResumedRunRepeatsTheUninterruptedLossCurve) {
  CheckResumeRepeatsTheLossCurve<Mlp<float>>(dir_ + "/mlp.h5", SmallMlp());
  CheckResumeRepeatsTheLossCurve<Transformer<float>>(dir_ + "/tiny.h5", TransformerConfig::preset("tiny"));
}

TEST_F(Checkpoint, LayoutIsOneFloat32DatasetPerParameterByName) {
  Replica<Mlp<float>> r(SmallMlp(), 7, {});
  r.step(0);
  const std::string path = Save(r, "layout.h5");
  EditFile(path, [&](hid_t f) {
    for (const std::string group : {"params", "optimizer/exp_avg", "optimizer/exp_avg_sq"}) {
      for (const auto& p : r.model.parameters()) {
        const std::string name = group + "/" + p.name;
        const hid_t set = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
        ASSERT_GE(set, 0) << name;
        const hid_t type = H5Dget_type(set), space = H5Dget_space(set);
        EXPECT_GT(H5Tequal(type, H5T_IEEE_F32LE), 0) << name;
        std::vector<hsize_t> dims(H5Sget_simple_extent_ndims(space));
        H5Sget_simple_extent_dims(space, dims.data(), nullptr);
        EXPECT_EQ(dims, std::vector<hsize_t>(p.shape.begin(), p.shape.end())) << name;
        H5Tclose(type), H5Sclose(space), H5Dclose(set);
      }
    }
  });
}

// ---- refusals on load ------------------------------------------------------------------------------------------

TEST_F(Checkpoint, RefusesAParameterOfAnotherShape) {
  const std::string path = SavedMlp("c.h5");
  EXPECT_CONTAINS(LoadErrorIntoMlp(path, SmallMlp(20)), "params/fc0.weight has shape [16, 12], expected [20, 12]");
}

TEST_F(Checkpoint, RefusesAMissingTensor) {
  const std::string path = SavedMlp("c.h5");
  EditFile(path, [](hid_t f) { ASSERT_GE(H5Ldelete(f, "params/fc2.weight", H5P_DEFAULT), 0); });
  EXPECT_CONTAINS(LoadErrorIntoMlp(path), "missing tensor params/fc2.weight");
}

TEST_F(Checkpoint, RefusesATensorThisModelDoesNotHave) {
  Replica<Mlp<float>> deeper(SmallMlp(16, 3), 7, {});
  const std::string path = Save(deeper, "deeper.h5");
  EXPECT_CONTAINS(LoadErrorIntoMlp(path), "unexpected tensor params/fc3.bias");
}

TEST_F(Checkpoint, RefusesAFloat64Dataset) {
  const std::string path = SavedMlp("c.h5");
  EditFile(path, [](hid_t f) {
    ASSERT_GE(H5Ldelete(f, "params/fc1.bias", H5P_DEFAULT), 0);
    const hsize_t dims[1] = {16};
    const std::vector<double> zeros(16, 0.0);
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t set = H5Dcreate2(f, "params/fc1.bias", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(set, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data());
    H5Dclose(set), H5Sclose(space);
  });
  EXPECT_CONTAINS(LoadErrorIntoMlp(path), "params/fc1.bias is float64, expected float32");
}

TEST_F(Checkpoint, RefusesAnotherOptimizerOrMissingState) {
  const std::string adamw = SavedMlp("adamw.h5");
  EXPECT_CONTAINS(LoadErrorIntoMlp(adamw, SmallMlp(), Sgd(0.9f)),
                  "optimizer adamw in the checkpoint, this run uses sgd");

  const std::string momentum = SavedMlp("momentum.h5", Sgd(0.9f));
  EXPECT_CONTAINS(LoadErrorIntoMlp(momentum, SmallMlp(), Sgd(0.0f)), "unexpected optimizer state optimizer/momentum");
  const std::string plain = SavedMlp("plain.h5", Sgd(0.0f));
  EXPECT_CONTAINS(LoadErrorIntoMlp(plain, SmallMlp(), Sgd(0.9f)), "missing optimizer state optimizer/momentum");

  EditFile(adamw, [](hid_t f) { ASSERT_GE(H5Ldelete(f, "optimizer/exp_avg_sq", H5P_DEFAULT), 0); });
  EXPECT_CONTAINS(LoadErrorIntoMlp(adamw), "missing optimizer state optimizer/exp_avg_sq");
  const std::string one = SavedMlp("one.h5");
  EditFile(one, [](hid_t f) { ASSERT_GE(H5Ldelete(f, "optimizer/exp_avg/fc0.bias", H5P_DEFAULT), 0); });
  EXPECT_CONTAINS(LoadErrorIntoMlp(one), "missing tensor optimizer/exp_avg/fc0.bias");
}

TEST_F(Checkpoint, RefusesATruncatedFile) {
  const std::vector<char> bytes = Bytes(SavedMlp("whole.h5"));
  const std::string half = dir_ + "/half.h5";
  WriteBytes(half, bytes.data(), bytes.size() / 2);
  EXPECT_CONTAINS(LoadErrorIntoMlp(half), "truncated");
}

// A damaged byte inside a tensor's data, where HDF5's own structure is intact: the checksum catches it.
TEST_F(Checkpoint, RefusesDamagedTensorData) {
  Replica<Mlp<float>> r(SmallMlp(), 7, {});
  const std::string path = Save(r, "c.h5");
  std::vector<char> bytes = Bytes(path);
  const Parameter<float>& fc0 = r.model.parameters()[0];
  const char* data = reinterpret_cast<const char*>(fc0.data);
  const auto at = std::search(bytes.begin(), bytes.end(), data, data + 64);
  ASSERT_NE(at, bytes.end());
  at[10] ^= 0x01;
  WriteBytes(path, bytes.data(), bytes.size());
  const std::string message = LoadErrorIntoMlp(path);
  EXPECT_CONTAINS(message, "cannot read params/fc0.weight");
  EXPECT_CONTAINS(message, "checksum");
}

TEST_F(Checkpoint, RefusesFilesThatAreNotCheckpoints) {
  const std::string garbage = dir_ + "/garbage.h5", empty = dir_ + "/empty.h5", bare = dir_ + "/bare.h5";
  std::string noise;
  for (int i = 0; i < 4096; ++i) noise += static_cast<char>(hash64(1, i));
  WriteBytes(garbage, noise.data(), noise.size());
  WriteBytes(empty, "", 0);
  H5Fclose(H5Fcreate(bare.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  EXPECT_CONTAINS(LoadErrorIntoMlp(dir_ + "/missing.h5"), "No such file or directory");
  EXPECT_CONTAINS(LoadErrorIntoMlp(garbage), "not an HDF5 file");
  EXPECT_CONTAINS(LoadErrorIntoMlp(empty), "empty file");
  EXPECT_CONTAINS(LoadErrorIntoMlp(dir_), "is a folder");
  EXPECT_CONTAINS(LoadErrorIntoMlp(bare), "no format attribute (not a ddplab checkpoint)");
}

// ---- saving ----------------------------------------------------------------------------------------------------

TEST_F(Checkpoint, SaveNeverOverwritesWithoutForce) {
  Replica<Mlp<float>> r(SmallMlp(), 7, {});
  const std::string path = Save(r, "c.h5", 1);
  const std::vector<char> before = Bytes(path);
  r.step(0);
  try {
    save_checkpoint(path, false, r.model.parameters(), r.model.flat_params(), r.opt, CheckpointInfo{});
    FAIL() << "overwrote without force";
  } catch (const std::runtime_error& e) {
    EXPECT_CONTAINS(std::string(e.what()), path + " already exists");
  }
  EXPECT_EQ(Bytes(path), before);
  EXPECT_EQ(FilesInDir(), std::vector<std::string>{"c.h5"});

  CheckpointInfo info;
  info.step = 2;
  save_checkpoint(path, true, r.model.parameters(), r.model.flat_params(), r.opt, info);
  Replica<Mlp<float>> loaded(SmallMlp(), 99, {});
  EXPECT_EQ(load_checkpoint(path, loaded.model.parameters(), loaded.model.flat_params(), loaded.opt).step, 2);
  EXPECT_TRUE(SameBits(loaded.params(), r.params()));
  EXPECT_EQ(FilesInDir(), std::vector<std::string>{"c.h5"});
}

TEST_F(Checkpoint, FailedSaveLeavesNothingBehind) {
  Replica<Mlp<float>> r(SmallMlp(), 7, {});
  const auto save = [&](const std::string& path, const std::vector<Parameter<float>>& params) {
    try {
      save_checkpoint(path, false, params, r.model.flat_params(), r.opt, CheckpointInfo{});
    } catch (const std::exception& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_CONTAINS(save(dir_ + "/no/such/folder/c.h5", r.model.parameters()), "does not exist");
  WriteBytes(dir_ + "/file", "x", 1);
  EXPECT_CONTAINS(save(dir_ + "/file/c.h5", r.model.parameters()), "is not a folder");
  fs::remove(dir_ + "/file");

  // The write itself fails halfway (a second dataset of the same name): the temporary is removed.
  std::vector<Parameter<float>> twice = r.model.parameters();
  twice.back().name = twice.front().name;
  EXPECT_CONTAINS(save(dir_ + "/c.h5", twice), "cannot save checkpoint " + dir_ + "/c.h5");
  std::vector<Parameter<float>> slash = r.model.parameters();
  slash[0].name = "fc0/weight";
  EXPECT_CONTAINS(save(dir_ + "/c.h5", slash), "'fc0/weight'");
  EXPECT_TRUE(FilesInDir().empty());
}

// A complete file whose name is taken by the time it is published (another job wrote it meanwhile): the error names
// where the complete file is kept, and the other file is left as it was. A free name, or --force, takes it.
TEST_F(Checkpoint, APublishThatFailsKeepsTheCompleteFile) {
  const std::string path = dir_ + "/r.h5", tmp = temp_path_for(path);
  const auto text = [](const std::string& file) {
    const std::vector<char> bytes = Bytes(file);
    return std::string(bytes.begin(), bytes.end());
  };
  WriteBytes(tmp, "done", 4);
  WriteBytes(path, "other", 5);
  try {
    publish_file(tmp, path, /*force=*/false);
    ADD_FAILURE() << "published over " << path;
  } catch (const std::runtime_error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "cannot create " + path + ": " + std::strerror(EEXIST));
    EXPECT_CONTAINS(std::string(e.what()), "the complete file is kept as " + tmp);
  }
  EXPECT_EQ(text(tmp), "done");
  EXPECT_EQ(text(path), "other");
  publish_file(tmp, path, /*force=*/true);
  EXPECT_EQ(text(path), "done");
  WriteBytes(tmp, "next", 4);
  publish_file(tmp, dir_ + "/s.h5", /*force=*/false);
  EXPECT_EQ(text(dir_ + "/s.h5"), "next");
  std::vector<std::string> files = FilesInDir();
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"r.h5", "s.h5"}));
}

// The check for room before a run counts a checkpoint's tensor bytes; they must not exceed the file's size (the
// refusal is then certain), and a need beyond what the folder's file system has free is refused, naming the file.
TEST_F(Checkpoint, DataBytesBoundTheFileFromBelowAndTheFreeSpaceIsChecked) {
  Replica<Mlp<float>> r(SmallMlp(), 7, {});
  const std::string path = dir_ + "/c.h5";
  save_checkpoint(path, false, r.model.parameters(), r.model.flat_params(), r.opt, CheckpointInfo{});
  const uint64_t data = checkpoint_data_bytes(r.model.flat_size(), r.opt.config());
  EXPECT_EQ(data, 3 * sizeof(float) * r.model.flat_size());  // AdamW: the parameters and two moments
  EXPECT_GE(fs::file_size(path), data);
  EXPECT_EQ(check_free_space({{path, data}}), "");
  EXPECT_CONTAINS(check_free_space({{path, UINT64_MAX / 4}}), "not enough space for " + path + ": ");
  // Two files on one file system add up.
  EXPECT_CONTAINS(check_free_space({{path, UINT64_MAX / 4}, {dir_ + "/d.h5", UINT64_MAX / 4}}), "not enough space");
}

// An HDF5 call that failed for a reason of the system's says that reason ("No space left on device" on a full disk),
// not only which call failed.
TEST_F(Checkpoint, Hdf5FailuresCarryTheSystemsReason) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string path = dir_ + "/no/such/folder/c.h5";
  try {
    h5(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT), "create");
    ADD_FAILURE() << "created " << path;
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), std::strerror(ENOENT));
  }
  try {
    h5(H5Tset_size(H5T_NATIVE_INT, 0), "H5Tset_size");  // a refusal of HDF5's own: no system reason
    ADD_FAILURE() << "H5Tset_size on a predefined type succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "HDF5: H5Tset_size failed");
  }
}

}  // namespace
}  // namespace ddplab
