// dbrq::distributed's API on one rank (an MPI singleton: no mpirun needed): bad inputs raise the
// documented errors with their messages, a one-rank run equals plain calibration, and the atomic
// write. The multi-rank behaviour is in mpi_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dbrq.h"
#include "distributed/calibrate.h"
#include "samples/zoo/zoo.h"
#include "tests/distributed/mpi_env.h"

namespace {

using ::testing::HasSubstr;
namespace dd = dbrq::distributed;

std::string g_comm_before_session;  // what Comm() threw before MPI was initialized (see main)

#define EXPECT_THROW_MSG(stmt, type, text)                          \
  try {                                                            \
    stmt;                                                          \
    ADD_FAILURE() << "no exception from " #stmt;                   \
  } catch (const type& e) {                                        \
    EXPECT_THAT(std::string(e.what()), HasSubstr(text));           \
  } catch (const std::exception& e) {                              \
    ADD_FAILURE() << "wrong exception type: " << e.what();         \
  }

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string temp(const std::string& name) { return std::string(std::getenv("TEST_TMPDIR")) + "/" + name; }

const zoo::ModelSpec& cnn() { return zoo::find_model("small_cnn"); }

std::shared_ptr<dbrq::nn::Module> fresh() {
  dbrq::manual_seed(3);
  auto m = cnn().make(zoo::Variant::kTiny);
  m->eval();
  return m;
}

dbrq::Tensor batch(int64_t i) { return cnn().example_input(zoo::Variant::kTiny, 4, 100 + static_cast<uint64_t>(i)); }

TEST(DistributedApi, CommBeforeMpiSessionIsAUsageError) {
  EXPECT_THAT(g_comm_before_session, HasSubstr("UsageError: distributed::Comm: MPI is not initialized; create a "
                                               "distributed::MpiSession first"));
}

TEST(DistributedApi, NonPositiveTimeoutIsAValueError) {
  EXPECT_THROW_MSG(dd::Comm(0), dbrq::ValueError, "distributed::Comm: timeout_seconds must be > 0, got 0");
  EXPECT_THROW_MSG(dd::Comm(-1), dbrq::ValueError, "timeout_seconds must be > 0, got -1");
}

TEST(DistributedApi, ReplicaWithoutCallbacksIsAValueError) {
  dd::Comm comm(30);
  dd::Replica r;
  EXPECT_THROW_MSG(dd::calibrate(comm, r), dbrq::ValueError,
                   "distributed::calibrate: Replica needs both prepare and calibrate");
}

TEST(DistributedApi, AnUnpreparedReplicaFailsNamingTheRankAndTheRule) {
  dd::Comm comm(30);
  auto model = fresh();
  dd::Replica r;
  r.prepare = [&]() -> dbrq::nn::Module& { return *model; };
  r.calibrate = [](dbrq::nn::Module&, dd::Shard&) {};
  EXPECT_THROW_MSG(dd::calibrate(comm, r), dd::DistributedError,
                   "distributed calibration failed on rank 0 of 1: prepare: UsageError: Replica::prepare must return "
                   "a prepared model that is not converted");
}

TEST(DistributedApi, AReplicaAlreadyCalledAfterPrepareIsRefused) {
  dd::Comm comm(30);
  auto model = fresh();
  dd::Replica r;
  r.prepare = [&]() -> dbrq::nn::Module& {
    dbrq::prepare(*model, {batch(0)});
    cnn().run(*model, batch(1));
    return *model;
  };
  r.calibrate = [](dbrq::nn::Module&, dd::Shard&) {};
  EXPECT_THROW_MSG(dd::calibrate(comm, r), dd::DistributedError,
                   "rank 0 of 1: prepare: UsageError: the replica was called 1 times after prepare; Replica::prepare "
                   "must return a freshly prepared model");
}

TEST(DistributedApi, AnExceptionInCalibrateNamesItsTypeAndWritesNothing) {
  dd::Comm comm(30);
  auto model = fresh();
  dd::Replica r;
  r.prepare = [&]() -> dbrq::nn::Module& {
    dbrq::prepare(*model, {batch(0)});
    return *model;
  };
  r.calibrate = [](dbrq::nn::Module& m, dd::Shard&) { cnn().run(m, dbrq::randn({4, 2, 8, 8}, 1)); };
  dd::DistributedOptions o;
  o.save_path = temp("never.json");
  EXPECT_THROW_MSG(dd::calibrate(comm, r, o), dd::DistributedError,
                   "distributed calibration failed on rank 0 of 1: calibrate: ShapeError: ");
  EXPECT_FALSE(std::filesystem::exists(o.save_path));
}

TEST(DistributedApi, OneRankEqualsPlainCalibration) {
  const std::string plain = temp("plain.json"), dist = temp("dist.json");
  {
    auto model = fresh();
    dbrq::prepare(*model, {batch(0)}, dbrq::default_qconfig_mapping("onednn"));
    for (int64_t i = 0; i < 5; ++i) cnn().run(*model, batch(i));
    dbrq::save_quant_state(*model, plain);
  }
  dd::Comm comm(30);
  auto model = fresh();
  dd::Replica r;
  r.prepare = [&]() -> dbrq::nn::Module& {
    dbrq::prepare(*model, {batch(0)}, dbrq::default_qconfig_mapping("onednn"));
    return *model;
  };
  std::vector<int64_t> seen;
  r.calibrate = [&](dbrq::nn::Module& m, dd::Shard& shard) {
    EXPECT_EQ(shard.rank(), 0);
    EXPECT_EQ(shard.size(), 1);
    for (int64_t i : shard.items(5)) {
      EXPECT_FALSE(shard.stop_requested());
      seen.push_back(i);
      cnn().run(m, batch(i));
    }
  };
  dd::DistributedOptions o;
  o.save_path = dist;
  const dd::ReductionStats st = dd::calibrate(comm, r, o);
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(read(dist), read(plain));
  EXPECT_EQ(st.gathered_bytes, 0);
  EXPECT_GT(st.broadcast_bytes, 1000);
  EXPECT_GE(st.reduction_ms(), 0.0);
  dbrq::convert(*model);  // rank 0 converts from its own (merged) statistics
}

TEST(DistributedApi, WriteFileAtomicallyReplacesTheFileAndLeavesNoTemporary) {
  const std::string path = temp("atomic.txt");
  std::ofstream(path) << "old";
  dd::write_file_atomically(path, "new contents");
  EXPECT_EQ(read(path), "new contents");
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    EXPECT_EQ(e.path().filename().string().find("atomic.txt.tmp"), std::string::npos) << e.path();
  }
  EXPECT_THROW_MSG(dd::write_file_atomically(temp("no_dir/x.txt"), "x"), dbrq::IOError, "cannot open \"");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    dd::Comm c;
  } catch (const dbrq::UsageError& e) {
    g_comm_before_session = std::string("UsageError: ") + e.what();
  }
  // A singleton starts OpenMPI's runtime too: its files go to this test's own directory.
  for (const auto& [name, value] : dbrq::testing::mpi_private_dirs()) setenv(name.c_str(), value.c_str(), 1);
  dd::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
