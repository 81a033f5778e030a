/* cuGetProcAddress: the client answers with its own functions, from the
 * table it shares with simgpu (cuda_procaddr.h), and CUDA_ERROR_NOT_FOUND
 * for any other: nothing reaches the worker's driver except through these. */
#include "client.h"
#include "cuda_procaddr.h"
