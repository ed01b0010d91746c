//! A cache's sizes from its options: the default frame and shard count for a budget, the checks
//! every size must pass, and the sizes of a cache made for one file. Pure but for asking the
//! device its allocation granularity and capacity.
#![forbid(unsafe_code)]

use std::time::Duration;

use super::engine::{EngineConfig, Geometry};
use crate::align::PAGE_SIZE;
use crate::error::{Error, Result};
use crate::memory::cuda::VaRange;
use crate::memory::Device;

/// The smallest default frame: mapping one costs the same driver time whatever its size, and
/// small budgets still need several frames (docs/decisions/0001-frames-by-budget.md).
pub(crate) const DEFAULT_FRAME: u64 = 8 << 20;

/// The largest default frame.
const MAX_DEFAULT_FRAME: u64 = 64 << 20;

/// The default frame size aims at this many frames per budget.
const FRAMES_PER_BUDGET: u64 = 32;

/// Default extent: 64 KiB reads are efficient for clustered access; random access to small
/// records wants 4 KiB.
pub(crate) const DEFAULT_EXTENT: u64 = 64 << 10;

/// How long a request waits for views to unpin memory, by default.
pub(crate) const DEFAULT_PIN_WAIT: Duration = Duration::from_secs(2);

/// The largest frame accepted: beyond it eviction is too coarse to be useful.
const MAX_FRAME: u64 = 1 << 30;

/// Allocation granularity of the host backend: the GPUs', so that both keep the same books.
pub(crate) const HOST_GRANULARITY: u64 = 2 << 20;

/// The largest budget a cache made for one file gets by default.
const MAX_FILE_BUDGET: u64 = 4 << 30;

/// The default frame for `budget`: a thirty-second of it as a power of two, from 8 to 64 MiB.
/// Every frame costs the same driver calls whatever its size, so a walk wants large frames,
/// and 32 of them still leave 16 shards two each (docs/decisions/0001-frames-by-budget.md).
pub(crate) fn default_frame(budget: u64, granularity: u64) -> u64 {
    let share = budget / FRAMES_PER_BUDGET;
    let power = if share == 0 { 0 } else { 1u64 << share.ilog2() };
    power.clamp(DEFAULT_FRAME, MAX_DEFAULT_FRAME).next_multiple_of(granularity.max(1))
}

/// The default number of shards for a budget of `max_frames` frames: one under 8 frames (exact
/// LRU across the cache), else the most, up to 16, that divide the frames with at least two
/// each (docs/decisions/0003-books-in-shards.md).
pub(crate) fn default_shards(max_frames: usize) -> usize {
    if max_frames < 8 {
        return 1;
    }
    let mut shards = 16;
    while shards > 1 && (!max_frames.is_multiple_of(shards) || max_frames / shards < 2) {
        shards /= 2;
    }
    shards
}

/// The sizes a cache's options ask for, before they are checked.
#[derive(Debug, Clone)]
pub(crate) struct Requested {
    pub(crate) budget: u64,
    pub(crate) extent: u64,
    pub(crate) frame: Option<u64>,
    pub(crate) memory: Option<Device>,
    pub(crate) pin_wait: Duration,
    pub(crate) shards: Option<usize>,
    /// Set by [`Requested::for_file`] until a budget is given: the budget is then this length
    /// in whole frames of whatever frame size is finally chosen.
    pub(crate) file_len: Option<u64>,
}

impl Requested {
    /// The defaults: 1 GiB, 64 KiB extents, frames and shards by budget, GPU 0 where there is
    /// one.
    pub(crate) fn new() -> Requested {
        Requested {
            budget: 1 << 30,
            extent: DEFAULT_EXTENT,
            frame: None,
            memory: None,
            pin_wait: DEFAULT_PIN_WAIT,
            shards: None,
            file_len: None,
        }
    }

    /// The sizes of a cache made for one file of `len` bytes: a budget of the whole file up to
    /// 4 GiB, in whole frames of the default size for it.
    pub(crate) fn for_file(len: u64) -> Requested {
        let len = len.clamp(1, MAX_FILE_BUDGET);
        let frame = default_frame(len, HOST_GRANULARITY);
        Requested { budget: len.next_multiple_of(frame), file_len: Some(len), ..Requested::new() }
    }

    /// Checks every size against the others and the device, and fills in the defaults.
    pub(crate) fn resolve(&self) -> Result<EngineConfig> {
        let device = self.memory.clone().unwrap_or_else(Device::auto);
        let (granularity, capacity) = match &device {
            Device::Cuda(d) => (VaRange::granularity(d)? as u64, d.total_memory() as u64),
            Device::Host => (HOST_GRANULARITY, crate::memory::host::physical_memory()),
        };
        let sized_by = self.file_len.unwrap_or(self.budget);
        let frame = self.frame.unwrap_or(default_frame(sized_by, granularity));
        if frame == 0 || !frame.is_multiple_of(granularity) || frame > MAX_FRAME {
            return Err(Error::InvalidArgument(format!(
                "frame size {frame}: expected a multiple of the allocation granularity \
                 {granularity} up to {MAX_FRAME}"
            )));
        }
        let extent = self.extent;
        if !extent.is_power_of_two() || extent < PAGE_SIZE || extent > frame {
            return Err(Error::InvalidArgument(format!(
                "extent size {extent}: expected a power of two from {PAGE_SIZE} to the frame \
                 size {frame}"
            )));
        }
        let budget = match self.file_len {
            Some(len) => len.next_multiple_of(frame),
            None => self.budget,
        };
        if budget < frame {
            return Err(Error::InvalidArgument(format!(
                "budget {budget} is less than one frame of {frame} bytes"
            )));
        }
        if budget > capacity {
            return Err(Error::InvalidArgument(format!(
                "budget {budget} exceeds the {capacity} bytes of {}",
                device.describe()
            )));
        }
        let max_frames = (budget / frame) as usize;
        let shards = match self.shards {
            None => default_shards(max_frames),
            Some(n)
                if n.is_power_of_two() && max_frames.is_multiple_of(n) && max_frames / n >= 2 =>
            {
                n
            }
            Some(1) => 1,
            Some(n) => {
                return Err(Error::InvalidArgument(format!(
                    "{n} shards for a budget of {max_frames} frames: expected 1, or a power of \
                     two dividing the frames with at least two frames each"
                )))
            }
        };
        Ok(EngineConfig {
            device,
            geometry: Geometry { extent, frame },
            max_frames,
            shards,
            pin_wait: self.pin_wait,
            views_in_frames: self.file_len.is_some_and(|len| len < MAX_FILE_BUDGET),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_frames_grow_with_the_budget_from_8_to_64_mib() {
        const MIB: u64 = 1 << 20;
        let g = HOST_GRANULARITY;
        for (budget, frame) in [
            (0, 8),
            (MIB, 8),
            (64 * MIB, 8),
            (256 * MIB, 8),
            (511 * MIB, 8),
            (512 * MIB, 16),
            (1000 * MIB, 16),
            (1024 * MIB, 32),
            (1536 * MIB, 32),
            (2048 * MIB, 64),
            (80 << 30, 64),
            (u64::MAX, 64),
        ] {
            assert_eq!(default_frame(budget, g), frame * MIB, "budget {budget}");
        }
        // A granularity the frame is not a multiple of rounds it up.
        assert_eq!(default_frame(1 << 30, 24 * MIB), 48 * MIB);
    }

    #[test]
    fn a_cache_for_one_file_holds_it_in_whole_frames() {
        const MIB: u64 = 1 << 20;
        for (len, budget) in [
            (0, 8 * MIB),
            (1, 8 * MIB),
            (8 * MIB, 8 * MIB),
            (9 * MIB, 16 * MIB),
            ((4 << 30) - 1, 4 << 30),
            (5 << 30, 4 << 30),
        ] {
            assert_eq!(Requested::for_file(len).budget, budget, "a file of {len} bytes");
        }
        // A frame size given later keeps the budget at the file in whole frames of that size.
        let mut r = Requested::for_file((1 << 30) + 1);
        r.memory = Some(Device::Host);
        r.frame = Some(16 * MIB);
        let config = r.resolve().unwrap();
        assert_eq!((config.max_frames, config.geometry.frame), (65, 16 * MIB));
        assert!(config.views_in_frames);
        // A budget given later replaces the file's.
        r.budget = 64 * MIB;
        r.file_len = None;
        let config = r.resolve().unwrap();
        assert_eq!(config.max_frames, 4);
        assert!(!config.views_in_frames, "a budget given: single-extent views use slots");
    }
}
