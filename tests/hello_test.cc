#include <gtest/gtest.h>
#include <dnnl.hpp>
#include <spdlog/spdlog.h>
#include "absl/strings/str_cat.h"
TEST(Hello, Works){ dnnl::engine e(dnnl::engine::kind::cpu,0); spdlog::info("{}", absl::StrCat("a",1)); EXPECT_EQ(1,1);}
