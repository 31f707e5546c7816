// Which rows train, validate and test (io/data_plan.h).
#include <gtest/gtest.h>

#include <string>

#include "io/data_plan.h"
#include "io/dataset.h"
#include "tests/test_util.h"

namespace ddp::io {
namespace {

using ddp::testing::expect_user_error;

TEST(DataPlan, DescriptionSaysWhereTheTestScoreComesFrom) {
  DatasetInfo info;
  info.train_size = 1000;
  info.test_size = 300;
  EXPECT_NE(plan_data(info, "split", 0.1, 0, 2).describe().find("test 300 (scored once, at the end)"),
            std::string::npos);
  EXPECT_NE(plan_data(info, "test", 0.1, 0, 2).describe().find("no separate test score"), std::string::npos);
  EXPECT_EQ(plan_data(info, "split", 0.1, 0, 2).notes(), "");
  EXPECT_EQ(plan_data(info, "test", 0.1, 0, 2).notes(), "");
  info.test_size = 0;
  EXPECT_EQ(plan_data(info, "split", 0.1, 0, 2).notes(), ", no test score (/test has no rows)");
  EXPECT_EQ(plan_data(info, "split", 0.1, 0, 2).describe().find("test"), std::string::npos);
  // An empty /val: auto holds out /train's last rows, and says why; val refuses it.
  info.test_size = 300;
  info.has_val = true;
  const DataPlan passed_over = plan_data(info, "auto", 0.1, 0, 2);
  EXPECT_EQ(passed_over.validation.split, "train");
  EXPECT_EQ(passed_over.notes(), ", /val is empty (so data.validation = auto took /train's last rows)");
  EXPECT_EQ(plan_data(info, "split", 0.1, 0, 2).notes(), "");
  expect_user_error([&] { plan_data(info, "val", 0.1, 0, 2); }, {"/val has no rows"});
}

}  // namespace
}  // namespace ddp::io
