// Precision, recall, F1, macro-F1 and accuracy against values worked out by hand (scikit-learn's conventions:
// 0 where a ratio has nothing to divide by), and the text `evaluate` prints.
#include "engine/classification_report.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::engine {
namespace {

// Rows the true class, columns the predicted one. Class 2 is predicted once and never present.
const std::vector<int64_t> kConfusion{5, 1, 0,  //
                                      2, 3, 1,  //
                                      0, 0, 0};

TEST(ClassificationReport, MatchesTheCountsWorkedOutByHand) {
  const ClassReport r = classification_report(kConfusion, 3);
  EXPECT_EQ(r.classes, 3);
  EXPECT_EQ(r.total, 12);
  EXPECT_EQ(r.support, (std::vector<int64_t>{6, 6, 0}));
  EXPECT_DOUBLE_EQ(r.accuracy, 8.0 / 12.0);
  EXPECT_DOUBLE_EQ(r.precision[0], 5.0 / 7.0);
  EXPECT_DOUBLE_EQ(r.precision[1], 3.0 / 4.0);
  EXPECT_DOUBLE_EQ(r.precision[2], 0.0) << "predicted once, never right";
  EXPECT_DOUBLE_EQ(r.recall[0], 5.0 / 6.0);
  EXPECT_DOUBLE_EQ(r.recall[1], 0.5);
  EXPECT_DOUBLE_EQ(r.recall[2], 0.0) << "no row of the class";
  EXPECT_NEAR(r.f1[0], 10.0 / 13.0, 1e-15);
  EXPECT_NEAR(r.f1[1], 0.6, 1e-15);
  EXPECT_DOUBLE_EQ(r.f1[2], 0.0);
  EXPECT_NEAR(r.macro_f1, (10.0 / 13.0 + 0.6) / 3.0, 1e-15);
}

// scikit-learn's macro averages run over the classes among the labels or the predictions: a fourth class that
// neither holds (a dataset's num_classes larger than the classes it has) changes none of them.
TEST(ClassificationReport, AClassNeitherPresentNorPredictedDoesNotCountInTheMacroAverages) {
  const std::vector<int64_t> with_absent_class{5, 1, 0, 0,  //
                                               2, 3, 1, 0,  //
                                               0, 0, 0, 0,  //
                                               0, 0, 0, 0};
  const ClassReport three = classification_report(kConfusion, 3);
  const ClassReport four = classification_report(with_absent_class, 4);
  EXPECT_DOUBLE_EQ(four.macro_f1, three.macro_f1);
  EXPECT_DOUBLE_EQ(four.macro_precision, (5.0 / 7.0 + 0.75 + 0.0) / 3.0);
  EXPECT_DOUBLE_EQ(four.macro_recall, (5.0 / 6.0 + 0.5 + 0.0) / 3.0);
  EXPECT_DOUBLE_EQ(four.f1[3], 0.0);
}

TEST(ClassificationReport, TwoClassesPerfectAndAllWrong) {
  const ClassReport perfect = classification_report(std::vector<int64_t>{4, 0, 0, 6}, 2);
  EXPECT_DOUBLE_EQ(perfect.accuracy, 1.0);
  EXPECT_DOUBLE_EQ(perfect.macro_f1, 1.0);
  const ClassReport wrong = classification_report(std::vector<int64_t>{0, 4, 6, 0}, 2);
  EXPECT_DOUBLE_EQ(wrong.accuracy, 0.0);
  EXPECT_DOUBLE_EQ(wrong.macro_f1, 0.0);
}

TEST(ClassificationReport, RefusesCountsOfAnotherShape) {
  EXPECT_THROW(classification_report(std::vector<int64_t>{1, 2, 3}, 2), std::invalid_argument);
  EXPECT_THROW(classification_report(std::vector<int64_t>{1}, 1), std::invalid_argument);
}

TEST(ClassificationReport, TextNamesTheClassesAndPrintsTheMatrix) {
  const ClassReport r = classification_report(kConfusion, 3);
  const std::string text = format_classification_report(r, kConfusion, {"neg", "pos"});
  for (const char* part : {"precision", "neg", "pos", "macro avg", "0.7143", "0.8333", "0.7692",
                           "confusion matrix (rows: true class, columns: predicted class)"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " in\n" << text;
  }
  // The third class has no name: its number stands for it. The matrix's rows, spaces collapsed:
  std::string matrix = text.substr(text.find("confusion matrix"));
  std::string collapsed;
  for (const char c : matrix) {
    if (c != ' ' || (!collapsed.empty() && collapsed.back() != ' ' && collapsed.back() != '\n'))
      collapsed += c;
  }
  EXPECT_NE(collapsed.find("\nneg pos 2\nneg 5 1 0\npos 2 3 1\n2 0 0 0"), std::string::npos) << collapsed;
  // A tab or a newline in a name (a class folder's) would break the columns: escaped.
  const std::string odd = format_classification_report(r, kConfusion, {"tab\there", "line\nbreak", "50%"});
  for (const char* part : {"tab\\there", "line\\x0Abreak", "50%"}) {
    EXPECT_NE(odd.find(part), std::string::npos) << part << " in\n" << odd;
  }
  EXPECT_EQ(odd.find('\t'), std::string::npos) << odd;
}

}  // namespace
}  // namespace ddp::engine
