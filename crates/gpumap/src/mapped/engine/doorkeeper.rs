//! The doorkeeper of admissions into a full cache: an extent read past the cache is admitted
//! only on its second miss within the time the cache takes to turn over once (TinyLFU's
//! doorkeeper). Admitting a full cache's every miss costs an eviction and a second read of the
//! extent each; where misses are spread over far more extents than the budget holds, almost
//! none of those extents is asked for again before it is evicted, so that work buys nothing
//! and slows the gathers it runs beside. Rows asked for often miss again soon and get in.
//!
//! The extents missed once are bits in an array indexed by a hash of the key, in two
//! generations: once as many misses as the cache has slots were recorded into the current one,
//! the older is cleared and becomes the current. A miss is thus remembered for one window at
//! least and two at most. A bit set by another key lets an extent in on its first miss (rarely:
//! a generation has at most one bit in eight set), never keeps one out. Lock-free, so every
//! gather records its misses whether or not it admits.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The Fibonacci multiplier: spreads keys that differ in their low bits (extents of one file)
/// over the whole array.
const HASH_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// Bits per slot in a generation: with a window of one miss per slot, at most one bit in eight
/// is set, which bounds the first misses let in by another key's bit.
const BITS_PER_SLOT: usize = 8;

/// Bounds on a generation: 512 bytes at least, 8 MiB at most (a budget of 8 Mi slots and more
/// shares bits, and lets more first misses in).
const MIN_BITS: usize = 1 << 12;
const MAX_BITS: usize = 1 << 26;

/// The extents missed once lately (see the module docs).
pub(crate) struct Doorkeeper {
    generations: [Box<[AtomicU64]>; 2],
    /// Which generation records (0 or 1).
    current: AtomicUsize,
    /// `64 - log2(bits)`: a hash's top bits index a generation.
    shift: u32,
    /// Misses recorded into a generation before the next takes over.
    window: u64,
    recorded: AtomicU64,
}

impl Doorkeeper {
    /// The doorkeeper of a cache of `slots` slots.
    pub(crate) fn new(slots: usize) -> Doorkeeper {
        let bits =
            slots.saturating_mul(BITS_PER_SLOT).next_power_of_two().clamp(MIN_BITS, MAX_BITS);
        let generation = || (0..bits / 64).map(|_| AtomicU64::new(0)).collect();
        Doorkeeper {
            generations: [generation(), generation()],
            current: AtomicUsize::new(0),
            shift: 64 - bits.trailing_zeros(),
            window: (slots.min(bits / BITS_PER_SLOT) as u64).max(1),
            recorded: AtomicU64::new(0),
        }
    }

    /// Records a miss of the extent keyed `key`; whether it missed before within the last
    /// window or two (or another key's bit says so).
    pub(crate) fn missed_again(&self, key: u64) -> bool {
        let bit = key.wrapping_mul(HASH_MULTIPLIER) >> self.shift;
        let (word, mask) = ((bit / 64) as usize, 1u64 << (bit % 64));
        let current = self.current.load(Ordering::Relaxed) & 1;
        if self.generations[current ^ 1][word].load(Ordering::Relaxed) & mask != 0 {
            return true;
        }
        if self.generations[current][word].fetch_or(mask, Ordering::Relaxed) & mask != 0 {
            return true;
        }
        if self.recorded.fetch_add(1, Ordering::Relaxed) + 1 == self.window {
            self.next_generation(current);
        }
        false
    }

    /// Clears the older generation and makes it the current one (`current` was). Threads
    /// recording meanwhile may set a bit in either, or count a miss into the new window:
    /// either only moves when one extent gets in.
    fn next_generation(&self, current: usize) {
        for word in self.generations[current ^ 1].iter() {
            word.store(0, Ordering::Relaxed);
        }
        self.current.store(current ^ 1, Ordering::Relaxed);
        self.recorded.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn sizes_follow_the_slots_within_bounds() {
        for (slots, bits, window) in [
            (0, MIN_BITS, 1),
            (1, MIN_BITS, 1),
            (512, MIN_BITS, 512),
            (1000, 8192, 1000),
            (1 << 20, 1 << 23, 1 << 20),
            (1 << 24, MAX_BITS, (MAX_BITS / BITS_PER_SLOT) as u64),
        ] {
            let d = Doorkeeper::new(slots);
            assert_eq!(d.generations[0].len() * 64, bits, "{slots} slots");
            assert_eq!(d.generations[1].len() * 64, bits, "{slots} slots");
            assert_eq!(1usize << (64 - d.shift), bits, "{slots} slots");
            assert_eq!(d.window, window, "{slots} slots");
        }
    }

    /// Records first misses of new keys from `next` on until `n` were recorded.
    fn record_others(d: &Doorkeeper, next: &mut u64, n: usize) {
        let mut recorded = 0;
        while recorded < n {
            if !d.missed_again(*next) {
                recorded += 1;
            }
            *next += 1;
        }
    }

    #[test]
    fn a_second_miss_passes_for_one_window_at_least_and_two_at_most() {
        let d = Doorkeeper::new(512);
        let mut next = 1000;
        assert!(!d.missed_again(7));
        assert!(d.missed_again(7));
        assert!(d.missed_again(7), "a third miss passes too");
        // The window fills (the 7 counted once): a new generation records; the 7 is still
        // remembered in the older one, and recorded misses count from 0 again.
        record_others(&d, &mut next, 511);
        assert_eq!(d.current.load(Ordering::Relaxed), 1);
        assert_eq!(d.recorded.load(Ordering::Relaxed), 0);
        assert!(d.missed_again(7), "remembered a window on");
        // The next window clears the generation that held it.
        record_others(&d, &mut next, 512);
        assert_eq!(d.current.load(Ordering::Relaxed), 0);
        assert!(!d.missed_again(7), "forgotten two windows on");
        // Recorded just before a new generation: still remembered a whole window on.
        record_others(&d, &mut next, 510);
        assert!(!d.missed_again(8));
        record_others(&d, &mut next, 511);
        assert!(d.missed_again(8));
    }

    proptest! {
        /// Within a window, no key missed before is kept out; and of keys never missed, few
        /// get in on their first miss (their bit set by another key: at most one bit in
        /// eight is set, so well under a fifth of them, on average one in sixteen).
        #[test]
        fn seconds_always_pass_and_firsts_rarely(
            slots in 64usize..5000,
            seed in any::<u64>(),
        ) {
            let d = Doorkeeper::new(slots);
            // Extents of one file far apart (splitmix64 of the seed's sequence), as random
            // gathers of a large file miss them.
            let key = |i: u64| {
                let mut z = seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                (z ^ (z >> 31)) >> 24
            };
            let n = d.window - 1;
            let mut let_in = 0;
            for i in 0..n {
                if d.missed_again(key(i)) {
                    let_in += 1;
                }
            }
            prop_assert!(let_in * 5 <= n, "{let_in} of {n} first misses let in");
            for i in 0..n {
                prop_assert!(d.missed_again(key(i)), "key {i} kept out on its second miss");
            }
        }
    }
}
