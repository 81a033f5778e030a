/* cuGetProcAddress: simgpu answers with its own functions, from the table
 * it shares with gpuwarden's remote client (cuda_procaddr.h). */
#include "internal.h"
#include "cuda_procaddr.h"
