// The host build's stand-in for CUDA's <mma.h>: everything is in cuda_host.h.
#pragma once
#include "cuda_host.h"
