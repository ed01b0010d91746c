//! Gathers: many ranges, of any files of a cache, copied into one buffer (or only made
//! resident), in rounds that each pin at most a quarter of each shard's extents. A round plans
//! each shard's rows in one hold of its lock (`plan` classifies them; pins, claims and slots
//! are taken here), reads all the misses together, and finishes each shard's part in one more
//! hold: resident extents are copied from their homes; missing ones are read into pinned
//! buffers (one per group of up to 4 MiB, on the pool) and placed into their slots and the
//! caller's buffer by one kernel launch per group. Extents others are reading are left to the
//! next round; extents of read-only files for which the budget has no room at all are read
//! straight into the caller's buffer and not cached.
#![forbid(unsafe_code)]

use std::ops::Range;
use std::time::Instant;

use crate::sync::MutexGuard;

use super::books::{FileCounters, FileId, Location, SlotId, Unit, Want};
use super::geometry::Geometry;
use super::plan::{plan_rows, RowPlan};
use super::room::{self, Room};
use super::state::{Engine, FileEntry, Shard, State};
use super::store::{Home, HomeReader};
use crate::error::{Error, Result};
use crate::memory::bounce::BouncePool;
use crate::memory::cuda::{CudaDevice, DeviceCopy, RawRegion};
use crate::memory::DeviceViewMut;

/// Staging buffer of a gather group: misses are read into one pinned buffer this large, one
/// pool task, one upload and one launch per group (docs/decisions/0008-gather-groups-4mib.md).
const GATHER_GROUP: usize = 4 << 20;

/// One range of a gather: `len` bytes of `entry` at `offset`.
pub(crate) struct GatherRange<'a> {
    pub(crate) entry: &'a FileEntry,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// A gather's range cut at extent borders: `len` bytes at `at` in extent `e` of range
/// `range`'s file, going to `dst` in the caller's buffer.
#[derive(Debug, Clone, Copy)]
struct Segment {
    range: usize,
    e: u64,
    at: u64,
    len: usize,
    dst: usize,
}

/// Where a round found (or put) an extent.
#[derive(Debug, Clone, Copy)]
enum Place {
    Frame,
    Slot(SlotId),
    /// Nowhere in the cache: read straight into the caller's buffer (a read-only file's
    /// extent for which the budget had no room).
    Through,
}

/// An extent a round reads in, and the segments that want it.
struct Miss {
    range: usize,
    e: u64,
    place: Place,
    /// The first segment that wants it, and any others (rare: two rows of one extent), kept
    /// apart so that a miss costs no allocation under the lock.
    first_segment: usize,
    more_segments: Vec<usize>,
}

impl Miss {
    fn new(seg: Segment, first_segment: usize, place: Place) -> Miss {
        Miss { range: seg.range, e: seg.e, place, first_segment, more_segments: Vec::new() }
    }

    fn segments(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(self.first_segment).chain(self.more_segments.iter().copied())
    }
}

/// What a round adds to each file's counters, summed per file (a gather's rows come from few
/// files) and added to the books in one go.
#[derive(Default)]
struct Tally(Vec<(FileId, FileCounters)>);

impl Tally {
    /// The counters to add to for `file`.
    fn of(&mut self, file: FileId) -> &mut FileCounters {
        let at = match self.0.iter().position(|t| t.0 == file) {
            Some(at) => at,
            None => {
                self.0.push((file, FileCounters::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[at].1
    }

    fn add(&mut self, file: FileId, hits: u64, misses: u64) {
        let c = self.of(file);
        c.hits += hits;
        c.misses += misses;
    }

    fn apply(self, state: &mut MutexGuard<'_, State>) {
        for (file, delta) in self.0 {
            if let Some(c) = state.books.counters_mut(file) {
                c.add(&delta);
            }
        }
    }
}

/// The part of a round one shard planned: its misses and pins.
struct Part {
    shard: usize,
    misses: Range<usize>,
    pins: Range<usize>,
}

/// What one round of a gather does.
#[derive(Default)]
struct Round {
    hits: Vec<(usize, Place)>,
    misses: Vec<Miss>,
    pins: Vec<Unit>,
    parts: Vec<Part>,
    deferred: Vec<usize>,
    /// Read-only files' extents that find no room are read through ([`Place::Through`]).
    through: bool,
    /// Making room failed (a dirty victim's write-back): returned once the round's pins went.
    error: Option<Error>,
    /// A dirty victim was written back to make room: progress, though nothing was copied.
    made_room: bool,
}

/// Copies `ranges`, packed one after another, into `dst` (or, without `dst`, only makes
/// them resident: a batch prefetch). The caller checked the ranges and `dst`'s size.
pub(crate) fn gather(
    engine: &Engine,
    ranges: &[GatherRange<'_>],
    dst: Option<DeviceViewMut<'_>>,
) -> Result<()> {
    gather_to(engine, ranges, None, dst)
}

/// [`gather`], with range `i` going to `dst` at `placed[i]` rather than packed one after
/// another (the rows a row gather's kernel left to the host go to their places among the
/// others). The caller checked that every range fits `dst` where it goes.
pub(crate) fn gather_to(
    engine: &Engine,
    ranges: &[GatherRange<'_>],
    placed: Option<&[u64]>,
    mut dst: Option<DeviceViewMut<'_>>,
) -> Result<()> {
    let g = engine.geometry;
    let mut segments = Vec::new();
    let mut at_dst = 0usize;
    for (i, r) in ranges.iter().enumerate() {
        if let Some(placed) = placed {
            at_dst = placed[i] as usize;
        }
        let mut offset = r.offset;
        let end = r.offset + r.len;
        while offset < end {
            let e = offset / g.extent;
            let next = ((e + 1) * g.extent).min(end);
            let len = (next - offset) as usize;
            segments.push(Segment { range: i, e, at: offset % g.extent, len, dst: at_dst });
            at_dst += len;
            offset = next;
        }
    }
    // Whether the segments go to places in `dst` in their order, none overlapping: then a
    // round's copies into host memory can be cut into runs, each with its own part of `dst`.
    let in_order = segments.windows(2).all(|w| w[0].dst + w[0].len <= w[1].dst);
    // Extents of read-only files for which the budget has no room are read straight into
    // `dst` rather than waited for: nothing can make them differ from the file, and under
    // a budget full of others' pins waiting only adds rounds.
    let through = dst.is_some();
    // A round pins at most a quarter of each shard's extents.
    let n = engine.shards.len();
    let capacity = engine.max_frames / n * g.per_frame() as usize;
    let limit = (capacity / 4).max(1);
    // A round takes what the last one deferred, then fresh rows up to what its shards can pin:
    // a gather far larger than the budget then costs rounds in proportion to its rows, not to
    // their square.
    let per_round = limit.saturating_mul(n);
    let mut fresh = 0..segments.len();
    let mut todo: Vec<usize> = Vec::new();
    let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut since = Instant::now();
    loop {
        todo.extend(fresh.by_ref().take(per_round.saturating_sub(todo.len())));
        if todo.is_empty() {
            break;
        }
        let mut round = Round { through, ..Round::default() };
        for rows in &mut by_shard {
            rows.clear();
        }
        for s in todo {
            let seg = &segments[s];
            by_shard[engine.shard_of_extent(ranges[seg.range].entry.id, seg.e)].push(s);
        }
        for (shard, rows) in by_shard.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let sh = &engine.shards[shard];
            let (misses, pins) = (round.misses.len(), round.pins.len());
            let mut state = sh.state.lock();
            plan_round(engine, sh, &mut state, ranges, &segments, rows, limit, &mut round);
            drop(state);
            round.parts.push(Part {
                shard,
                misses: misses..round.misses.len(),
                pins: pins..round.pins.len(),
            });
        }
        let progress = !round.hits.is_empty() || !round.misses.is_empty() || round.made_room;
        let result = run_round(engine, ranges, &segments, in_order, &round, dst.as_mut());
        for part in &round.parts {
            // Reads and bytes per file, summed before the lock is taken.
            let mut faulted = Tally::default();
            for miss in &round.misses[part.misses.clone()] {
                let entry = ranges[miss.range].entry;
                let c = faulted.of(entry.id);
                c.fault_reads += 1;
                c.bytes_faulted += g.bytes_of(miss.e..miss.e + 1, entry.len).1;
            }
            let sh = &engine.shards[part.shard];
            let mut state = sh.state.lock();
            faulted.apply(&mut state);
            for miss in &round.misses[part.misses.clone()] {
                let ok = result.is_ok();
                match miss.place {
                    Place::Slot(slot) => state.books.finish_slot_load(slot, ok),
                    Place::Frame => {
                        state.books.finish_frame_loads(ranges[miss.range].entry.id, &[miss.e], ok)
                    }
                    Place::Through => {}
                }
            }
            for unit in &round.pins[part.pins.clone()] {
                state.books.unpin(*unit, true);
            }
            drop(state);
            sh.changed.notify_all();
        }
        result?;
        if let Some(e) = round.error {
            return Err(e);
        }
        if progress {
            since = Instant::now();
        } else if let Some(&s) = round.deferred.first() {
            // Nothing could be pinned: others' reads and gathers hold the memory (they
            // end), or views do (waited for, up to the cache's pin wait).
            let seg = &segments[s];
            let sh = &engine.shards[engine.shard_of_extent(ranges[seg.range].entry.id, seg.e)];
            let mut state = sh.state.lock();
            room::wait_or_full(engine, sh, &mut state, g.extent, since)?;
        }
        todo = round.deferred;
    }
    Ok(())
}

/// Carries out one shard's part of a round, pinning what it uses: at most `limit` rows, planned
/// by [`plan_rows`] from where their extents are; extents others are reading, and what does not
/// fit, are deferred — or, in a round that reads through, read-only files' extents that find
/// no room are read through (see [`Place::Through`]).
///
/// Under the lock, a row costs the cache misses of the books it touches (its file's index,
/// a slot, a list node), not instructions; so the round goes in steps, each over all its
/// rows — where the extents are; the plan; pins and claims; room for the misses; their slots
/// — and the misses of one step's rows, independent of each other, overlap.
#[allow(clippy::too_many_arguments)]
fn plan_round(
    engine: &Engine,
    shard: &Shard,
    state: &mut MutexGuard<'_, State>,
    ranges: &[GatherRange<'_>],
    segments: &[Segment],
    todo: &[usize],
    limit: usize,
    round: &mut Round,
) {
    let rows = &todo[..todo.len().min(limit)];
    round.deferred.extend_from_slice(&todo[rows.len()..]);
    let file_of = |s: usize| ranges[segments[s].range].entry.id;
    let keys: Vec<(FileId, u64)> = rows.iter().map(|&s| (file_of(s), segments[s].e)).collect();
    let located: Vec<Location> = keys.iter().map(|&(f, e)| state.books.locate(f, e)).collect();
    let plans = plan_rows(&keys, &located);
    // Row -> its miss in `round.misses` (read into its frame) or in `wanted` (needs a slot).
    let mut miss_of_row = vec![usize::MAX; rows.len()];
    let mut wanted: Vec<Miss> = Vec::new();
    let mut tally = Tally::default();
    for (k, (&s, plan)) in rows.iter().zip(&plans).enumerate() {
        let seg = segments[s];
        let (file, e) = keys[k];
        let frame = Unit::Frame { file, index: engine.geometry.frame_of(e) };
        match *plan {
            RowPlan::HitFrame => {
                state.books.pin(frame, true);
                round.pins.push(frame);
                round.hits.push((s, Place::Frame));
                tally.add(file, 1, 0);
            }
            RowPlan::HitSlot(slot) => {
                state.books.pin(Unit::Slot(slot), true);
                round.pins.push(Unit::Slot(slot));
                round.hits.push((s, Place::Slot(slot)));
                tally.add(file, 1, 0);
            }
            RowPlan::ReadIntoFrame => {
                state.books.pin(frame, true);
                round.pins.push(frame);
                state.books.claim_in_frames(file, e..e + 1);
                miss_of_row[k] = round.misses.len();
                round.misses.push(Miss::new(seg, s, Place::Frame));
                tally.add(file, 0, 1);
            }
            RowPlan::NeedSlot => {
                miss_of_row[k] = wanted.len();
                wanted.push(Miss::new(seg, s, Place::Frame));
            }
            RowPlan::Defer => round.deferred.push(s),
            RowPlan::SameAs(first) => match plans[first] {
                RowPlan::ReadIntoFrame => {
                    round.misses[miss_of_row[first]].more_segments.push(s);
                    tally.add(file, 1, 0);
                }
                _ => wanted[miss_of_row[first]].more_segments.push(s),
            },
        }
    }
    take_slots(engine, shard, state, ranges, wanted, round, &mut tally);
    tally.apply(state);
}

/// Gives each of `wanted` (extents no one holds) a slot, in order, making room: free slots,
/// new slot frames while the budget has room, then the least recently used slots in one
/// sweep (those still retiring counted as coming), and only then, with none retiring, the
/// general way (frames, write-backs), which may let go of the lock — after which the rest is
/// deferred to the next round, which looks again. Where no room can be made, or it waits for
/// slots retiring, the rest is deferred too, or in a round that reads through, read through
/// if its file is read-only.
fn take_slots(
    engine: &Engine,
    shard: &Shard,
    state: &mut MutexGuard<'_, State>,
    ranges: &[GatherRange<'_>],
    wanted: Vec<Miss>,
    round: &mut Round,
    tally: &mut Tally,
) {
    let mut swept = false;
    let mut full = false;
    let mut left = wanted.len();
    let mut wanted = wanted.into_iter();
    while let Some(mut miss) = wanted.next() {
        let file = ranges[miss.range].entry.id;
        let slot = loop {
            if let Some(slot) = state.books.take_slot(file, miss.e) {
                break Some(slot);
            }
            if !state.books.has_room() {
                if !swept {
                    swept = true;
                    // Slots already retiring come free once the lookups that may still see
                    // them end: they count towards what this round needs.
                    let more = left.saturating_sub(state.books.retiring());
                    if more == 0 || state.books.evict_oldest_slots(more) > 0 {
                        continue;
                    }
                }
                // The victims wait for lookups running beside this round (a row gather's):
                // this round is full, and the rest waits for them (or is read through), rather
                // than letting go of a whole slot frame, hot rows and all, the general way.
                if state.books.retiring() > 0 {
                    full = true;
                    break None;
                }
            }
            match room::make_room(engine, shard, state, Want::Slot, true) {
                Ok(Room::Ready) => continue,
                Ok(Room::Released) => {
                    round.made_room = true;
                    break None;
                }
                Ok(Room::Full) => {
                    full = true;
                    break None;
                }
                Err(e) => {
                    round.error = Some(e);
                    break None;
                }
            }
        };
        let Some(slot) = slot else {
            for mut miss in std::iter::once(miss).chain(wanted) {
                let file = ranges[miss.range].entry;
                if full && round.through && !file.writable {
                    miss.place = Place::Through;
                    tally.add(file.id, miss.more_segments.len() as u64, 1);
                    round.misses.push(miss);
                } else {
                    round.deferred.extend(miss.segments());
                }
            }
            return;
        };
        left -= 1;
        round.pins.push(Unit::Slot(slot));
        miss.place = Place::Slot(slot);
        tally.add(file, miss.more_segments.len() as u64, 1);
        round.misses.push(miss);
    }
}

/// Where segment `seg` of a round is in memory (`None`: read through, nowhere).
fn home<'a>(
    engine: &Engine,
    ranges: &[GatherRange<'a>],
    seg: &Segment,
    place: Place,
) -> Option<Home<'a>> {
    match place {
        Place::Frame => Some(Home::Frame(
            &ranges[seg.range].entry.memory,
            seg.e * engine.geometry.extent + seg.at,
        )),
        Place::Slot(slot) => Some(Home::Slot(slot, seg.at)),
        Place::Through => None,
    }
}

/// Reads a round's misses into their homes and copies its segments into `dst`.
fn run_round(
    engine: &Engine,
    ranges: &[GatherRange<'_>],
    segments: &[Segment],
    in_order: bool,
    round: &Round,
    dst: Option<&mut DeviceViewMut<'_>>,
) -> Result<()> {
    let device_dst = match &dst {
        None => Some(None),
        Some(DeviceViewMut::Cuda(v)) => Some(Some(v.raw)),
        Some(DeviceViewMut::Host(_)) => None,
    };
    let t = Instant::now();
    let result = match (engine.store.copier(), device_dst) {
        (Some(_), Some(target)) => run_round_on_device(engine, ranges, segments, round, target),
        _ => run_round_through_host(engine, ranges, segments, in_order, round, dst),
    };
    engine.add_fault_time(t);
    result
}

/// The GPU path: misses read into pinned buffers, a group of up to 4 MiB each on the pool,
/// and placed — into their homes and into `dst` — by one kernel launch per group; resident
/// extents copied from their homes by one more.
fn run_round_on_device(
    engine: &Engine,
    ranges: &[GatherRange<'_>],
    segments: &[Segment],
    round: &Round,
    dst: Option<RawRegion>,
) -> Result<()> {
    let g = engine.geometry;
    let extent = g.extent as usize;
    let copier = engine.store.copier().ok_or_else(|| Error::InvalidArgument("no GPU".into()))?;
    let address = |seg: &Segment, place: Place| -> Result<u64> {
        home(engine, ranges, seg, place)
            .and_then(|home| engine.store.region(home, seg.len))
            .map(|region| region.ptr)
            .ok_or_else(|| Error::InvalidArgument("no address".into()))
    };
    if let Some(first) = round.misses.first() {
        let pool = ranges[first.range].entry.file.pool();
        let device = match engine.store.device() {
            crate::memory::Device::Cuda(d) => d,
            crate::memory::Device::Host => return Err(Error::InvalidArgument("no GPU".into())),
        };
        let bounce = BouncePool::for_device(&device, GATHER_GROUP, 2 * pool.nthreads())?;
        let groups: Vec<&[Miss]> = round.misses.chunks((GATHER_GROUP / extent).max(1)).collect();
        pool.run(groups, |group| {
            // On the pool thread too: its launch is part of the gather's timeline.
            let _range = crate::profiling::Range::new(c"gpumap::cache::gather");
            CudaDevice::bind_to_thread(&device)?;
            let mut buffer = bounce.acquire()?;
            let base = buffer.as_ptr() as u64;
            read_misses(ranges, group, g, &mut buffer[..group.len() * extent])?;
            // (offset in the buffer, destination, length): each miss whole into its home,
            // and its segments into `dst`.
            let mut pieces = Vec::with_capacity(group.len() * 2);
            for (k, miss) in group.iter().enumerate() {
                let at = k * extent;
                if !matches!(miss.place, Place::Through) {
                    let whole =
                        Segment { range: miss.range, e: miss.e, at: 0, len: extent, dst: 0 };
                    pieces.push((at, address(&whole, miss.place)?, extent as u32));
                }
                if let Some(dst) = dst {
                    for s in miss.segments() {
                        let seg = &segments[s];
                        pieces.push((
                            at + seg.at as usize,
                            dst.ptr + seg.dst as u64,
                            seg.len as u32,
                        ));
                    }
                }
            }
            // One packed upload of the group, then one launch places every piece.
            copier.upload_and_scatter(base, group.len() * extent, &pieces)?;
            drop(buffer);
            Ok(group.len())
        })?;
    }
    if let Some(dst) = dst {
        let copies = round
            .hits
            .iter()
            .map(|&(s, place)| {
                let seg = &segments[s];
                Ok(DeviceCopy {
                    src: address(seg, place)?,
                    dst: dst.ptr + seg.dst as u64,
                    len: seg.len as u32,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        copier.copy(&copies)?;
    }
    Ok(())
}

/// Reads the whole extent of each of `group`'s misses into its slot of `slots` (an extent
/// each, in order; past a file's end, zeros), a file's misses together in one
/// [`Backing::read_pieces_at`].
fn read_misses(
    ranges: &[GatherRange<'_>],
    group: &[Miss],
    g: Geometry,
    slots: &mut [u8],
) -> Result<()> {
    let extent = g.extent as usize;
    let mut slots = slots.chunks_mut(extent);
    // Runs of misses of one file: most gathers are over one.
    for run in group.chunk_by(|a, b| std::ptr::eq(ranges[a.range].entry, ranges[b.range].entry)) {
        let entry = ranges[run[0].range].entry;
        let mut wanted = Vec::with_capacity(run.len());
        let mut pieces = Vec::with_capacity(run.len());
        for (miss, slot) in run.iter().zip(slots.by_ref()) {
            let (offset, len) = g.bytes_of(miss.e..miss.e + 1, entry.len);
            let (piece, past_the_end) = slot.split_at_mut(len as usize);
            past_the_end.fill(0);
            wanted.push((offset, len));
            pieces.push((piece, offset));
        }
        let counts = entry.file.read_pieces_at(&mut pieces)?;
        for ((offset, len), got) in wanted.into_iter().zip(counts) {
            entry.file.expect_len(offset, len, got as u64)?;
        }
    }
    Ok(())
}

/// The host path (a host-memory cache, or a host buffer to gather into): misses read into
/// their homes in parallel (those read through into buffers of their own), then every
/// segment copied out: on the pool's threads, a run of segments a task, when there are many
/// going from host memory to host memory (decision 0036). A remote object's misses are read a
/// group at a time, each group's together ([`read_misses`]), and copied home from there: read
/// one a task, they would wait on each other's round trips, and adjacent ones would each be a
/// request.
fn run_round_through_host(
    engine: &Engine,
    ranges: &[GatherRange<'_>],
    segments: &[Segment],
    in_order: bool,
    round: &Round,
    dst: Option<&mut DeviceViewMut<'_>>,
) -> Result<()> {
    let g = engine.geometry;
    let extent = g.extent as usize;
    // One buffer per miss read through (empty for the others), filled on the pool.
    let through: Vec<crate::sync::Mutex<Vec<u8>>> = round
        .misses
        .iter()
        .map(|m| {
            let len = if matches!(m.place, Place::Through) { extent } else { 0 };
            crate::sync::Mutex::new(vec![0u8; len])
        })
        .collect();
    let remote = round.misses.iter().any(|m| ranges[m.range].entry.file.is_remote());
    if let (Some(first), true) = (round.misses.first(), remote) {
        let pool = ranges[first.range].entry.file.pool();
        let per_group = (GATHER_GROUP / extent).max(1);
        let groups = round.misses.chunks(per_group).zip(through.chunks(per_group)).collect();
        pool.run(groups, |(group, through)| {
            let mut read = vec![0u8; group.len() * extent];
            read_misses(ranges, group, g, &mut read)?;
            for ((miss, bytes), whole_extent) in group.iter().zip(through).zip(read.chunks(extent))
            {
                let whole = Segment { range: miss.range, e: miss.e, at: 0, len: 0, dst: 0 };
                match home(engine, ranges, &whole, miss.place) {
                    Some(home) => engine.store.copy_in(home, whole_extent)?,
                    None => bytes.lock().copy_from_slice(whole_extent),
                }
            }
            Ok(group.len())
        })?;
    } else if let Some(first) = round.misses.first() {
        let pool = ranges[first.range].entry.file.pool();
        pool.run(round.misses.iter().zip(&through).collect(), |(miss, bytes)| {
            let entry = ranges[miss.range].entry;
            let (offset, len) = g.bytes_of(miss.e..miss.e + 1, entry.len);
            let whole = Segment { range: miss.range, e: miss.e, at: 0, len: 0, dst: 0 };
            let got = match home(engine, ranges, &whole, miss.place) {
                Some(home) => {
                    engine.store.load(home, &entry.file, offset, len as usize, extent, 0)?
                }
                None => entry.file.read_at(&mut bytes.lock()[..len as usize], offset)?,
            };
            entry.file.expect_len(offset, len, got as u64)?;
            Ok(got)
        })?;
    }
    let Some(dst) = dst else { return Ok(()) };
    let hits = round.hits.iter().map(|&(s, place)| (s, place, None));
    let misses = round
        .misses
        .iter()
        .zip(&through)
        .flat_map(|(m, read)| m.segments().map(move |s| (s, m.place, Some(read))));
    let copies: Vec<SegmentCopy<'_>> = hits.chain(misses).collect();
    match dst {
        DeviceViewMut::Host(out) if in_order && copies_shared(engine, ranges, copies.len()) => {
            copy_out_shared(engine, ranges, segments, copies, out)
        }
        DeviceViewMut::Host(out) => {
            let mut reader = engine.store.pinned_reader();
            copy_out(&mut reader, engine, ranges, segments, &copies, out, 0)
        }
        DeviceViewMut::Cuda(view) => {
            let mut reader = engine.store.pinned_reader();
            let mut bytes = Vec::new();
            for &(s, place, read) in &copies {
                let seg = &segments[s];
                bytes.resize(seg.len, 0);
                copy_one(&mut reader, engine, ranges, seg, place, read, &mut bytes)?;
                view.copy_from_host(seg.dst, &bytes)?;
            }
            Ok(())
        }
    }
}

/// A segment a round copies out: its index, where its extent is, and the buffer it was read
/// into when it was read through.
type SegmentCopy<'a> = (usize, Place, Option<&'a crate::sync::Mutex<Vec<u8>>>);

/// Segments a task of a copy-out shared among the pool's threads takes.
const SEGMENTS_PER_TASK: usize = 2048;

/// Whether a round's `copies` into host memory (of a gather whose segments are in the order of
/// their places) are shared among the pool's threads: many of them, from a cache in host memory
/// (a GPU cache's are copied by the driver, on the thread whose context is current).
fn copies_shared(engine: &Engine, ranges: &[GatherRange<'_>], copies: usize) -> bool {
    copies > SEGMENTS_PER_TASK
        && engine.store.in_host_memory()
        && ranges.first().is_some_and(|r| r.entry.file.pool().nthreads() > 1)
}

/// Copies `copies` out on the pool's threads: the segments cut into runs of
/// [`SEGMENTS_PER_TASK`], each run's copies by one task into its own part of `out`, each task
/// with a reader of its own.
fn copy_out_shared(
    engine: &Engine,
    ranges: &[GatherRange<'_>],
    segments: &[Segment],
    copies: Vec<SegmentCopy<'_>>,
    out: &mut [u8],
) -> Result<()> {
    let runs = segments.len().div_ceil(SEGMENTS_PER_TASK);
    let mut by_run: Vec<Vec<SegmentCopy<'_>>> = vec![Vec::new(); runs];
    for copy in copies {
        by_run[copy.0 / SEGMENTS_PER_TASK].push(copy);
    }
    // Run k's part of `out` starts where its first segment goes; the segments are in order.
    let mut parts = Vec::with_capacity(runs);
    let mut rest = out;
    let mut at = 0;
    for (k, copies) in by_run.into_iter().enumerate() {
        let end = segments.get((k + 1) * SEGMENTS_PER_TASK).map_or(at + rest.len(), |s| s.dst);
        let (part, tail) = rest.split_at_mut(end.saturating_sub(at).min(rest.len()));
        if !copies.is_empty() {
            parts.push((copies, part, at));
        }
        (rest, at) = (tail, end);
    }
    let pool = ranges
        .first()
        .map(|r| r.entry.file.pool())
        .ok_or_else(|| Error::InvalidArgument("a gather's copies with no range".to_owned()))?;
    pool.run(parts, |(copies, part, at)| {
        let mut reader = engine.store.pinned_reader();
        copy_out(&mut reader, engine, ranges, segments, &copies, part, at)?;
        Ok(0)
    })?;
    Ok(())
}

/// Copies `copies` into `out`, which is the destination from byte `at` on.
fn copy_out(
    reader: &mut HomeReader<'_>,
    engine: &Engine,
    ranges: &[GatherRange<'_>],
    segments: &[Segment],
    copies: &[SegmentCopy<'_>],
    out: &mut [u8],
    at: usize,
) -> Result<()> {
    let available = (at + out.len()) as u64;
    for &(s, place, read) in copies {
        let seg = &segments[s];
        let needed = (seg.dst + seg.len) as u64;
        let to = seg.dst.checked_sub(at).and_then(|from| out.get_mut(from..from + seg.len));
        let to = to.ok_or(Error::BufferTooSmall { needed, available })?;
        copy_one(reader, engine, ranges, seg, place, read, to)?;
    }
    Ok(())
}

/// Copies segment `seg` from its home, or from the buffer it was read through into, to `out`.
fn copy_one(
    reader: &mut HomeReader<'_>,
    engine: &Engine,
    ranges: &[GatherRange<'_>],
    seg: &Segment,
    place: Place,
    read: Option<&crate::sync::Mutex<Vec<u8>>>,
    out: &mut [u8],
) -> Result<()> {
    match (home(engine, ranges, seg, place), read) {
        (Some(home), _) => reader.copy_out(home, out),
        (None, Some(read)) => {
            let at = seg.at as usize;
            let read = read.lock();
            let bytes = read.get(at..at + seg.len).ok_or_else(|| {
                Error::InvalidArgument("a segment past the extent read through".to_owned())
            })?;
            out.copy_from_slice(bytes);
            Ok(())
        }
        (None, None) => Err(Error::InvalidArgument("a hit with no home".into())),
    }
}
