// Batched device copies for gpumap: many (src, dst, len) copies in one launch.
//
// One copy per thread block (blocks stride over the list), the block's threads moving 16, 4 or
// 1 bytes each as the addresses and length allow. Sources may be device memory or pinned host
// memory (mapped into the device's address space under unified addressing), so the same kernel
// scatters freshly read extents from a pinned staging buffer into cache slots and gathers cached
// extents into a caller's buffer.
//
// Built to PTX with NVRTC by scripts/build-ptx.py (no nvcc is needed at build or run time); the
// PTX is committed beside this file and loaded through the driver (cuModuleLoadData).

extern "C" __global__ void gpumap_copy_batch(const unsigned long long* __restrict__ src,
                                             const unsigned long long* __restrict__ dst,
                                             const unsigned int* __restrict__ len,
                                             unsigned int count)
{
    for (unsigned int i = blockIdx.x; i < count; i += gridDim.x) {
        const unsigned long long s = src[i];
        const unsigned long long d = dst[i];
        const unsigned int n = len[i];
        const unsigned long long misaligned = s | d | (unsigned long long)n;
        if ((misaligned & 15) == 0) {
            const uint4* from = reinterpret_cast<const uint4*>(s);
            uint4* to = reinterpret_cast<uint4*>(d);
            for (unsigned int k = threadIdx.x; k < n / 16; k += blockDim.x) {
                to[k] = from[k];
            }
        } else if ((misaligned & 3) == 0) {
            const unsigned int* from = reinterpret_cast<const unsigned int*>(s);
            unsigned int* to = reinterpret_cast<unsigned int*>(d);
            for (unsigned int k = threadIdx.x; k < n / 4; k += blockDim.x) {
                to[k] = from[k];
            }
        } else {
            const unsigned char* from = reinterpret_cast<const unsigned char*>(s);
            unsigned char* to = reinterpret_cast<unsigned char*>(d);
            for (unsigned int k = threadIdx.x; k < n; k += blockDim.x) {
                to[k] = from[k];
            }
        }
    }
}
