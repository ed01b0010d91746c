//! RemoteFile against servers on 127.0.0.1 only: the same cases against a plain HTTP range
//! server, an S3-compatible responder and a WebHDFS namenode (tests/remote/server.rs), byte for
//! byte against the source bytes, with faults injected (503s, stalls, bodies cut short, wrong ranges, garbage).
#![cfg(feature = "remote")]

mod common;
#[path = "remote/server.rs"]
mod server;

use std::time::{Duration, Instant};

use gpumap::error::{Error, RemoteErrorKind};
use gpumap::io::IoFuture;
use gpumap::memory::{Device, DeviceBuffer};
use gpumap::remote::{RemoteFile, RemoteOptions, MAX_LANES};
use server::{aws_environment, Fault, Server, KEY_ID, SECRET};

/// Which server a case runs against.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Http,
    S3,
    WebHdfs,
}

/// A server of one kind with one object on it, and how to open it.
struct Target {
    kind: Kind,
    server: Server,
    url: String,
    bytes: Vec<u8>,
}

impl Target {
    fn new(kind: Kind, len: usize) -> Target {
        aws_environment();
        let bytes = common::random_bytes(len, len as u64 + 7);
        let (server, path, url) = match kind {
            Kind::Http => {
                let server = Server::http();
                let url = format!("{}/data/object.bin", server.endpoint());
                (server, "/data/object.bin", url)
            }
            Kind::S3 => (
                Server::s3(KEY_ID),
                "/test-bucket/dir/object.bin",
                "s3://test-bucket/dir/object.bin".to_owned(),
            ),
            Kind::WebHdfs => {
                let server = Server::webhdfs();
                let url = format!("{}/webhdfs/v1/data/object.bin", server.endpoint());
                (server, "/webhdfs/v1/data/object.bin", url)
            }
        };
        server.put(path, bytes.clone());
        Target { kind, server, url, bytes }
    }

    /// Options that reach this server, with short waits so that retries and timeouts are quick.
    fn options(&self) -> RemoteOptions {
        let mut options = RemoteOptions::default();
        options.backoff(Duration::from_millis(5), Duration::from_millis(20));
        if let Kind::S3 = self.kind {
            options.s3_endpoint(Some(self.server.endpoint()));
        }
        options
    }

    fn open(&self, options: &RemoteOptions) -> gpumap::Result<RemoteFile> {
        RemoteFile::open_with(&self.url, options)
    }

    /// The URL of an object that is not there.
    fn missing(&self) -> String {
        match self.kind {
            Kind::Http => format!("{}/data/missing.bin", self.server.endpoint()),
            Kind::S3 => "s3://test-bucket/missing.bin".to_owned(),
            Kind::WebHdfs => format!("{}/webhdfs/v1/data/missing.bin", self.server.endpoint()),
        }
    }
}

/// Declares `name::http`, `name::s3` and `name::webhdfs` for each `fn name(kind: Kind)`: one
/// suite for every kind of endpoint.
macro_rules! on_every_server {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn http() {
                super::$name(super::Kind::Http)
            }

            #[test]
            fn s3() {
                super::$name(super::Kind::S3)
            }

            #[test]
            fn webhdfs() {
                super::$name(super::Kind::WebHdfs)
            }
        }
    )*};
}

on_every_server!(
    reads_are_byte_exact_at_odd_sizes_and_offsets,
    a_known_size_skips_the_head_request,
    injected_503s_are_retried_until_the_attempts_run_out,
    statuses_not_configured_are_not_retried,
    a_stalled_server_times_out,
    a_body_cut_short_is_an_error_never_a_short_read,
    wrong_ranges_and_garbage_are_refused,
    an_object_of_another_size_than_opened_fails_the_read,
    missing_objects_are_not_found,
    reads_outside_the_object_are_refused,
    requests_in_flight_are_bounded_and_parallel,
    lanes_keep_their_connections_between_reads_and_close_them_with_the_file,
    one_request_futures_keep_their_loops_connections_and_close_them_with_the_file,
    a_part_that_fails_stops_the_other_lanes,
    small_futures_in_flight_are_not_capped_by_the_io_pool,
    reads_started_at_once_share_the_files_requests_in_flight,
    small_and_large_futures_share_the_files_requests_in_flight,
    concurrent_readers_each_get_their_bytes,
    futures_read_into_owned_buffers,
);

fn reads_are_byte_exact_at_odd_sizes_and_offsets(kind: Kind) {
    let len = (3 << 20) + 4099;
    let target = Target::new(kind, len);
    let mut options = target.options();
    // Small requests, so that every read below spans several and ends mid-request.
    options.request_size(65_537).unwrap();
    let file = target.open(&options).unwrap();
    assert_eq!(file.len(), len as u64);
    for (offset, n) in [
        (0, len),
        (0, 1),
        (1, 4095),
        (4095, 65_537 * 3 + 1),
        (len - 1, 1),
        (12_345, 1 << 20),
        (len - 70_000, 70_000),
        (7, 0),
    ] {
        let mut buf = vec![0xA5u8; n];
        assert_eq!(file.read(&mut buf, offset as u64).unwrap(), n, "{kind:?} {offset}+{n}");
        assert!(buf == target.bytes[offset..offset + n], "{kind:?}: bytes differ at {offset}+{n}");
    }
}

fn a_known_size_skips_the_head_request(kind: Kind) {
    let target = Target::new(kind, 10_000);
    let file = target.open(&target.options()).unwrap();
    assert_eq!((file.len(), target.server.heads()), (10_000, 1));
    let mut options = target.options();
    options.known_len(Some(10_000));
    let file = target.open(&options).unwrap();
    assert_eq!(target.server.heads(), 1, "a known size must not be asked for");
    let mut buf = vec![0u8; 10_000];
    file.read(&mut buf, 0).unwrap();
    assert_eq!(buf, target.bytes);
}

fn injected_503s_are_retried_until_the_attempts_run_out(kind: Kind) {
    let target = Target::new(kind, 50_000);
    let mut options = target.options();
    options.max_attempts(3).unwrap();
    let file = target.open(&options).unwrap();
    // Two 503s, then a good answer: the third attempt succeeds.
    target.server.inject([Fault::Status(503), Fault::Status(503)]);
    let before = target.server.gets();
    let mut buf = vec![0u8; 50_000];
    file.read(&mut buf, 0).unwrap();
    assert_eq!(buf, target.bytes);
    assert_eq!(target.server.gets() - before, 3);
    // Three 503s with three attempts: the error names the URL, the status and the attempts.
    target.server.inject([Fault::Status(503), Fault::Status(503), Fault::Status(503)]);
    let e = file.read(&mut buf, 0).unwrap_err();
    match &e {
        Error::Remote {
            kind: RemoteErrorKind::Status,
            status: Some(503),
            attempts: 3,
            url,
            ..
        } => {
            assert!(target.url.starts_with(url.as_str()), "{url}")
        }
        other => panic!("{kind:?}: {other:?}"),
    }
    let text = e.to_string();
    assert!(text.contains("503") && text.contains("after 3 attempts"), "{text}");
    assert!(!text.contains(SECRET), "{text}");
}

fn statuses_not_configured_are_not_retried(kind: Kind) {
    let target = Target::new(kind, 5_000);
    let mut options = target.options();
    options.retry_status_codes(&[503]).unwrap();
    let file = target.open(&options).unwrap();
    target.server.inject([Fault::Status(500)]);
    let before = target.server.gets();
    let e = file.read(&mut [0u8; 100], 0).unwrap_err();
    assert!(matches!(e, Error::Remote { status: Some(500), attempts: 1, .. }), "{e:?}");
    assert_eq!(target.server.gets() - before, 1);
}

fn a_stalled_server_times_out(kind: Kind) {
    let target = Target::new(kind, 5_000);
    let mut options = target.options();
    options.timeout(Duration::from_millis(300)).unwrap();
    let file = target.open(&options).unwrap();
    target.server.inject([Fault::Stall(Duration::from_secs(5))]);
    let start = Instant::now();
    let e = file.read(&mut [0u8; 100], 0).unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::Timeout, .. }), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
}

fn a_body_cut_short_is_an_error_never_a_short_read(kind: Kind) {
    let target = Target::new(kind, 200_000);
    let mut options = target.options();
    options.max_attempts(1).unwrap();
    let file = target.open(&options).unwrap();
    target.server.inject([Fault::Truncate]);
    let mut buf = vec![0u8; 200_000];
    let e = file.read(&mut buf, 0).unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::Connection, .. }), "{e:?}");
    // With a second attempt, the broken connection is retried and the read completes.
    let mut options = target.options();
    options.max_attempts(2).unwrap();
    let file = target.open(&options).unwrap();
    target.server.inject([Fault::Truncate]);
    file.read(&mut buf, 0).unwrap();
    assert_eq!(buf, target.bytes);
}

fn wrong_ranges_and_garbage_are_refused(kind: Kind) {
    let target = Target::new(kind, 100_000);
    let mut options = target.options();
    options.max_attempts(1).unwrap();
    let file = target.open(&options).unwrap();
    // A datanode's answer carries no range to check: bytes shifted within the right length are
    // beyond any WebHDFS client's sight, so that fault is for the ranged protocols alone.
    let faults = match kind {
        Kind::WebHdfs => vec![Fault::IgnoreRange, Fault::Garbage],
        _ => vec![Fault::WrongRange, Fault::IgnoreRange, Fault::Garbage],
    };
    for fault in faults {
        target.server.inject([fault.clone()]);
        let e = file.read(&mut vec![0u8; 5_000], 10).unwrap_err();
        let Error::Remote { kind: error_kind, .. } = &e else { panic!("{fault:?}: {e:?}") };
        // Bytes that are not HTTP break the connection's parse; a well-formed answer with the
        // wrong bytes is refused as such.
        let wanted = match fault {
            Fault::Garbage => RemoteErrorKind::Connection,
            _ => RemoteErrorKind::BadResponse,
        };
        assert_eq!(*error_kind, wanted, "{fault:?}: {e}");
        if let (Fault::IgnoreRange, Kind::Http | Kind::S3) = (&fault, kind) {
            assert!(e.to_string().contains("the whole object (200 OK)"), "{e}");
        }
    }
}

fn an_object_of_another_size_than_opened_fails_the_read(kind: Kind) {
    let target = Target::new(kind, 20_000);
    let mut options = target.options();
    options.max_attempts(1).unwrap();
    let file = target.open(&options).unwrap();
    let mut wrong_size = target.options();
    wrong_size.known_len(Some(19_000));
    let told_wrong = target.open(&wrong_size).unwrap();
    // Replaced underneath by a longer object whose first bytes are the same.
    let mut grown = target.bytes.clone();
    grown.extend_from_slice(&[7u8; 1000]);
    let path = match kind {
        Kind::Http => "/data/object.bin",
        Kind::S3 => "/test-bucket/dir/object.bin",
        Kind::WebHdfs => "/webhdfs/v1/data/object.bin",
    };
    target.server.put(path, grown);
    for (what, file) in [("replaced", &file), ("nbytes wrong", &told_wrong)] {
        let mut buf = vec![0u8; 4096];
        let read = file.read(&mut buf, 100);
        if let Kind::WebHdfs = kind {
            // A datanode's answer gives no size to check: the bytes asked for are read.
            assert_eq!(read.unwrap(), 4096, "{what}");
            assert!(buf == target.bytes[100..4196], "{what}");
            continue;
        }
        let e = read.unwrap_err();
        assert!(
            matches!(e, Error::Remote { kind: RemoteErrorKind::BadResponse, .. }),
            "{what}: {e:?}"
        );
        assert!(e.to_string().contains("21000 bytes"), "{what}: {e}");
    }
}

fn missing_objects_are_not_found(kind: Kind) {
    let target = Target::new(kind, 10);
    let e = RemoteFile::open_with(&target.missing(), &target.options()).unwrap_err();
    assert!(
        matches!(e, Error::Remote { kind: RemoteErrorKind::NotFound, status: Some(404), .. }),
        "{e:?}"
    );
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    assert!(e.to_string().contains("missing.bin"), "{e}");
}

fn reads_outside_the_object_are_refused(kind: Kind) {
    let target = Target::new(kind, 1000);
    let file = target.open(&target.options()).unwrap();
    let before = target.server.gets();
    let e = file.read(&mut [0u8; 10], 995).unwrap_err();
    assert!(matches!(e, Error::OutOfRange { offset: 995, len: 10, file_len: 1000 }), "{e:?}");
    assert!(matches!(file.read(&mut [0u8; 10], u64::MAX), Err(Error::Overflow { .. })));
    assert_eq!(target.server.gets(), before, "a refused read sends nothing");
}

fn requests_in_flight_are_bounded_and_parallel(kind: Kind) {
    let target = Target::new(kind, 40 * 4096);
    let mut options = target.options();
    options.request_size(4096).unwrap().max_in_flight(Some(4)).unwrap();
    let file = target.open(&options).unwrap();
    target.server.delay_gets(Duration::from_millis(30));
    let mut buf = vec![0u8; 40 * 4096];
    file.read(&mut buf, 0).unwrap();
    assert_eq!(buf, target.bytes);
    let most = target.server.max_active_gets();
    assert!((2..=4).contains(&most), "{kind:?}: {most} GETs at once, wanted 2 to 4");
}

fn lanes_keep_their_connections_between_reads_and_close_them_with_the_file(kind: Kind) {
    let target = Target::new(kind, 96 * 4096 + 123);
    let mut options = target.options();
    options.request_size(4096).unwrap().max_in_flight(Some(4)).unwrap();
    let file = target.open(&options).unwrap();
    let reads = 6;
    for round in 0..reads {
        let mut buf = vec![0u8; target.bytes.len() - round];
        file.read(&mut buf, round as u64).unwrap();
        assert_eq!(buf, target.bytes[round..], "{kind:?}: read {round}");
    }
    // Each lane that read keeps its own connections, at most its share of the four requests
    // in flight; the 582 requests made do not open a connection each.
    let accepted = target.server.accepted();
    assert!(accepted <= 1 + MAX_LANES * 4, "{kind:?}: {accepted} connections for {reads} reads");
    assert!(target.server.open_connections() > 0, "{kind:?}: no connection kept for reuse");
    drop(file);
    expect_connections_closed(&target, kind);
}

fn one_request_futures_keep_their_loops_connections_and_close_them_with_the_file(kind: Kind) {
    // Hundreds of one-request futures at once, in rounds: each request loop serves at most
    // its share of the eight requests in flight, on connections of its own that it keeps, so
    // the rounds open about eight connections in all, not one a read.
    let count = 300;
    let in_flight = 8;
    let target = Target::new(kind, count * 4096);
    let mut options = target.options();
    options.request_size(4096).unwrap().max_in_flight(Some(in_flight)).unwrap();
    let file = target.open(&options).unwrap();
    target.server.delay_gets(Duration::from_millis(1));
    for _ in 0..3 {
        let futures = first_blocks_as_futures(&file, count);
        expect_first_blocks(futures, &target.bytes, kind);
    }
    let most = target.server.max_active_gets();
    assert!((2..=in_flight).contains(&most), "{kind:?}: {most} GETs at once");
    let accepted = target.server.accepted();
    // The open's own connection, each request loop's share, and one each to spare.
    let bound = 1 + 2 * in_flight;
    assert!(accepted <= bound, "{kind:?}: {accepted} connections for {} reads", 3 * count);
    assert!(target.server.open_connections() > 0, "{kind:?}: no connection kept for reuse");
    drop(file);
    expect_connections_closed(&target, kind);
}

/// Waits, 10 s at most, for the server to see every connection closed (its file dropped).
fn expect_connections_closed(target: &Target, kind: Kind) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while target.server.open_connections() > 0 {
        let open = target.server.open_connections();
        assert!(Instant::now() < deadline, "{kind:?}: {open} connections outlived their file");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn a_part_that_fails_stops_the_other_lanes(kind: Kind) {
    let requests = 64;
    let target = Target::new(kind, requests * 4096);
    let mut options = target.options();
    options.request_size(4096).unwrap().max_in_flight(Some(4)).unwrap();
    options.retry_status_codes(&[503]).unwrap();
    let file = target.open(&options).unwrap();
    target.server.delay_gets(Duration::from_millis(20));
    target.server.inject([Fault::Status(500)]);
    let before = target.server.gets();
    let e = file.read(&mut vec![0u8; requests * 4096], 0).unwrap_err();
    assert!(matches!(e, Error::Remote { status: Some(500), .. }), "{kind:?}: {e:?}");
    // Each lane had at most its share of the four requests in flight when the first failed;
    // without the stop, every other lane would have read its whole part (32 requests or more).
    let made = target.server.gets() - before;
    assert!(made <= 16, "{kind:?}: {made} GETs after the first part failed");
}

/// One `pread_device` future into host memory for each of the first `count` 4 KiB blocks.
fn first_blocks_as_futures(
    file: &RemoteFile,
    count: usize,
) -> Vec<IoFuture<(DeviceBuffer, usize)>> {
    (0..count)
        .map(|i| {
            file.pread_device(DeviceBuffer::alloc(&Device::Host, 4096).unwrap(), (i * 4096) as u64)
        })
        .collect()
}

/// Waits for [`first_blocks_as_futures`]' futures, each checked against `bytes`.
fn expect_first_blocks(futures: Vec<IoFuture<(DeviceBuffer, usize)>>, bytes: &[u8], kind: Kind) {
    for (i, future) in futures.into_iter().enumerate() {
        let (buf, n) = future.wait().unwrap();
        assert_eq!(n, 4096);
        assert!(buf.to_vec().unwrap() == bytes[i * 4096..(i + 1) * 4096], "{kind:?}: read {i}");
    }
}

fn small_futures_in_flight_are_not_capped_by_the_io_pool(kind: Kind) {
    // Each small pread is a task of a request loop, not a pool thread blocked on the server:
    // more are in flight at once than the pool has threads.
    let threads = gpumap::io::IoPool::global().unwrap().nthreads();
    let count = 2 * threads + 8;
    let target = Target::new(kind, count * 4096);
    let mut options = target.options();
    options.request_size(4096).unwrap().max_in_flight(Some(count)).unwrap();
    let file = target.open(&options).unwrap();
    target.server.delay_gets(Duration::from_millis(100));
    let futures = first_blocks_as_futures(&file, count);
    expect_first_blocks(futures, &target.bytes, kind);
    let most = target.server.max_active_gets();
    assert!(
        most > threads,
        "{kind:?}: {most} GETs at once with {count} futures and {threads} pool threads"
    );
    // Outside the object: the future's error, and nothing sent.
    let before = target.server.gets();
    let e = file
        .pread_device(DeviceBuffer::alloc(&Device::Host, 10).unwrap(), (count * 4096 - 5) as u64)
        .wait()
        .unwrap_err();
    assert!(matches!(e, Error::OutOfRange { len: 10, .. }), "{e:?}");
    assert_eq!(target.server.gets(), before);
}

fn reads_started_at_once_share_the_files_requests_in_flight(kind: Kind) {
    // Forty one-request futures and a whole read on a clone, started together: never more
    // GETs at once than `max_in_flight`, and a request waiting for its turn is not timed out
    // (together they take longer than one request's timeout).
    let count = 40;
    let target = Target::new(kind, 2 * count * 4096);
    let mut options = target.options();
    options.request_size(4096).unwrap().max_in_flight(Some(3)).unwrap();
    options.timeout(Duration::from_millis(300)).unwrap();
    let file = target.open(&options).unwrap();
    target.server.delay_gets(Duration::from_millis(25));
    let futures = first_blocks_as_futures(&file, count);
    let whole = file.clone();
    let tail = std::thread::spawn(move || {
        let mut buf = vec![0u8; count * 4096];
        whole.read(&mut buf, (count * 4096) as u64).map(|_| buf)
    });
    expect_first_blocks(futures, &target.bytes, kind);
    assert!(tail.join().unwrap().unwrap() == target.bytes[count * 4096..], "{kind:?}: the read");
    let most = target.server.max_active_gets();
    assert!((2..=3).contains(&most), "{kind:?}: {most} GETs at once, wanted 2 to 3");
}

fn small_and_large_futures_share_the_files_requests_in_flight(kind: Kind) {
    // 4 KiB futures run on the small reads' loops and 512 KiB ones on the large reads' own
    // (each one request): started together, never more GETs at once than `max_in_flight`
    // across both, and every byte where it belongs.
    let (small, large, big) = (24, 8, 512 << 10);
    let target = Target::new(kind, large * big);
    let mut options = target.options();
    options.max_in_flight(Some(3)).unwrap();
    let file = target.open(&options).unwrap();
    target.server.delay_gets(Duration::from_millis(20));
    let mut futures = Vec::new();
    for i in 0..small.max(large) {
        if i < large {
            let offset = i * big;
            let dst = DeviceBuffer::alloc(&Device::Host, big).unwrap();
            futures.push((offset, file.pread_device(dst, offset as u64)));
        }
        if i < small {
            let offset = 1000 + i * 9000;
            let dst = DeviceBuffer::alloc(&Device::Host, 4096).unwrap();
            futures.push((offset, file.pread_device(dst, offset as u64)));
        }
    }
    for (offset, future) in futures {
        let (buf, n) = future.wait().unwrap();
        let want = &target.bytes[offset..offset + n];
        assert!(buf.to_vec().unwrap() == want, "{kind:?}: the {n} bytes at {offset}");
    }
    let most = target.server.max_active_gets();
    assert!((2..=3).contains(&most), "{kind:?}: {most} GETs at once, wanted 2 to 3");
}

#[test]
fn thousands_of_futures_of_several_requests_each_complete() {
    // Each future reads four requests, on the I/O pool and shared among the lanes. Waiting
    // for its lanes, a pool thread once ran the pool's other queued reads, each of which then
    // waited for lanes in turn: the stack grew with every queued read until it overflowed.
    let (count, len) = (4000, 16 << 10);
    let target = Target::new(Kind::Http, 64 * len);
    let mut options = target.options();
    options.request_size(4096).unwrap().max_in_flight(Some(8)).unwrap();
    let file = target.open(&options).unwrap();
    let futures: Vec<_> = (0..count)
        .map(|i| {
            let offset = (i % 63) * len + i % 4096;
            (
                offset,
                file.pread_device(DeviceBuffer::alloc(&Device::Host, len).unwrap(), offset as u64),
            )
        })
        .collect();
    for (offset, future) in futures {
        let (buf, n) = future.wait().unwrap();
        assert_eq!(n, len);
        assert!(buf.to_vec().unwrap() == target.bytes[offset..offset + len], "at {offset}");
    }
}

fn concurrent_readers_each_get_their_bytes(kind: Kind) {
    let len = 1 << 20;
    let target = Target::new(kind, len);
    let mut options = target.options();
    options.request_size(10_000).unwrap();
    let file = target.open(&options).unwrap();
    std::thread::scope(|s| {
        for t in 0..8usize {
            let (file, bytes) = (file.clone(), &target.bytes);
            s.spawn(move || {
                let offset = t * 100_003 % (len - 50_000);
                let mut buf = vec![0u8; 50_000];
                file.read(&mut buf, offset as u64).unwrap();
                assert!(buf == bytes[offset..offset + 50_000], "reader {t}");
            });
        }
    });
}

fn futures_read_into_owned_buffers(kind: Kind) {
    let target = Target::new(kind, 300_000);
    let file = target.open(&target.options()).unwrap();
    let futures: Vec<_> = (0..4)
        .map(|i| file.pread_device(DeviceBuffer::alloc(&Device::Host, 50_000).unwrap(), i * 60_000))
        .collect();
    for (i, future) in futures.into_iter().enumerate() {
        let (buf, n) = future.wait().unwrap();
        assert_eq!(n, 50_000);
        assert!(buf.to_vec().unwrap() == target.bytes[i * 60_000..i * 60_000 + 50_000]);
    }
}

#[test]
fn s3_requests_are_signed_with_the_environments_key_and_refused_without_it() {
    aws_environment();
    // A server that wants another key id refuses this process's credentials: 403, typed, and
    // the secret is nowhere in the message.
    let server = Server::s3("SOMEOTHERKEYID");
    server.put("/test-bucket/k.bin", vec![1; 10]);
    let mut options = RemoteOptions::default();
    options.s3_endpoint(Some(server.endpoint()));
    let e = RemoteFile::open_with("s3://test-bucket/k.bin", &options).unwrap_err();
    assert!(
        matches!(e, Error::Remote { kind: RemoteErrorKind::AccessDenied, status: Some(403), .. }),
        "{e:?}"
    );
    let text = gpumap::error::Report(&e).to_string();
    assert!(!text.contains(SECRET), "{text}");
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    // open_s3 names the same object by bucket and key.
    let server = Server::s3(KEY_ID);
    server.put("/test-bucket/k.bin", vec![1; 10]);
    options.s3_endpoint(Some(server.endpoint()));
    let file = RemoteFile::open_s3("test-bucket", "k.bin", &options).unwrap();
    assert_eq!(file.len(), 10);
}

#[test]
fn presigned_urls_keep_their_query_and_never_show_it() {
    let server = Server::http();
    server.put("/bucket/key.bin", vec![3; 4000]);
    let url = format!(
        "{}/bucket/key.bin?X-Amz-Credential=AKIAX&X-Amz-Signature=s3cr3tsig",
        server.endpoint()
    );
    let file = RemoteFile::open(&url).unwrap();
    // Its size came from a GET of one byte: a presigned URL is signed for GET alone.
    assert_eq!((file.len(), server.heads(), server.gets()), (4000, 0, 1));
    let mut buf = vec![0u8; 3999];
    file.read(&mut buf, 1).unwrap();
    assert!(buf.iter().all(|&b| b == 3));
    assert!(!file.url().to_string().contains("s3cr3tsig"));
    let missing = url.replace("key.bin", "nope.bin");
    let e = RemoteFile::open(&missing).unwrap_err();
    let text = gpumap::error::Report(&e).to_string();
    assert!(
        text.contains("nope.bin") && !text.contains("s3cr3tsig") && !text.contains("AKIAX"),
        "{text}"
    );
}

#[test]
fn hostile_urls_are_refused_before_any_request() {
    let server = Server::http();
    for url in [
        "ftp://127.0.0.1/x".to_owned(),
        "file:///etc/passwd".to_owned(),
        format!("{}/a\r\nX-Injected: 1", server.endpoint()),
        format!("http://user:pw@{}/x", server.endpoint().trim_start_matches("http://")),
        "s3://UPPER/key".to_owned(),
        "s3://bucket".to_owned(),
        format!("{}/{}", server.endpoint(), "a".repeat(gpumap::remote::MAX_URL_LEN)),
    ] {
        let e = RemoteFile::open(&url).unwrap_err();
        assert!(
            matches!(e, Error::Remote { kind: RemoteErrorKind::InvalidUrl, .. }),
            "{url:.80}: {e:?}"
        );
        assert!(!e.to_string().contains("pw@"), "{e}");
    }
    assert_eq!(server.heads() + server.gets(), 0);
}

#[test]
fn a_server_that_is_gone_fails_fast_with_a_connection_error() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut options = RemoteOptions::default();
    options.max_attempts(2).unwrap().backoff(Duration::from_millis(5), Duration::from_millis(5));
    let start = Instant::now();
    let e = RemoteFile::open_with(&format!("http://127.0.0.1:{port}/x"), &options).unwrap_err();
    assert!(
        matches!(e, Error::Remote { kind: RemoteErrorKind::Connection, attempts: 2, .. }),
        "{e:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn reads_land_in_gpu_memory_through_bounce_buffers() {
    let Some(device) = common::gpu() else { return };
    for kind in [Kind::Http, Kind::S3] {
        let len = (9 << 20) + 333;
        let target = Target::new(kind, len);
        let mut options = target.options();
        options.request_size((1 << 20) + 1).unwrap();
        let file = target.open(&options).unwrap();
        let mut dst = DeviceBuffer::zeroed(&Device::Cuda(device.clone()), len - 10).unwrap();
        assert_eq!(file.read_device(dst.view_mut(), 10).unwrap(), len - 10);
        assert!(dst.to_vec().unwrap() == target.bytes[10..], "{kind:?}");
        let (dst, n) = file.pread_device(dst, 0).wait().unwrap();
        assert_eq!(n, len - 10);
        assert!(dst.to_vec().unwrap() == target.bytes[..len - 10], "{kind:?}");
    }
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn bodies_cut_short_are_retried_whole_into_gpu_memory() {
    let Some(device) = common::gpu() else { return };
    for kind in [Kind::Http, Kind::S3] {
        let len = (12 << 20) + 12_345;
        let target = Target::new(kind, len);
        let mut options = target.options();
        // A cut body sends half its 4 MiB, then the connection closes.
        options.request_size(4 << 20).unwrap().max_attempts(3).unwrap();
        let file = target.open(&options).unwrap();
        let gpu = Device::Cuda(device.clone());
        let mut dst = DeviceBuffer::zeroed(&gpu, len - 7).unwrap();
        target.server.inject([Fault::Truncate, Fault::Truncate]);
        let before = target.server.gets();
        assert_eq!(file.read_device(dst.view_mut(), 7).unwrap(), len - 7);
        assert!(dst.to_vec().unwrap() == target.bytes[7..], "{kind:?}");
        assert_eq!(target.server.gets() - before, 4 + 2, "{kind:?}: four requests, two retried");
        // With no attempt left, a cut body fails the read: nothing is reported as read.
        let mut options = target.options();
        options.request_size(4 << 20).unwrap().max_attempts(1).unwrap();
        let file = target.open(&options).unwrap();
        target.server.inject([Fault::Truncate]);
        let e = file.read_device(dst.view_mut(), 0).unwrap_err();
        assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::Connection, .. }), "{e:?}");
    }
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn small_futures_into_gpu_memory_take_turns_within_the_files_bound() {
    let Some(device) = common::gpu() else { return };
    let gpu = Device::Cuda(device.clone());
    for kind in [Kind::Http, Kind::S3] {
        let len = (12 << 20) + 777;
        let target = Target::new(kind, len);
        let mut options = target.options();
        // One request up to 8 MiB: a 6 MiB read is one request larger than a bounce buffer,
        // so its body lands in memory of its own.
        options.request_size(8 << 20).unwrap().max_in_flight(Some(4)).unwrap();
        let file = target.open(&options).unwrap();
        target.server.delay_gets(Duration::from_millis(5));
        let reads: Vec<(usize, usize)> = (0..60usize)
            .map(|i| (i * 200_003 % (len - 70_000), 1 + i * 1_117 % 65_536))
            .chain([(3, 6 << 20), (len - 1, 1), (5 << 20, 1 << 20)])
            .collect();
        let futures: Vec<_> = reads
            .iter()
            .map(|&(at, n)| file.pread_device(DeviceBuffer::zeroed(&gpu, n).unwrap(), at as u64))
            .collect();
        for (future, &(at, n)) in futures.into_iter().zip(&reads) {
            let (buf, got) = future.wait().unwrap();
            assert_eq!(got, n);
            assert!(buf.to_vec().unwrap() == target.bytes[at..at + n], "{kind:?}: {n} at {at}");
        }
        let most = target.server.max_active_gets();
        assert!((2..=4).contains(&most), "{kind:?}: {most} GETs at once, wanted 2 to 4");
        // A refused request fails its future: nothing is reported as read.
        target.server.inject([Fault::Status(403)]);
        let e = file.pread_device(DeviceBuffer::zeroed(&gpu, 5000).unwrap(), 100).wait();
        assert!(
            matches!(e, Err(Error::Remote { kind: RemoteErrorKind::AccessDenied, .. })),
            "{kind:?}: {:?}",
            e.map(|(_, n)| n)
        );
    }
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn bodies_that_find_no_free_bounce_buffer_still_land_exactly() {
    let Some(device) = common::gpu() else { return };
    let len = (21 << 20) + 4097;
    let target = Target::new(Kind::Http, len);
    // Ranges larger than a bounce buffer land in memory of their own.
    let mut options = target.options();
    options.request_size((5 << 20) + 3).unwrap();
    let file = target.open(&options).unwrap();
    let mut dst = DeviceBuffer::zeroed(&Device::Cuda(device.clone()), len).unwrap();
    assert_eq!(file.read_device(dst.view_mut(), 0).unwrap(), len);
    assert!(dst.to_vec().unwrap() == target.bytes, "ranges larger than a buffer");
    // Readers at once with many small ranges in flight each: more bodies than the pool has
    // buffers, so some land in buffers and the rest in memory of their own, none waiting.
    // Each reader opens the object itself: the requests in flight are bounded per file.
    let mut options = target.options();
    options.request_size((256 << 10) + 1).unwrap().max_in_flight(Some(64)).unwrap();
    std::thread::scope(|scope| {
        for reader in 0..4usize {
            let (target, options, device, want) = (&target, &options, &device, &target.bytes);
            scope.spawn(move || {
                let file = target.open(options).unwrap();
                let offset = reader * 4099;
                let mut dst =
                    DeviceBuffer::zeroed(&Device::Cuda(device.clone()), len - offset).unwrap();
                assert_eq!(file.read_device(dst.view_mut(), offset as u64).unwrap(), len - offset);
                assert!(dst.to_vec().unwrap() == want[offset..], "reader {reader}");
            });
        }
    });
}

#[test]
fn webhdfs_urls_keep_their_query_follow_the_redirect_and_never_show_it() {
    let server = Server::webhdfs();
    let bytes = common::random_bytes(70_001, 11);
    server.put("/webhdfs/v1/user/me/part-0.bin", bytes.clone());
    let url = format!(
        "{}/webhdfs/v1/user/me/part-0.bin?user.name=me&delegation=S3CRET",
        server.endpoint()
    );
    let file = RemoteFile::open_webhdfs(&url, &RemoteOptions::default()).unwrap();
    // Sized by GETFILESTATUS (counted as a HEAD), then every range through the redirect.
    assert_eq!((file.len(), server.heads()), (70_001, 1));
    let mut buf = vec![0u8; 70_000];
    file.read(&mut buf, 1).unwrap();
    assert!(buf == bytes[1..]);
    assert!(!file.url().to_string().contains("S3CRET"), "{}", file.url());
    // The Hadoop scheme names the same file.
    let hadoop =
        format!("webhdfs://{}/user/me/part-0.bin", server.endpoint().trim_start_matches("http://"));
    assert_eq!(RemoteFile::open(&hadoop).unwrap().len(), 70_001);
    // A missing file: NotFound, the token nowhere in the message.
    let e = RemoteFile::open_webhdfs(&url.replace("part-0", "part-9"), &RemoteOptions::default())
        .unwrap_err();
    assert!(
        matches!(e, Error::Remote { kind: RemoteErrorKind::NotFound, status: Some(404), .. }),
        "{e:?}"
    );
    let text = gpumap::error::Report(&e).to_string();
    assert!(text.contains("part-9") && !text.contains("S3CRET"), "{text}");
    // Not a WebHDFS URL, and a URL that sets the operation itself: refused before any request.
    let gets = server.gets();
    for bad in [format!("{}/data/x.bin", server.endpoint()), format!("{url}&op=DELETE")] {
        let e = RemoteFile::open_webhdfs(&bad, &RemoteOptions::default()).unwrap_err();
        assert!(
            matches!(e, Error::Remote { kind: RemoteErrorKind::InvalidUrl, .. }),
            "{bad}: {e:?}"
        );
    }
    assert_eq!(server.gets(), gets);
}

#[test]
fn a_webhdfs_status_past_its_bound_is_refused_not_held() {
    let server = Server::webhdfs();
    server.put("/webhdfs/v1/f.bin", vec![1; 100]);
    let url = format!("{}/webhdfs/v1/f.bin", server.endpoint());
    server.pad_status(1000);
    assert_eq!(RemoteFile::open_webhdfs(&url, &RemoteOptions::default()).unwrap().len(), 100);
    // A status of megabytes: refused after its first 64 KiB, typed, not read whole.
    server.pad_status(8 << 20);
    let e = RemoteFile::open_webhdfs(&url, &RemoteOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::BadResponse, .. }), "{e:?}");
    assert!(e.to_string().contains("file status of more than"), "{e}");
}
