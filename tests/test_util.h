// Helpers shared by the GoogleTest suites.
//
//   EXPECT_THROW_MSG(dbrq::conv2d(x, w), dbrq::ShapeError, "input must be 4-D");
//   dbrq::testing::expect_close(actual, expected, 1e-4);   // normwise relative error
//   auto golden = dbrq::testing::load_golden("tests/golden/ops.safetensors");
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tracer/internal.h"  // tests may look at the recorded program

// Expects `stmt` to throw exactly `Type` (or a subclass) whose what() contains `substr`.
#define EXPECT_THROW_MSG(stmt, Type, substr)                                                         \
  do {                                                                                               \
    bool dbrq_thrown_ = false;                                                                       \
    try {                                                                                            \
      stmt;                                                                                          \
    } catch (const Type& e) {                                                                        \
      dbrq_thrown_ = true;                                                                           \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos)                               \
          << "message was: " << e.what() << "\nexpected to contain: " << (substr);                 \
    } catch (const std::exception& e) {                                                              \
      ADD_FAILURE() << "expected " #Type " but got another exception: " << e.what();                \
      dbrq_thrown_ = true;                                                                           \
    }                                                                                                \
    EXPECT_TRUE(dbrq_thrown_) << "expected " #Type " from: " #stmt;                                  \
  } while (0)

namespace dbrq::testing {

// max|a - b| / max|b| over all elements (0 when both are all-zero). Sizes must match.
double relative_error(const Tensor& actual, const Tensor& expected);
// Fails the test (with a description) when sizes differ or relative_error exceeds `tol`.
void expect_close(const Tensor& actual, const Tensor& expected, double tol, const std::string& what = "");
// Element-wise equality of values (any dtypes), with a count of differing elements in the failure.
void expect_equal(const Tensor& actual, const Tensor& expected, const std::string& what = "");
// The elements as integers: a quantized tensor's codes (int_repr()), any other tensor's values.
std::vector<int32_t> codes(const Tensor& t);
// `n` batches of N(0, 1) samples of `sizes`, from seeds seed, seed + 1, ...
std::vector<Tensor> random_batches(int n, uint64_t seed, const std::vector<int64_t>& sizes);
// Distinct observers (union-find roots) of a prepared model, ascending.
std::set<int> observer_roots(ModelQuantState& m);
std::set<int> observer_roots(const nn::Module& model);
// Loads a committed golden file relative to the workspace root (Bazel runs tests from there).
std::map<std::string, Tensor> load_golden(const std::string& path);

// A path for a scratch file: $TEST_TMPDIR (Bazel's per-test directory) or /tmp, then `name`.
std::string temp_file(const std::string& name);
// A file's whole content ("" when it cannot be read); writes one, replacing it.
std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);
// A tensor from a golden map; fails with the list of available names when absent.
Tensor golden(const std::map<std::string, Tensor>& g, const std::string& name);

}  // namespace dbrq::testing
