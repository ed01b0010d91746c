/* gpumap's device-side directory of a DeviceCache: which cache slot holds which extent of which
 * file, for kernels that look rows up themselves (gpumap's own row gathers do exactly this).
 *
 * Layout (all in device memory, written only by gpumap):
 *   owners[s]   the key of the extent slot s holds, or GPUMAP_EMPTY;
 *   buckets[b]  an open-addressing hash table from keys to slots: s + 1, 0 for an empty
 *               bucket (the end of a probe), GPUMAP_TOMB for one to step over;
 *   arena       the slot arena: slot s's bytes are at arena + (s << extent_shift).
 * A key is (file << 40) | extent, where `file` is the map's id in its cache (< 2^24) and
 * `extent` the extent's index in the file (< 2^40).
 *
 * A bucket is only a hint: a lookup trusts a slot once owners[slot] equals the key. gpumap
 * sets owners[s] after slot s holds the extent, clears it before s is reused, and reuses s
 * only after every kernel that could have seen the old entry has finished: gpumap's own row
 * kernels run inside such a scope (the cache's catalog registers them as readers until their
 * stream has passed them). Kernels of one's own run inside a lookup scope too: Rust's
 * `DeviceCache::lookup_scope(stream)`, Python's `DeviceCache.lookup_scope(stream)`, which hand
 * over the address of this struct in device memory and the file's number, and wait for the
 * stream when they end. python/examples/lookup_kernel.py is such a kernel.
 *
 * Plain C, so that host code (and gpumap's own tests) can compile it too. */
#ifndef GPUMAP_TABLE_H
#define GPUMAP_TABLE_H

#ifdef __CUDACC__
#define GPUMAP_HD __host__ __device__
#else
#define GPUMAP_HD
#endif

#define GPUMAP_EMPTY 0xffffffffffffffffull
#define GPUMAP_TOMB 0xffffffffffffffffull
#define GPUMAP_FILE_BITS 24
#define GPUMAP_EXTENT_BITS 40
#define GPUMAP_HASH_MULTIPLIER 0x9e3779b97f4a7c15ull

typedef struct gpumap_table {
    const unsigned long long* owners;
    const unsigned long long* buckets;
    const char* arena;
    /* Set to 1 for each slot a lookup found (gpumap's eviction reads them as "used"); may be
     * null. */
    unsigned char* used;
    unsigned long long slots;
    unsigned long long bucket_mask;  /* buckets - 1 (a power of two) */
    unsigned int bucket_bits;        /* log2(buckets) */
    unsigned int max_probes;         /* a lookup gives up (a miss) after this many buckets */
    unsigned int extent_shift;       /* log2(extent size) */
    unsigned int reserved;
} gpumap_table;

/* The key of `extent` of the file numbered `file` in its cache. */
GPUMAP_HD static inline unsigned long long gpumap_key(unsigned long long file,
                                                      unsigned long long extent)
{
    return (file << GPUMAP_EXTENT_BITS) | extent;
}

/* The first bucket a key's probe visits: Fibonacci hashing on the key's high bits. */
GPUMAP_HD static inline unsigned long long gpumap_bucket(const gpumap_table* t,
                                                         unsigned long long key)
{
    return (key * GPUMAP_HASH_MULTIPLIER) >> (64 - t->bucket_bits);
}

/* The slot holding `key`, or -1 when none does (a miss: gpumap reads it in). */
GPUMAP_HD static inline long long gpumap_lookup(const gpumap_table* t, unsigned long long key)
{
    unsigned long long b = gpumap_bucket(t, key);
    for (unsigned int probe = 0; probe < t->max_probes; ++probe) {
        const unsigned long long v = t->buckets[b];
        if (v == 0) {
            return -1;
        }
        if (v != GPUMAP_TOMB) {
            const unsigned long long slot = v - 1;
            if (slot < t->slots && t->owners[slot] == key) {
                return (long long)slot;
            }
        }
        b = (b + 1) & t->bucket_mask;
    }
    return -1;
}

/* Where byte `offset` of the file numbered `file` is in device memory, or null when its extent
 * is not resident. Marks the slot used. */
GPUMAP_HD static inline const char* gpumap_find(const gpumap_table* t, unsigned long long file,
                                                unsigned long long offset)
{
    const unsigned long long extent = offset >> t->extent_shift;
    const long long slot = gpumap_lookup(t, gpumap_key(file, extent));
    if (slot < 0) {
        return 0;
    }
    if (t->used) {
        t->used[slot] = 1;
    }
    const unsigned long long within = offset & ((1ull << t->extent_shift) - 1);
    return t->arena + ((unsigned long long)slot << t->extent_shift) + within;
}

#endif /* GPUMAP_TABLE_H */
