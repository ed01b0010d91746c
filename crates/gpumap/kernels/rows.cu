// Row gathers for gpumap: rows of a file, picked by index, copied into a caller's buffer.
//
// gpumap_gather_rows looks each row's extents up in a DeviceCache's directory
// (gpumap_table.h) and copies the rows whose extents are all resident; the others go to a
// miss list that the host fills from the file, or, where the file is also registered for the
// GPU (the cache in front of the zero-copy tier), are copied from it in place and still listed,
// so that the host can admit them into the cache. gpumap_gather_rows_direct copies rows from a
// file registered for the GPU (the zero-copy tier), where every row is resident. Both check
// every index first: one out of range (or negative) is never read, and the first such row is
// reported, so a bad index can never fault a kernel. gpumap_write_words applies the host's
// changes to the directory with 64-bit stores, so that a lookup running meanwhile sees every
// word either before or after, never torn.
//
// One warp per row (warps stride over the rows): each lane looks up some of the row's extents,
// then the warp copies the row 16, 8, 4 or 1 bytes a lane as the addresses allow.
//
// Built to PTX with NVRTC by scripts/build-ptx.py, committed beside this file and loaded
// through the driver.

#include "gpumap_table.h"

#define WARP 32

// Index `i` of the caller's index array (int32 or int64, by `index_bytes`).
__device__ static inline long long index_at(const void* indices, unsigned int index_bytes,
                                            unsigned long long i)
{
    if (index_bytes == 4) {
        return (long long)((const int*)indices)[i];
    }
    return ((const long long*)indices)[i];
}

// Copies `n` bytes from `src` to `dst` with the warp's lanes, as wide as alignment allows.
__device__ static inline void warp_copy(char* dst, const char* src, unsigned long long n,
                                        unsigned int lane)
{
    const unsigned long long mix =
        (unsigned long long)dst | (unsigned long long)src | n;
    if ((mix & 15) == 0) {
        const uint4* s = (const uint4*)src;
        uint4* d = (uint4*)dst;
        for (unsigned long long k = lane; k < n / 16; k += WARP) d[k] = s[k];
    } else if ((mix & 7) == 0) {
        const unsigned long long* s = (const unsigned long long*)src;
        unsigned long long* d = (unsigned long long*)dst;
        for (unsigned long long k = lane; k < n / 8; k += WARP) d[k] = s[k];
    } else if ((mix & 3) == 0) {
        const unsigned int* s = (const unsigned int*)src;
        unsigned int* d = (unsigned int*)dst;
        for (unsigned long long k = lane; k < n / 4; k += WARP) d[k] = s[k];
    } else {
        for (unsigned long long k = lane; k < n; k += WARP) dst[k] = src[k];
    }
}

// Notes row `i` as out of range: the lowest such row is reported.
__device__ static inline void bad_row(unsigned long long* first_bad, unsigned long long i)
{
    atomicMin(first_bad, i);
}

extern "C" __global__ void gpumap_gather_rows(gpumap_table table, unsigned long long file,
                                              const void* indices, unsigned int index_bytes,
                                              unsigned long long count, unsigned long long rows,
                                              unsigned long long row_size, char* dst,
                                              const char* in_place, unsigned int* misses,
                                              unsigned int* miss_count,
                                              unsigned long long* first_bad)
{
    const unsigned int lane = threadIdx.x % WARP;
    const unsigned long long warps = (unsigned long long)gridDim.x * (blockDim.x / WARP);
    const unsigned long long extent_mask = (1ull << table.extent_shift) - 1;
    for (unsigned long long i = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP; i < count;
         i += warps) {
        const long long index = index_at(indices, index_bytes, i);
        if (index < 0 || (unsigned long long)index >= rows) {
            if (lane == 0) bad_row(first_bad, i);
            continue;
        }
        const unsigned long long start = (unsigned long long)index * row_size;
        const unsigned long long first = start >> table.extent_shift;
        const unsigned long long last = (start + row_size - 1) >> table.extent_shift;
        // Every extent of the row resident, or the row is a miss (and copied by the host).
        bool resident = true;
        for (unsigned long long e = first + lane; e <= last && resident; e += WARP) {
            if (gpumap_lookup(&table, gpumap_key(file, e)) < 0) resident = false;
        }
        resident = __all_sync(0xffffffffu, resident);
        char* out = dst + i * row_size;
        if (!resident) {
            if (in_place) warp_copy(out, in_place + start, row_size, lane);
            if (lane == 0) misses[atomicAdd(miss_count, 1u)] = (unsigned int)i;
            continue;
        }
        for (unsigned long long e = first; e <= last; ++e) {
            // The same lookup again (cheap, and each lane needs the slot): still resident, as
            // nothing is reused while this kernel runs. Were it not, the row goes to the host
            // whole rather than the kernel reading outside the arena.
            long long slot = 0;
            if (lane == 0) {
                slot = gpumap_lookup(&table, gpumap_key(file, e));
                if (slot >= 0 && table.used) table.used[slot] = 1;
            }
            slot = __shfl_sync(0xffffffffu, slot, 0);
            if (slot < 0) {
                if (in_place) warp_copy(out, in_place + start, row_size, lane);
                if (lane == 0) misses[atomicAdd(miss_count, 1u)] = (unsigned int)i;
                break;
            }
            const unsigned long long from = e == first ? start & extent_mask : 0;
            const unsigned long long piece_end =
                e == last ? ((start + row_size - 1) & extent_mask) + 1 : extent_mask + 1;
            const unsigned long long at = (e << table.extent_shift) + from - start;
            const char* src = table.arena + ((unsigned long long)slot << table.extent_shift) + from;
            warp_copy(out + at, src, piece_end - from, lane);
        }
    }
}

extern "C" __global__ void gpumap_gather_rows_direct(const char* base, const void* indices,
                                                     unsigned int index_bytes,
                                                     unsigned long long count,
                                                     unsigned long long rows,
                                                     unsigned long long row_size, char* dst,
                                                     unsigned long long* first_bad)
{
    const unsigned int lane = threadIdx.x % WARP;
    const unsigned long long warps = (unsigned long long)gridDim.x * (blockDim.x / WARP);
    for (unsigned long long i = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP; i < count;
         i += warps) {
        const long long index = index_at(indices, index_bytes, i);
        if (index < 0 || (unsigned long long)index >= rows) {
            if (lane == 0) bad_row(first_bad, i);
            continue;
        }
        warp_copy(dst + i * row_size, base + (unsigned long long)index * row_size, row_size, lane);
    }
}

extern "C" __global__ void gpumap_write_words(unsigned long long* words,
                                              const unsigned long long* positions,
                                              const unsigned long long* values,
                                              unsigned long long count)
{
    for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         k < count; k += (unsigned long long)gridDim.x * blockDim.x) {
        // One 64-bit store: a lookup reading the word meanwhile sees it old or new, whole.
        words[positions[k]] = values[k];
    }
}
