// The host build's stand-in for CUDA's <cuda_fp16.h>: everything is in cuda_host.h.
#pragma once
#include "cuda_host.h"
