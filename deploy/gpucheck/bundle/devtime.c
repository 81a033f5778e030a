/* devtime: the device time this process held and used, from CUPTI's
 * kernel activity records: the shares check's judge of each container's
 * device time, independent of images/s and of the agent's clock.
 *
 * train.py loads it with ctypes, calls gw_devtime_start once and
 * gw_devtime_read after each synchronize. Records carry each kernel's start
 * and end on the GPU's clock. Busy time is the union of those spans (kernels
 * on two streams that overlap count once). Held time is the span of each
 * stretch: kernels with less than gw_stretch_gap_ns between one's end and
 * the next one's start. A host-bound training leaves the GPU idle between
 * most of its kernels, so busy time follows its host's pace; under the
 * scheduler its stretches are its slices (the other container's slice, tens
 * of milliseconds, parts them), so held time is what its share promises.
 *
 * Built on the GPU's machine against its CUPTI headers (the record layout
 * is versioned: GW_KERNEL_RECORD names the newest CUpti_ActivityKernelN
 * there), linked to the libcupti PyTorch loads.
 */
#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef GW_KERNEL_RECORD
#error "GW_KERNEL_RECORD must name the CUpti_ActivityKernelN record of these headers"
#endif

enum { buffer_bytes = 8 << 20 };

/* Longer than a training's host gaps between kernels inside its slice, far
 * shorter than the other container's slice. */
static const uint64_t gw_stretch_gap_ns = 5000000;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t busy_ns, held_ns, stretch_start, last_end, kernels, dropped;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
	*buf = aligned_alloc(8, buffer_bytes);
	*size = *buf ? buffer_bytes : 0;
	*max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
	(void)size;
	CUpti_Activity *rec = NULL;
	pthread_mutex_lock(&mu);
	while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
		if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
			continue;
		const GW_KERNEL_RECORD *k = (const GW_KERNEL_RECORD *)rec;
		if (k->end <= k->start || k->end <= last_end)
			continue; /* unfinished, or inside a span counted */
		if (k->start > last_end + gw_stretch_gap_ns) { /* a new stretch */
			held_ns += last_end - stretch_start;
			stretch_start = k->start;
		}
		busy_ns += k->end - (k->start > last_end ? k->start : last_end);
		last_end = k->end;
		kernels++;
	}
	size_t n = 0;
	if (cuptiActivityGetNumDroppedRecords(ctx, stream, &n) == CUPTI_SUCCESS)
		dropped += n;
	pthread_mutex_unlock(&mu);
	free(buf);
}

/* gw_devtime_start enables kernel records; 0 or CUPTI's error code. */
int gw_devtime_start(void)
{
	CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
	if (r == CUPTI_SUCCESS)
		r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
	return (int)r;
}

/* gw_devtime_error names a CUPTI error code. */
const char *gw_devtime_error(int code)
{
	const char *s = "unknown CUPTI error";
	cuptiGetResultString((CUptiResult)code, &s);
	return s;
}

/* gw_devtime_read flushes the records of finished kernels (the caller has
 * synchronized) and fills out with the nanoseconds held and busy so far
 * (the open stretch up to its last kernel's end), the kernels counted and
 * the records CUPTI dropped. */
void gw_devtime_read(uint64_t out[4])
{
	cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
	pthread_mutex_lock(&mu);
	out[0] = held_ns + (last_end - stretch_start);
	out[1] = busy_ns;
	out[2] = kernels;
	out[3] = dropped;
	pthread_mutex_unlock(&mu);
}
