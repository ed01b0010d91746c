//! The cache's directory for lookups outside the books: which slot holds which extent, as the
//! table a GPU kernel reads (`kernels/gpumap_table.h`) — or, on host memory, the same table in
//! host memory, read by the host's stand-in for the kernel. Kept up to date from the catalog
//! (`books::Catalog`): each reader publishes what the books recorded since the last one before
//! it looks anything up, and gives its ticket back when its lookups are over.
//!
//! The table: `owners[s]`, the key of the extent slot `s` holds (or `EMPTY`), and an
//! open-addressing hash table of buckets (`s + 1`, `0` empty, `TOMB` stepped over). A lookup
//! trusts a slot only once `owners[s]` equals its key, so a bucket is a hint: a stale one costs
//! a probe, never a wrong row. The host keeps a mirror (with each bucket's key) to place and
//! clear buckets, and writes only the words that changed, each one 64-bit store.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use crate::sync::Mutex;

use super::books::{Catalog, SlotId, EMPTY};
use super::geometry::Geometry;
use crate::error::{Error, Result};
use crate::memory::cuda::{CudaBuffer, CudaDevice, PinnedBuffer, Stream};
use crate::memory::kernels::{row_kernels, RowKernels, TableParams};
use crate::memory::Device;

/// A bucket to step over (a key that left).
const TOMB: u64 = u64::MAX;

/// The Fibonacci multiplier of `gpumap_bucket` in `gpumap_table.h`.
const HASH_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// A lookup gives up (a miss, served by the host) after this many buckets: at most half the
/// buckets are ever live, so a probe this long only comes from a rare cluster.
const MAX_PROBES: u32 = 128;

/// Bytes of the pinned buffer a publication's words go through: 64 Ki words a launch, so that
/// the changes of a gather of many misses (four words a miss) take a few launches, each waited
/// for, not dozens.
const STAGING: usize = 1 << 20;

/// Buckets per slot at least: the table stays at most half full.
const BUCKETS_PER_SLOT: usize = 2;

/// The first bucket of `key`'s probe among `1 << bits` buckets.
fn bucket_of(key: u64, bits: u32) -> u64 {
    key.wrapping_mul(HASH_MULTIPLIER) >> (64 - bits)
}

/// What a bucket of the mirror holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bucket {
    Empty,
    Live { key: u64, slot: SlotId },
    Tomb,
}

impl Bucket {
    /// The word the table holds for it.
    fn word(self) -> u64 {
        match self {
            Bucket::Empty => 0,
            Bucket::Live { slot, .. } => u64::from(slot) + 1,
            Bucket::Tomb => TOMB,
        }
    }
}

/// The host's copy of the table, with each bucket's key: where to put and find entries.
struct Mirror {
    owners: Vec<u64>,
    buckets: Vec<Bucket>,
    bits: u32,
    /// Buckets that are `Empty`: a lookup of a key not in the table stops at the first one,
    /// so as churn turns them into tombstones the table is rebuilt (see `apply`).
    empty: usize,
    /// A publication failed part way: the table may differ from the mirror anywhere, so the
    /// next one writes every word.
    resync: bool,
}

/// The words a publication writes: (position, value) in `owners` and in `buckets`.
type Writes = (Vec<(u64, u64)>, Vec<(u64, u64)>);

impl Mirror {
    fn new(slots: usize, bits: u32) -> Mirror {
        Mirror {
            owners: vec![EMPTY; slots],
            buckets: vec![Bucket::Empty; 1 << bits],
            bits,
            empty: 1 << bits,
            resync: false,
        }
    }

    /// Puts `key` (held by `slot`) in the first bucket of its probe that holds no live entry;
    /// returns the bucket. None within the probe: lookups simply do not find the extent (the
    /// host serves it), which is never wrong.
    fn insert(&mut self, key: u64, slot: SlotId) -> Option<usize> {
        let b = self.probe(key).find(|&b| !matches!(self.buckets[b], Bucket::Live { .. }))?;
        if self.buckets[b] == Bucket::Empty {
            self.empty -= 1;
        }
        self.buckets[b] = Bucket::Live { key, slot };
        Some(b)
    }

    /// The buckets rebuilt from `owners`, with no tombstone: every word is then rewritten.
    fn rebuild(&mut self) {
        self.buckets.fill(Bucket::Empty);
        self.empty = self.buckets.len();
        for s in 0..self.owners.len() {
            let key = self.owners[s];
            if key != EMPTY {
                self.insert(key, s as SlotId);
            }
        }
        self.resync = true;
    }

    /// The buckets of `key`'s probe, in order.
    fn probe(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let mask = self.buckets.len() - 1;
        let first = bucket_of(key, self.bits) as usize;
        (0..MAX_PROBES as usize).map(move |k| (first + k) & mask)
    }

    /// Applies the catalog's changes in order; returns the words that end up changed, each
    /// with its final value (a word changed twice is written once).
    fn apply(&mut self, changes: &[(SlotId, u64)]) -> Writes {
        let (mut owners, mut buckets) = (Vec::new(), Vec::new());
        for &(slot, key) in changes {
            let s = slot as usize;
            let Some(&old) = self.owners.get(s) else { continue };
            if old == key {
                continue;
            }
            if old != EMPTY {
                let live = Bucket::Live { key: old, slot };
                let found = self
                    .probe(old)
                    .take_while(|&b| self.buckets[b] != Bucket::Empty)
                    .find(|&b| self.buckets[b] == live);
                if let Some(b) = found {
                    self.buckets[b] = Bucket::Tomb;
                    buckets.push(b);
                }
            }
            self.owners[s] = key;
            owners.push(s);
            if key != EMPTY {
                buckets.extend(self.insert(key, slot));
            }
        }
        // Once a quarter of the buckets or fewer are empty, a lookup that misses walks long
        // runs of tombstones (up to MAX_PROBES): start again from the live entries.
        if self.empty < self.buckets.len() / 4 {
            self.rebuild();
        }
        if std::mem::take(&mut self.resync) {
            owners = (0..self.owners.len()).collect();
            buckets = (0..self.buckets.len()).collect();
        } else {
            // Each word once, with its final value.
            owners.sort_unstable();
            owners.dedup();
            buckets.sort_unstable();
            buckets.dedup();
        }
        (
            owners.into_iter().map(|s| (s as u64, self.owners[s])).collect(),
            buckets.into_iter().map(|b| (b as u64, self.buckets[b].word())).collect(),
        )
    }
}

/// Where the table lives.
enum Tables {
    Cuda(CudaTables),
    Host(HostTables),
}

struct CudaTables {
    device: CudaDevice,
    owners: CudaBuffer,
    buckets: CudaBuffer,
    used: CudaBuffer,
    arena: u64,
    /// The table's `gpumap_table` struct itself, for kernels of one's own that take a pointer.
    params: CudaBuffer,
    kernels: Arc<RowKernels>,
    /// The stream publications are written on (and waited for, before a reader's ticket).
    stream: Stream,
    /// Positions then values of a publication's words, read by the write kernel in place.
    staging: Mutex<PinnedBuffer>,
}

struct HostTables {
    owners: Box<[AtomicU64]>,
    buckets: Box<[AtomicU64]>,
    used: Box<[AtomicU8]>,
}

/// The directory of one cache (see the module docs).
pub(crate) struct Directory {
    catalog: Arc<Catalog>,
    geometry: Geometry,
    slots: usize,
    bits: u32,
    mirror: Mutex<Mirror>,
    tables: Tables,
    /// The catalog's retirements at the last harvest of the used marks.
    harvested_at: AtomicU64,
}

/// A reader's hold on the directory: while it lives, no slot it could find is reused.
pub(crate) struct Lookups<'a> {
    directory: &'a Directory,
    ticket: u64,
}

impl Lookups<'_> {
    /// The hold's ticket, for a hold that outlives this borrow: whoever takes it gives it back
    /// with [`Directory::end`].
    pub(crate) fn into_ticket(self) -> u64 {
        std::mem::ManuallyDrop::new(self).ticket
    }
}

impl Drop for Lookups<'_> {
    fn drop(&mut self) {
        self.directory.catalog.end_read(self.ticket);
    }
}

impl Directory {
    /// The directory of a cache of `slots` slots of `geometry`, on `device`, whose slot arena
    /// starts at `arena` (GPU only).
    pub(crate) fn new(
        catalog: Arc<Catalog>,
        geometry: Geometry,
        slots: usize,
        device: &Device,
        arena: Option<u64>,
    ) -> Result<Directory> {
        let buckets = (slots.max(32) * BUCKETS_PER_SLOT).next_power_of_two();
        let bits = buckets.trailing_zeros();
        let tables = match (device, arena) {
            (Device::Cuda(device), Some(arena)) => {
                let mut owners = CudaBuffer::alloc(device, slots * 8)?;
                owners.fill(0xff)?;
                let buckets_buffer = CudaBuffer::zeroed(device, buckets * 8)?;
                Tables::Cuda(CudaTables {
                    device: device.clone(),
                    owners,
                    buckets: buckets_buffer,
                    used: CudaBuffer::zeroed(device, slots.max(1))?,
                    arena,
                    params: CudaBuffer::zeroed(device, std::mem::size_of::<TableParams>())?,
                    kernels: row_kernels(device)?,
                    stream: Stream::new(device)?,
                    staging: Mutex::new(PinnedBuffer::new(device, STAGING)?),
                })
            }
            (Device::Cuda(_), None) => {
                return Err(Error::InvalidArgument("a GPU directory without a slot arena".into()))
            }
            (Device::Host, _) => Tables::Host(HostTables {
                owners: (0..slots).map(|_| AtomicU64::new(EMPTY)).collect(),
                buckets: (0..buckets).map(|_| AtomicU64::new(0)).collect(),
                used: (0..slots).map(|_| AtomicU8::new(0)).collect(),
            }),
        };
        let mut directory = Directory {
            catalog,
            geometry,
            slots,
            bits,
            mirror: Mutex::new(Mirror::new(slots, bits)),
            tables,
            harvested_at: AtomicU64::new(0),
        };
        // The struct never changes: its arrays and sizes are fixed for the cache's life.
        if let Some(params) = directory.params() {
            if let Tables::Cuda(t) = &mut directory.tables {
                t.params.copy_from_host(0, &params.to_ne_bytes())?;
            }
        }
        Ok(directory)
    }

    /// Ends the reader whose hold [`Lookups::into_ticket`] gave up.
    pub(crate) fn end(&self, ticket: u64) {
        self.catalog.end_read(ticket);
    }

    /// Begins a reader: what the books recorded since the last publication is written into the
    /// table (and, on a GPU, finished) before this returns.
    pub(crate) fn begin(&self) -> Result<Lookups<'_>> {
        let (ticket, ()) = self.catalog.begin_read(|changes| {
            if changes.is_empty() {
                return Ok(());
            }
            let mut mirror = self.mirror.lock();
            let (owners, buckets) = mirror.apply(changes);
            let written = self.write(&owners, &buckets);
            mirror.resync |= written.is_err();
            written
        })?;
        Ok(Lookups { directory: self, ticket })
    }

    /// Writes the words of a publication: owners first, so that a bucket found by a lookup
    /// running meanwhile names a slot whose owner is already there.
    fn write(&self, owners: &[(u64, u64)], buckets: &[(u64, u64)]) -> Result<()> {
        match &self.tables {
            Tables::Host(t) => {
                for &(s, v) in owners {
                    t.owners[s as usize].store(v, Ordering::Release);
                }
                for &(b, v) in buckets {
                    t.buckets[b as usize].store(v, Ordering::Release);
                }
                Ok(())
            }
            Tables::Cuda(t) => {
                t.device.bind_to_thread()?;
                for (array, words) in [(&t.owners, owners), (&t.buckets, buckets)] {
                    // In pieces that fit the staging buffer, each waited for before the next
                    // reuses it.
                    for piece in words.chunks(STAGING / 16) {
                        write_words(t, array.ptr(), piece)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// The table as the row kernel takes it (GPU only).
    pub(crate) fn params(&self) -> Option<TableParams> {
        let Tables::Cuda(t) = &self.tables else { return None };
        Some(TableParams {
            owners: t.owners.ptr(),
            buckets: t.buckets.ptr(),
            arena: t.arena,
            used: t.used.ptr(),
            slots: self.slots as u64,
            bucket_mask: (1u64 << self.bits) - 1,
            bucket_bits: self.bits,
            max_probes: MAX_PROBES,
            extent_shift: self.geometry.extent.trailing_zeros(),
            reserved: 0,
        })
    }

    /// Where the table's `gpumap_table` struct is in device memory (GPU only).
    pub(crate) fn params_ptr(&self) -> Option<u64> {
        match &self.tables {
            Tables::Cuda(t) => Some(t.params.ptr()),
            Tables::Host(_) => None,
        }
    }

    /// The GPU's row kernels (GPU only).
    pub(crate) fn kernels(&self) -> Option<&Arc<RowKernels>> {
        match &self.tables {
            Tables::Cuda(t) => Some(&t.kernels),
            Tables::Host(_) => None,
        }
    }

    /// The slot holding `key` as the host's table says (host only): the stand-in for
    /// `gpumap_lookup`, step for step. Marks it used.
    pub(crate) fn lookup(&self, key: u64) -> Option<SlotId> {
        let Tables::Host(t) = &self.tables else { return None };
        let mask = (1u64 << self.bits) - 1;
        let mut b = bucket_of(key, self.bits);
        for _ in 0..MAX_PROBES {
            let v = t.buckets[b as usize].load(Ordering::Acquire);
            if v == 0 {
                return None;
            }
            if v != TOMB {
                let slot = v - 1;
                if (slot as usize) < self.slots
                    && t.owners[slot as usize].load(Ordering::Acquire) == key
                {
                    // Written only when unmarked: threads gathering at once would otherwise
                    // pass the marks' cache lines between their cores a row at a time.
                    let used = &t.used[slot as usize];
                    if used.load(Ordering::Relaxed) == 0 {
                        used.store(1, Ordering::Relaxed);
                    }
                    return SlotId::try_from(slot).ok();
                }
            }
            b = (b + 1) & mask;
        }
        None
    }
}

impl Directory {
    /// The slots lookups found since the last harvest (each lookup that finds a slot marks it
    /// used), with the marks cleared — once an eighth of the slots has been replaced since
    /// the last harvest, or whenever `now`; `None` before then, or when another caller is
    /// harvesting. The books make the slots most recently used, so that rows the GPU finds
    /// often stay: a second chance, as a clock gives it.
    pub(crate) fn harvest_used(&self, now: bool) -> Result<Option<Vec<SlotId>>> {
        let retired = self.catalog.retired();
        let last = self.harvested_at.load(Ordering::Relaxed);
        let due = (self.slots as u64 / 8).max(64);
        if (!now && retired.saturating_sub(last) < due)
            || self
                .harvested_at
                .compare_exchange(last, retired, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return Ok(None);
        }
        let used: Vec<SlotId> = match &self.tables {
            Tables::Host(t) => (0..self.slots)
                .filter(|&s| t.used[s].swap(0, Ordering::Relaxed) != 0)
                .filter_map(|s| SlotId::try_from(s).ok())
                .collect(),
            Tables::Cuda(t) => {
                t.device.bind_to_thread()?;
                let mut marks = vec![0u8; self.slots];
                t.used.copy_to_host(0, &mut marks)?;
                // Marks made between the copy and the clearing are lost: a hint, not a count.
                t.used.view().raw.fill(0)?;
                marks
                    .iter()
                    .enumerate()
                    .filter(|&(_, &m)| m != 0)
                    .filter_map(|(s, _)| SlotId::try_from(s).ok())
                    .collect()
            }
        };
        Ok(Some(used))
    }
}

/// Writes `words` (position, value) into the `u64` array at `array` with the write kernel,
/// through the staging buffer, and waits for it.
fn write_words(t: &CudaTables, array: u64, words: &[(u64, u64)]) -> Result<()> {
    let n = words.len();
    // One publication at a time uses the buffer (under the catalog's lock), and each launch is
    // waited for before the next fills it.
    let mut staging = t.staging.lock();
    let bytes = staging.as_mut_slice();
    for (k, &(position, value)) in words.iter().enumerate() {
        bytes[8 * k..8 * k + 8].copy_from_slice(&position.to_ne_bytes());
        bytes[8 * (n + k)..8 * (n + k) + 8].copy_from_slice(&value.to_ne_bytes());
    }
    let base = bytes.as_ptr() as u64;
    let stream = t.stream.raw().as_handle();
    t.kernels.write_words(stream, array, base, base + 8 * n as u64, n as u64)?;
    stream.synchronize()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gpumap_lookup` over words as published: the slot of `key`, if a probe finds it.
    fn lookup(owners: &[u64], buckets: &[u64], bits: u32, key: u64) -> Option<usize> {
        let mask = (1usize << bits) - 1;
        let mut b = bucket_of(key, bits) as usize;
        for _ in 0..MAX_PROBES {
            match buckets[b] {
                0 => return None,
                TOMB => {}
                v => {
                    let slot = (v - 1) as usize;
                    if owners.get(slot) == Some(&key) {
                        return Some(slot);
                    }
                }
            }
            b = (b + 1) & mask;
        }
        None
    }

    #[test]
    fn churn_keeps_lookups_short_and_the_published_words_true() {
        let (slots, bits) = (64usize, 7u32);
        let mut mirror = Mirror::new(slots, bits);
        // The words as the GPU holds them: only what each publication wrote.
        let mut owners = vec![EMPTY; slots];
        let mut buckets = vec![0u64; 1 << bits];
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut rebuilt = 0;
        for round in 0..2_000 {
            // A round of evictions and loads, as a busy cache makes them (some slots twice).
            let changes: Vec<(SlotId, u64)> = (0..1 + next() % 40)
                .map(|_| {
                    let slot = (next() % slots as u64) as SlotId;
                    let key = if next() % 5 == 0 { EMPTY } else { next() % 100_000 };
                    (slot, key)
                })
                .collect();
            let (o, b) = mirror.apply(&changes);
            if o.len() == slots && b.len() == 1 << bits {
                rebuilt += 1;
            }
            for (p, v) in o {
                owners[p as usize] = v;
            }
            for (p, v) in b {
                buckets[p as usize] = v;
            }
            assert!(mirror.empty >= buckets.len() / 4, "round {round}: {} empty", mirror.empty);
            assert_eq!(buckets.iter().filter(|&&w| w == 0).count(), mirror.empty, "round {round}");
            assert_eq!(owners, mirror.owners, "round {round}");
            // Every key a slot holds is found at that slot (a key held twice: at one of them).
            for (s, &key) in owners.iter().enumerate() {
                if key != EMPTY {
                    let found = lookup(&owners, &buckets, bits, key);
                    assert!(found.is_some_and(|f| owners[f] == key), "round {round}: slot {s}");
                }
            }
            // Keys nowhere are not found.
            assert_eq!(lookup(&owners, &buckets, bits, 200_000 + round), None);
        }
        assert!(rebuilt > 0, "the churn never filled the table with tombstones");
    }
}
