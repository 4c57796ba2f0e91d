// The built-in presses: one `PressInfo <name>_press_info()` per method file, listed once in
// builtin_presses.cpp (the registry registers them on first use, in that order).
#pragma once
#include <vector>

#include "press/press.h"

namespace kvtrim {

PressInfo streamingllm_press_info();  // token/streamingllm.cpp
PressInfo snapkv_press_info();        // token/snapkv.cpp
PressInfo pyramidkv_press_info();     // token/pyramidkv.cpp
PressInfo tova_press_info();          // token/tova.cpp
PressInfo h2o_press_info();           // token/h2o.cpp
PressInfo expected_attention_press_info();  // token/expected_attention.cpp
PressInfo knorm_press_info();         // token/knorm.cpp
PressInfo random_press_info();        // token/random.cpp
PressInfo adakv_press_info();         // token/adakv.cpp (wrapper)
PressInfo kvcompose_press_info();     // token/kvcompose.cpp
PressInfo kvzip_press_info();         // token/kvzip.cpp
PressInfo ksvd_press_info();           // basis/static_bases.cpp
PressInfo eigenattention_press_info(); // basis/static_bases.cpp
PressInfo stiefattention_press_info(); // basis/stiefattention.cpp
PressInfo kqsvd_press_info();          // basis/static_bases.cpp
PressInfo staticpca_press_info();      // basis/static_bases.cpp
PressInfo ojakv_press_info();          // basis/ojakv.cpp
PressInfo palu_press_info();           // basis/palu.cpp
PressInfo think_press_info();          // channel/think.cpp
PressInfo spark_press_info();          // channel/spark.cpp
PressInfo swan_press_info();           // channel/swan.cpp
PressInfo lexico_press_info();         // channel/lexico.cpp

std::vector<PressInfo> builtin_press_infos();

}  // namespace kvtrim
