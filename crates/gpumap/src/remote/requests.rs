//! The requests of one large read, handed out in order to whichever of its lanes asks next.
//!
//! A lane that owned a fixed share of the read would hold the whole read up whenever its core
//! was busier than the others (the server's processes run on the same cores, or the
//! application's threads do): taking the next request when one of its own finishes, a slow
//! lane takes fewer, and the lanes finish within about one request of each other.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::sync::Mutex;

use crate::error::Result;
use crate::memory::cuda::RawRegion;
use crate::memory::DeviceViewMut;

/// One read's requests: the destination cut into request-sized pieces, each with the object
/// offset it is read from.
pub(crate) enum Requests<'a> {
    /// Into host memory: what is left of the destination, taken from its front.
    Host(Mutex<HostRequests<'a>>),
    /// Into GPU memory.
    Cuda(CudaRequests),
}

impl<'a> Requests<'a> {
    /// The requests of a read of `dst.len()` bytes at `offset`, `size` bytes each (the last
    /// one shorter).
    pub(crate) fn new(dst: DeviceViewMut<'a>, offset: u64, size: usize) -> Requests<'a> {
        let size = size.max(1);
        match dst {
            DeviceViewMut::Host(rest) => {
                Requests::Host(Mutex::new(HostRequests { rest, offset, size }))
            }
            DeviceViewMut::Cuda(view) => Requests::Cuda(CudaRequests {
                dst: view.raw,
                offset,
                size,
                next: AtomicUsize::new(0),
            }),
        }
    }
}

/// The requests of a read into host memory.
pub(crate) struct HostRequests<'a> {
    rest: &'a mut [u8],
    /// The object offset of `rest`'s first byte.
    offset: u64,
    size: usize,
}

impl<'a> HostRequests<'a> {
    /// The next request's object offset and destination, or `None` when all are taken.
    pub(crate) fn take(&mut self) -> Option<(u64, &'a mut [u8])> {
        if self.rest.is_empty() {
            return None;
        }
        let n = self.size.min(self.rest.len());
        let (head, tail) = std::mem::take(&mut self.rest).split_at_mut(n);
        self.rest = tail;
        let at = self.offset;
        self.offset += n as u64;
        Some((at, head))
    }
}

/// The requests of a read into GPU memory: the region, and the index of the next request.
pub(crate) struct CudaRequests {
    dst: RawRegion,
    offset: u64,
    size: usize,
    next: AtomicUsize,
}

impl CudaRequests {
    /// The GPU the read goes to.
    pub(crate) fn ordinal(&self) -> usize {
        self.dst.ordinal
    }

    /// The next request's object offset and destination, or `None` when all are taken.
    pub(crate) fn take(&self) -> Option<Result<(u64, RawRegion)>> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let at = index.checked_mul(self.size).filter(|&at| at < self.dst.len)?;
        let len = self.size.min(self.dst.len - at);
        Some(self.dst.sub(at, len).map(|region| (self.offset + at as u64, region)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_requests_cover_the_destination_once_in_order() {
        for (len, size) in [(0usize, 4usize), (1, 4), (4, 4), (10, 4), (13, 1), (9, 100)] {
            let mut dst = vec![0u8; len];
            let Requests::Host(queue) = Requests::new(DeviceViewMut::Host(&mut dst), 1000, size)
            else {
                panic!("host memory made device requests");
            };
            let mut queue = queue.into_inner();
            let mut seen = Vec::new();
            while let Some((offset, piece)) = queue.take() {
                assert!(!piece.is_empty() && piece.len() <= size);
                piece.fill(1);
                seen.push((offset, piece.len()));
            }
            assert!(queue.take().is_none());
            let want: Vec<(u64, usize)> =
                (0..len).step_by(size).map(|at| (1000 + at as u64, size.min(len - at))).collect();
            assert_eq!(seen, want, "{len} bytes in requests of {size}");
            assert!(dst.iter().all(|&b| b == 1));
        }
    }

    #[test]
    fn device_requests_cover_the_region_once_in_order() {
        for (len, size) in [(0usize, 4usize), (1, 4), (4, 4), (10, 4), (13, 1), (9, 100)] {
            let queue = CudaRequests {
                dst: RawRegion { ptr: 1 << 40, len, ordinal: 3 },
                offset: 7,
                size,
                next: AtomicUsize::new(0),
            };
            let mut seen = Vec::new();
            while let Some(request) = queue.take() {
                let (offset, region) = request.unwrap();
                assert_eq!(region.ordinal, 3);
                assert_eq!(region.ptr - (1 << 40), offset - 7);
                seen.push((offset, region.len));
            }
            let want: Vec<(u64, usize)> =
                (0..len).step_by(size).map(|at| (7 + at as u64, size.min(len - at))).collect();
            assert_eq!(seen, want, "{len} bytes in requests of {size}");
            assert!(queue.take().is_none());
        }
    }

    #[test]
    fn requests_taken_by_many_threads_at_once_cover_the_destination_once() {
        let (len, size) = (100_003usize, 97usize);
        let mut dst = vec![0u8; len];
        let requests = Requests::new(DeviceViewMut::Host(&mut dst), 0, size);
        let Requests::Host(queue) = &requests else { panic!("host memory made device requests") };
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    while let Some((offset, piece)) = queue.lock().take() {
                        for (i, byte) in piece.iter_mut().enumerate() {
                            *byte = byte.wrapping_add((offset as usize + i) as u8 | 1);
                        }
                    }
                });
            }
        });
        // Each byte was written once: by the one thread that took its request.
        assert!(dst.iter().enumerate().all(|(i, &b)| b == (i as u8 | 1)));

        let queue = CudaRequests {
            dst: RawRegion { ptr: 0, len, ordinal: 0 },
            offset: 0,
            size,
            next: AtomicUsize::new(0),
        };
        let taken = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    while let Some(request) = queue.take() {
                        let (offset, region) = request.unwrap();
                        taken.lock().push((offset, region.len));
                    }
                });
            }
        });
        let mut taken = taken.into_inner();
        taken.sort_unstable();
        let want: Vec<(u64, usize)> =
            (0..len).step_by(size).map(|at| (at as u64, size.min(len - at))).collect();
        assert_eq!(taken, want);
    }
}
