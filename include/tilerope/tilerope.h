#pragma once
/// \file tilerope.h
/// Everything public in one include.

#include "tilerope/dtype.h"
#include "tilerope/error.h"
#include "tilerope/freqs.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"
#include "tilerope/rope_config.h"
#include "tilerope/runtime.h"
#include "tilerope/tensor.h"
