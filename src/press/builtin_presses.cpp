// The list of built-in presses: adding a press = one line here (docs/HOWTO-add-press.md).
#include "press/builtin_presses.h"

namespace kvtrim {

std::vector<PressInfo> builtin_press_infos() {
  std::vector<PressInfo> v;
  v.push_back(streamingllm_press_info());
  v.push_back(snapkv_press_info());
  v.push_back(pyramidkv_press_info());
  v.push_back(tova_press_info());
  v.push_back(h2o_press_info());
  v.push_back(expected_attention_press_info());
  v.push_back(knorm_press_info());
  v.push_back(random_press_info());
  v.push_back(adakv_press_info());
  v.push_back(kvcompose_press_info());
  v.push_back(kvzip_press_info());
  v.push_back(ksvd_press_info());
  v.push_back(eigenattention_press_info());
  v.push_back(stiefattention_press_info());
  v.push_back(kqsvd_press_info());
  v.push_back(staticpca_press_info());
  v.push_back(ojakv_press_info());
  v.push_back(palu_press_info());
  v.push_back(think_press_info());
  v.push_back(spark_press_info());
  v.push_back(swan_press_info());
  v.push_back(lexico_press_info());
  return v;
}

}  // namespace kvtrim
