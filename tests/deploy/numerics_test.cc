// compare_numerics: the op-by-op comparison of a converted model against its fp32 original, and
// its three renderings (table, CSV, self-contained HTML with an inline SVG chart).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/zoo.h"

namespace dbrq {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// An fp32 small CNN and a converted copy with the same weights.
class Numerics : public ::testing::Test {
 protected:
  Numerics() : spec_(zoo::find_model("small_cnn")) {
    fp32_ = spec_.make(zoo::Variant::kTiny);
    fp32_->eval();
    q_ = spec_.make(zoo::Variant::kTiny);
    q_->load_state_dict(fp32_->state_dict());
    q_->eval();
    prepare(*q_, {input(0)});
    for (uint64_t s = 1; s <= 4; ++s) spec_.run(*q_, input(s));
    convert(*q_);
  }
  Tensor input(uint64_t seed) const { return spec_.example_input(zoo::Variant::kTiny, 4, seed); }
  std::vector<std::vector<Tensor>> inputs() const { return {{input(10)}, {input(11)}, {input(12)}}; }

  const zoo::ModelSpec& spec_;
  std::shared_ptr<nn::Module> fp32_, q_;
};

TEST_F(Numerics, ReportsEveryQuantizedOpWorstFirst) {
  const NumericReport r = compare_numerics(*fp32_, *q_, inputs());
  EXPECT_EQ(r.batches, 3);
  // SmallCnn: conv+bn+relu, conv+bn+relu, max_pool, conv+relu, adaptive_avg_pool, flatten, linear.
  ASSERT_EQ(r.ops.size(), 7u);
  std::set<std::string> ops;
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const OpNumerics& o = r.ops[i];
    ops.insert(o.op + "@" + o.fqn);
    EXPECT_EQ(o.module_fqn, "");
    EXPECT_GT(o.elements, 0) << o.op;
    EXPECT_GT(o.sqnr_db, 15.0) << o.op;  // int8 of a sane model: tens of dB
    EXPECT_GE(o.max_abs_error, 0.0);
    EXPECT_THAT(o.qparams, HasSubstr("scale")) << o.op;
    if (i > 0) {
      EXPECT_LE(r.ops[i - 1].sqnr_db, o.sqnr_db) << "not sorted worst first";
    }
  }
  EXPECT_TRUE(ops.count("conv2d+batch_norm+relu@conv1"));
  EXPECT_TRUE(ops.count("conv2d+batch_norm+relu@conv2"));
  EXPECT_TRUE(ops.count("conv2d+relu@conv3"));
  EXPECT_TRUE(ops.count("linear@fc"));
  EXPECT_GT(r.output_sqnr_db, 20.0);
  EXPECT_LT(r.output_sqnr_db, 80.0);  // int8 is not exact
  EXPECT_GT(r.output_max_abs_error, 0.0);
  // The op indices are those of the recorded ops.
  for (const OpNumerics& o : r.ops) {
    EXPECT_GE(o.index, 0);
    EXPECT_LT(o.index, 12);
  }
}

TEST_F(Numerics, ComparisonDoesNotChangeEitherModel) {
  const Tensor x = input(20);
  const Tensor before_q = spec_.run(*q_, x), before_f = spec_.run(*fp32_, x);
  compare_numerics(*fp32_, *q_, inputs());
  const Tensor after_q = spec_.run(*q_, x), after_f = spec_.run(*fp32_, x);
  EXPECT_EQ(after_q.to_vector<float>(), before_q.to_vector<float>());
  EXPECT_EQ(after_f.to_vector<float>(), before_f.to_vector<float>());
  EXPECT_FALSE(is_prepared(*fp32_));
}

TEST_F(Numerics, TableHasOneRowPerOpWorstFirst) {
  const NumericReport r = compare_numerics(*fp32_, *q_, inputs());
  const std::vector<std::string> lines = lines_of(r.to_table());
  // Header, one row per op in report order, then the model's output line.
  ASSERT_EQ(lines.size(), r.ops.size() + 2);
  EXPECT_THAT(lines[0], HasSubstr("SQNR dB"));
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const OpNumerics& o = r.ops[i];
    EXPECT_THAT(lines[i + 1], StartsWith(o.fqn.empty() ? "<model>" : o.fqn));
    EXPECT_THAT(lines[i + 1], HasSubstr(" " + std::to_string(o.index) + "  " + o.op));
    EXPECT_THAT(lines[i + 1], HasSubstr(o.qparams));
  }
  EXPECT_THAT(lines.back(), StartsWith("model output: SQNR "));
  EXPECT_THAT(lines.back(), HasSubstr("over 3 batch(es)"));
}

TEST_F(Numerics, CsvHasAHeaderAndOneQuotedRowPerOp) {
  const NumericReport r = compare_numerics(*fp32_, *q_, inputs());
  const std::vector<std::string> lines = lines_of(r.to_csv());
  ASSERT_EQ(lines.size(), r.ops.size() + 1);
  EXPECT_EQ(lines[0], "module_fqn,index,op,fqn,sqnr_db,max_abs_error,elements,qparams");
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const OpNumerics& o = r.ops[i];
    EXPECT_THAT(lines[i + 1], StartsWith("\"\"," + std::to_string(o.index) + ",\"" + o.op + "\",\"" + o.fqn + "\","));
    EXPECT_THAT(lines[i + 1], HasSubstr("," + std::to_string(o.elements) + ",\""));
  }
  // Quotes inside fields are doubled.
  NumericReport tricky;
  OpNumerics o;
  o.module_fqn = "a\"b";
  o.op = "add";
  o.fqn = "x,y";
  o.qparams = "scale=1";
  o.sqnr_db = std::numeric_limits<double>::infinity();
  tricky.ops.push_back(o);
  EXPECT_THAT(tricky.to_csv(), HasSubstr("\"a\"\"b\",0,\"add\",\"x,y\","));
}

TEST_F(Numerics, HtmlIsSelfContainedWithOneBarPerOp) {
  const NumericReport r = compare_numerics(*fp32_, *q_, inputs());
  const std::string html = r.to_html("Digits <CNN> & co");
  EXPECT_THAT(html, StartsWith("<!DOCTYPE html>"));
  EXPECT_THAT(html, HasSubstr("</html>"));
  EXPECT_THAT(html, HasSubstr("Digits &lt;CNN&gt; &amp; co"));  // the title is escaped
  EXPECT_THAT(html, Not(HasSubstr("<CNN>")));
  EXPECT_EQ(count_of(html, "<svg"), 1u);
  EXPECT_GE(count_of(html, "<rect"), r.ops.size());
  for (const OpNumerics& o : r.ops) EXPECT_THAT(html, HasSubstr(o.fqn));
  // No external assets: nothing fetched from elsewhere.
  for (const char* external : {"<script src", "<link", "<img", "@import", "url("}) {
    EXPECT_THAT(html, Not(HasSubstr(external))) << external;
  }
  EXPECT_EQ(count_of(html, "http"), count_of(html, "http://www.w3.org/2000/svg"));  // only the SVG namespace
}

TEST_F(Numerics, WritesReportFiles) {
  const NumericReport r = compare_numerics(*fp32_, *q_, inputs());
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/report.html";
  write_text_file(path, r.to_html("x"));
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), r.to_html("x"));
  try {
    write_text_file("/nonexistent-dir/report.html", "x");
    FAIL() << "no error";
  } catch (const IOError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot open \"/nonexistent-dir/report.html\""));
  }
}

TEST_F(Numerics, UsageErrors) {
  auto expect_usage = [](const std::function<void()>& f, const std::string& message) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr(message));
    }
  };
  expect_usage([&] { compare_numerics(*fp32_, *fp32_, inputs()); }, "compare_numerics");   // not converted
  expect_usage([&] { compare_numerics(*q_, *q_, inputs()); }, "compare_numerics");         // reference prepared
  try {
    compare_numerics(*fp32_, *q_, {});
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("compare_numerics: no inputs"));
  }
}

TEST(Sqnr, KnownValues) {
  const Tensor ref = from_vector<float>({1, 1, 1, 1}, {4});
  EXPECT_TRUE(std::isinf(sqnr_db(ref, ref)));
  // Signal 4, noise 1: 10 log10(4) dB.
  EXPECT_NEAR(sqnr_db(ref, from_vector<float>({1, 1, 1, 2}, {4})), 10.0 * std::log10(4.0), 1e-9);
  try {
    sqnr_db(ref, from_vector<float>({1, 1}, {2}));
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_THAT(e.what(), HasSubstr("sqnr_db: sizes [4] and [2]"));
  }
}

}  // namespace
}  // namespace dbrq
