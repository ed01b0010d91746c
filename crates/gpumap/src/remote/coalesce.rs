//! Which of many small ranges of an object go in one request: those that follow one another
//! exactly, up to a request's size. Pure arithmetic, kept apart from the code that makes the
//! requests, so that it is tested alone.
#![forbid(unsafe_code)]

/// Ranges read as one request: `len` bytes at `offset`, which are the `members` (indices into
/// the ranges given to [`coalesce`]) one after another, in that order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) offset: u64,
    pub(crate) len: usize,
    pub(crate) members: Vec<usize>,
}

/// The requests that read `ranges` (`(offset, len)` each): ranges in order of offset, a range
/// joining the run before it where it starts exactly at that run's end and the run stays
/// within `request` bytes. Empty ranges are left out; a range longer than `request` is a run
/// of its own. Every other range is in exactly one run.
pub(crate) fn coalesce(ranges: &[(u64, usize)], request: usize) -> Vec<Run> {
    let mut order: Vec<usize> = (0..ranges.len()).filter(|&i| ranges[i].1 > 0).collect();
    order.sort_by_key(|&i| ranges[i].0);
    let mut runs: Vec<Run> = Vec::new();
    for i in order {
        let (offset, len) = ranges[i];
        if let Some(run) = runs.last_mut() {
            let follows = run.offset.checked_add(run.len as u64) == Some(offset);
            if follows && run.len.checked_add(len).is_some_and(|n| n <= request) {
                run.len += len;
                run.members.push(i);
                continue;
            }
        }
        runs.push(Run { offset, len, members: vec![i] });
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(offset: u64, len: usize, members: &[usize]) -> Run {
        Run { offset, len, members: members.to_vec() }
    }

    #[test]
    fn adjacent_ranges_join_up_to_a_request() {
        // (ranges, request size, the runs expected)
        type Case = (Vec<(u64, usize)>, usize, Vec<Run>);
        let cases: Vec<Case> = vec![
            (vec![], 4096, vec![]),
            // Adjacent, given out of order: one run, members in offset order.
            (vec![(4096, 4096), (0, 4096)], 8192, vec![run(0, 8192, &[1, 0])]),
            // A gap of one byte keeps them apart.
            (vec![(0, 4096), (4097, 10)], 1 << 20, vec![run(0, 4096, &[0]), run(4097, 10, &[1])]),
            // The request size caps a run; the next starts a new one.
            (
                vec![(0, 4096), (4096, 4096), (8192, 4096)],
                8192,
                vec![run(0, 8192, &[0, 1]), run(8192, 4096, &[2])],
            ),
            // A range longer than a request goes alone; empty ones are left out.
            (
                vec![(0, 100), (100, 0), (100, 9000), (9100, 5)],
                4096,
                vec![run(0, 100, &[0]), run(100, 9000, &[2]), run(9100, 5, &[3])],
            ),
            // The same offset twice: not adjacent (the second starts where the first does).
            (vec![(512, 512), (512, 512)], 4096, vec![run(512, 512, &[0]), run(512, 512, &[1])]),
            // At the end of the offsets: no overflow.
            (vec![(u64::MAX - 10, 10)], 4096, vec![run(u64::MAX - 10, 10, &[0])]),
        ];
        for (ranges, request, expected) in cases {
            assert_eq!(coalesce(&ranges, request), expected, "{ranges:?} in requests of {request}");
        }
    }

    proptest! {
        #[test]
        fn every_range_is_read_once_and_runs_are_contiguous(
            ranges in proptest::collection::vec((0u64..64, 0usize..5), 0..40),
            request in 1usize..12,
        ) {
            let ranges: Vec<(u64, usize)> = ranges.into_iter().map(|(o, l)| (o * 2, l)).collect();
            let runs = coalesce(&ranges, request);
            let mut seen = vec![0; ranges.len()];
            for run in &runs {
                prop_assert!(run.len <= request || run.members.len() == 1, "{run:?}");
                let mut at = run.offset;
                for &i in &run.members {
                    seen[i] += 1;
                    prop_assert_eq!(ranges[i].0, at, "{:?} in {:?}", ranges[i], run);
                    at += ranges[i].1 as u64;
                }
                prop_assert_eq!(at, run.offset + run.len as u64);
            }
            for (i, &(_, len)) in ranges.iter().enumerate() {
                prop_assert_eq!(seen[i], usize::from(len > 0), "range {}", i);
            }
        }
    }
}
