//! RemoteWriter against the S3 responder of tests/remote/server.rs on 127.0.0.1: objects
//! written as multipart uploads (or one PUT) read back byte for byte, holes and rewrites
//! refused, injected write faults (503s, 500s, dropped connections, stalls), aborts, drops,
//! and the bounds on parts and memory.
#![cfg(feature = "remote")]

mod common;
// The write side is what is used here; the GET faults go unused.
#[allow(dead_code)]
#[path = "remote/server.rs"]
mod server;

use std::time::{Duration, Instant};

use gpumap::error::{Error, RemoteErrorKind};
use gpumap::memory::{Device, DeviceBuffer};
use gpumap::remote::{
    RemoteFile, RemoteOptions, RemoteWriter, MAX_PARTS, MAX_PART_SIZE, MIN_PART_SIZE,
};
use server::{aws_environment, Server, WriteFault, KEY_ID, SECRET};

const PART: usize = MIN_PART_SIZE as usize;

/// A server, the key written to, and the source bytes.
struct Target {
    server: Server,
    key: String,
}

impl Target {
    fn new(key: &str) -> Target {
        aws_environment();
        Target { server: Server::s3(KEY_ID), key: key.to_owned() }
    }

    fn url(&self) -> String {
        format!("s3://test-bucket/{}", self.key)
    }

    /// Options that reach this server: parts of 5 MiB (S3's least, so that objects of a few
    /// parts stay small) and short waits.
    fn options(&self) -> RemoteOptions {
        let mut options = RemoteOptions::default();
        options.backoff(Duration::from_millis(5), Duration::from_millis(20));
        options.s3_endpoint(Some(self.server.endpoint()));
        options.part_size(MIN_PART_SIZE).unwrap();
        options
    }

    fn writer(&self) -> RemoteWriter {
        RemoteWriter::create_with(&self.url(), &self.options()).unwrap()
    }

    /// What the server holds at the key.
    fn stored(&self) -> Option<Vec<u8>> {
        self.server.object(&format!("/test-bucket/{}", self.key))
    }

    /// The object read back through the library's reader.
    fn read_back(&self) -> Vec<u8> {
        let file = RemoteFile::open_with(&self.url(), &self.options()).unwrap();
        let mut bytes = vec![0u8; file.len() as usize];
        file.read(&mut bytes, 0).unwrap();
        bytes
    }

    /// Asserts that no object exists and no upload is left open.
    fn assert_nothing_written(&self) {
        assert!(self.stored().is_none(), "an object was written");
        assert_eq!(self.server.open_uploads(), 0, "an upload was left open");
        assert_eq!(self.server.completes(), 0);
    }
}

/// Writes `bytes` through `writer` in pieces of the sizes in `sizes` (cycled), in order.
fn write_in_pieces(writer: &RemoteWriter, bytes: &[u8], sizes: &[usize]) {
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at == bytes.len() {
            break;
        }
        let n = (*size).min(bytes.len() - at);
        assert_eq!(writer.pwrite(&bytes[at..at + n], at as u64).unwrap(), n);
        at += n;
    }
}

#[test]
fn objects_of_odd_sizes_read_back_byte_for_byte() {
    for (i, len) in
        [PART + 1, 2 * PART - 1, 2 * PART, 3 * PART + 12_345, PART - 1].into_iter().enumerate()
    {
        let target = Target::new(&format!("dir/odd-{i}.bin"));
        let bytes = common::random_bytes(len, i as u64 + 1);
        let writer = target.writer();
        write_in_pieces(&writer, &bytes, &[1_000_003, 1, 4095, 2_500_001]);
        assert_eq!(writer.len(), len as u64);
        assert_eq!(writer.finish().unwrap(), len as u64, "{len}");
        assert!(target.stored().unwrap() == bytes, "{len}: bytes differ");
        assert!(target.read_back() == bytes, "{len}: bytes read back differ");
        let parts = len.div_ceil(PART);
        let (multipart, puts) = if parts > 1 { (1, 0) } else { (0, 1) };
        assert_eq!(
            (
                target.server.uploads_created(),
                target.server.completes(),
                target.server.plain_puts()
            ),
            (multipart, multipart, puts),
            "{len}"
        );
        assert_eq!(target.server.part_puts(), if parts > 1 { parts } else { 0 }, "{len}");
        assert_eq!((target.server.open_uploads(), target.server.aborts()), (0, 0));
    }
}

#[test]
fn writes_at_odd_offsets_out_of_order_land_in_place() {
    let target = Target::new("shuffled.bin");
    let len = 4 * PART + 777;
    let bytes = common::random_bytes(len, 42);
    // Pieces of an odd size, written in a scrambled order: the odd ones first, each leaving
    // holes, then the even ones from the last down.
    let piece = 999_983;
    let count = len.div_ceil(piece);
    let odd = (0..count).filter(|i| i % 2 == 1);
    let order: Vec<usize> = odd.chain((0..count).filter(|i| i % 2 == 0).rev()).collect();
    let writer = target.writer();
    for i in order {
        let start = i * piece;
        let end = (start + piece).min(len);
        writer.pwrite(&bytes[start..end], start as u64).unwrap();
    }
    assert_eq!(writer.finish().unwrap(), len as u64);
    assert!(target.read_back() == bytes, "bytes differ");
    assert_eq!(target.server.part_puts(), 5);
}

#[test]
fn many_threads_write_disjoint_ranges_at_once() {
    let target = Target::new("threads.bin");
    let threads = 8;
    let len = 7 * PART + 4321;
    let bytes = common::random_bytes(len, 7);
    let writer = target.writer();
    let share = len.div_ceil(threads);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (writer, bytes) = (&writer, &bytes);
            scope.spawn(move || {
                let start = (t * share).min(len);
                let end = ((t + 1) * share).min(len);
                let mut at = start;
                // Pieces of odd sizes, so that threads meet inside parts.
                let mut size = 65_537 + t * 4099;
                while at < end {
                    let n = size.min(end - at);
                    writer.pwrite(&bytes[at..at + n], at as u64).unwrap();
                    at += n;
                    size = size * 3 % 1_000_003 + 1;
                }
            });
        }
    });
    assert_eq!(writer.finish().unwrap(), len as u64);
    assert!(target.read_back() == bytes, "bytes differ");
    assert_eq!(target.server.part_puts(), 8);
}

#[test]
fn a_small_object_goes_as_one_put() {
    let target = Target::new("small.bin");
    let writer = target.writer();
    writer.pwrite(b"world", 6).unwrap();
    writer.pwrite(b"hello ", 0).unwrap();
    assert_eq!(writer.finish().unwrap(), 11);
    assert_eq!(target.stored().as_deref(), Some(&b"hello world"[..]));
    assert_eq!(target.server.plain_puts(), 1);
    assert_eq!(target.server.uploads_created(), 0);
    // Nothing written at all: an empty object, also by one PUT.
    let target = Target::new("empty.bin");
    let writer = target.writer();
    assert!(writer.is_empty());
    assert_eq!(writer.pwrite(&[], 12).unwrap(), 0);
    assert_eq!(writer.finish().unwrap(), 0);
    assert_eq!(target.stored().as_deref(), Some(&[][..]));
}

#[test]
fn a_hole_is_refused_at_finish_naming_its_first_byte() {
    // Within one part: no upload was ever created, and no object is.
    let target = Target::new("hole-small.bin");
    let writer = target.writer();
    writer.pwrite(&[1; 100], 0).unwrap();
    writer.pwrite(&[2; 100], 200).unwrap();
    let e = writer.finish().unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("byte 100 of the 300 bytes"), "{e}");
    target.assert_nothing_written();
    assert_eq!(target.server.plain_puts(), 0);
    // Across parts: part 1 sent, a hole in part 2, part 3 written: the upload is aborted.
    let target = Target::new("hole.bin");
    let bytes = common::random_bytes(3 * PART, 3);
    let writer = target.writer();
    writer.pwrite(&bytes[..PART + 10], 0).unwrap();
    writer.pwrite(&bytes[PART + 20..], (PART + 20) as u64).unwrap();
    let e = writer.finish().unwrap_err();
    assert!(e.to_string().contains(&format!("byte {} of the", PART + 10)), "{e}");
    assert_eq!(target.server.aborts(), 1);
    target.assert_nothing_written();
    // The writer takes nothing more.
    assert!(writer.pwrite(&[0; 10], (PART + 10) as u64).is_err());
    assert!(writer.finish().is_err());
}

#[test]
fn a_write_into_a_part_already_sent_is_refused() {
    let target = Target::new("rewrite.bin");
    let bytes = common::random_bytes(PART + 50, 5);
    let writer = target.writer();
    writer.pwrite(&bytes[..PART], 0).unwrap();
    // Part 1 is whole, so it is on its way (or there): byte 10 cannot be written again.
    let e = writer.pwrite(&[0xEE; 4], 10).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("byte 10 of") && text.contains("already sent"), "{text}");
    // The object would not hold the refused bytes, so the writer takes nothing more and no
    // object is written, whichever thread finishes.
    let later = writer.pwrite(&bytes[PART..], PART as u64).unwrap_err().to_string();
    assert!(later.contains("the write of 4 bytes at byte 10 failed"), "{later}");
    let e = writer.finish().unwrap_err().to_string();
    assert!(e.contains("already sent") && e.contains("no object is written"), "{e}");
    assert_eq!(target.server.aborts(), 1);
    target.assert_nothing_written();
}

#[test]
fn a_write_refused_for_want_of_room_on_one_thread_fails_the_finish_on_another() {
    // Room for one part. Thread A holds part 1 partly written; thread B's write into part 2
    // cannot get room and is refused. Were the writer to go on, A's finish would write an
    // object of part 1 alone, without B's bytes and without an error.
    let target = Target::new("refused-elsewhere.bin");
    let mut options = target.options();
    options.max_in_flight(Some(1)).unwrap();
    let writer = RemoteWriter::create_with(&target.url(), &options).unwrap();
    let bytes = common::random_bytes(2 * PART, 23);
    writer.pwrite(&bytes[..PART - 1], 0).unwrap();
    let refused = std::thread::scope(|scope| {
        scope.spawn(|| writer.pwrite(&bytes[PART..], PART as u64)).join().unwrap()
    });
    assert!(refused.unwrap_err().to_string().contains("raise max_in_flight"));
    assert!(writer.pwrite(&bytes[PART - 1..PART], PART as u64 - 1).is_err());
    let e = writer.finish().unwrap_err().to_string();
    assert!(e.contains(&format!("the write of {PART} bytes at byte {PART} failed")), "{e}");
    target.assert_nothing_written();
}

#[test]
fn injected_503s_and_dropped_connections_are_retried() {
    let target = Target::new("retried.bin");
    let bytes = common::random_bytes(2 * PART + 99, 9);
    // A 503 and a dropped connection for the parts sent while writing, another 503 for the
    // last part, sent at finish.
    target.server.inject_writes([WriteFault::Status(503), WriteFault::Drop]);
    let writer = target.writer();
    write_in_pieces(&writer, &bytes, &[PART / 3]);
    target.server.inject_writes([WriteFault::Status(503)]);
    assert_eq!(writer.finish().unwrap(), bytes.len() as u64);
    assert!(target.stored().unwrap() == bytes);
    // Three parts, two faulted puts of part 1 (or 2) and one of the last, sent at finish.
    assert_eq!(target.server.part_puts(), 3 + 3);
    assert_eq!((target.server.completes(), target.server.aborts()), (1, 0));
    // A single PUT is retried alike.
    let target = Target::new("retried-small.bin");
    target.server.inject_writes([WriteFault::Drop, WriteFault::Status(503)]);
    let writer = target.writer();
    writer.pwrite(&bytes[..1000], 0).unwrap();
    assert_eq!(writer.finish().unwrap(), 1000);
    assert_eq!(target.stored().as_deref(), Some(&bytes[..1000]));
    assert_eq!(target.server.plain_puts(), 3);
}

#[test]
fn a_persistent_500_is_a_typed_error_and_the_upload_is_aborted() {
    let target = Target::new("failed.bin");
    let bytes = common::random_bytes(2 * PART + 1, 11);
    let mut options = target.options();
    options.max_attempts(3).unwrap();
    target.server.inject_writes([500, 500, 500].map(WriteFault::Status));
    let writer = RemoteWriter::create_with(&target.url(), &options).unwrap();
    // Part 1 fails in the background; whichever call comes next reports it.
    let outcome = (|| {
        writer.pwrite(&bytes[..PART], 0)?;
        std::thread::sleep(Duration::from_millis(200));
        writer.pwrite(&bytes[PART..], PART as u64)?;
        writer.finish()
    })();
    let e = outcome.unwrap_err();
    match &e {
        Error::Remote {
            kind: RemoteErrorKind::Status,
            status: Some(500),
            attempts: 3,
            op,
            url,
            ..
        } => {
            assert!(op.contains("PUT part 1"), "{op}");
            assert_eq!(url, "s3://test-bucket/failed.bin");
        }
        other => panic!("{other:?}"),
    }
    assert!(!gpumap::error::Report(&e).to_string().contains(SECRET));
    // Every call after it fails with it, finish included, which aborts the upload.
    assert!(matches!(
        writer.finish(),
        Err(Error::Remote { status: Some(500), .. }) | Err(Error::InvalidArgument(_))
    ));
    drop(writer);
    assert_eq!(target.server.aborts(), 1);
    target.assert_nothing_written();
}

/// Two whole parts written and answered, then `faults` on the completion's two attempts:
/// `finish`'s error, checked to be the completion's.
fn finish_with_completion_faults(name: &str, faults: [WriteFault; 2]) -> (Target, Error) {
    let target = Target::new(name);
    let bytes = common::random_bytes(2 * PART, 12);
    let mut options = target.options();
    options.max_attempts(2).unwrap();
    let writer = RemoteWriter::create_with(&target.url(), &options).unwrap();
    writer.pwrite(&bytes, 0).unwrap();
    // Both parts are whole and go at once; once they are answered, the next write request
    // is the completion.
    while target.server.part_puts() < 2 {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    target.server.inject_writes(faults);
    let e = writer.finish().unwrap_err();
    match &e {
        Error::Remote { attempts: 2, op, .. } => {
            assert!(op.starts_with("complete the upload (2 parts)"), "{op}")
        }
        other => panic!("{other:?}"),
    }
    (target, e)
}

#[test]
fn a_failed_completion_aborts_the_upload() {
    let faults = [WriteFault::Status(500), WriteFault::Status(500)];
    let (target, e) = finish_with_completion_faults("complete-failed.bin", faults);
    assert!(matches!(e, Error::Remote { status: Some(500), .. }), "{e:?}");
    assert_eq!(target.server.aborts(), 1);
    target.assert_nothing_written();
    assert!(!e.to_string().contains("may exist"), "a refusal is an answer: {e}");
}

/// A completion whose answers are lost may have completed the upload: the error must not let
/// the caller believe that no object was written.
#[test]
fn a_completion_with_no_answer_says_the_object_may_exist() {
    let faults = [WriteFault::Drop, WriteFault::Drop];
    let (_target, e) = finish_with_completion_faults("complete-unanswered.bin", faults);
    assert!(e.to_string().contains("the object may exist, whole"), "{e}");
}

#[test]
fn a_stall_beyond_the_timeout_is_a_timeout_and_nothing_is_written() {
    let target = Target::new("stalled.bin");
    let bytes = common::random_bytes(PART + 10, 13);
    let mut options = target.options();
    options.timeout(Duration::from_millis(300)).unwrap();
    target.server.inject_writes([WriteFault::Stall(Duration::from_secs(3))]);
    let writer = RemoteWriter::create_with(&target.url(), &options).unwrap();
    let start = Instant::now();
    writer.pwrite(&bytes, 0).unwrap();
    let e = writer.finish().unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::Timeout, .. }), "{e:?}");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    assert_eq!(target.server.aborts(), 1);
    // The stalled part reaches the server after the abort, and finds no upload.
    std::thread::sleep(Duration::from_millis(3200) - start.elapsed().min(Duration::from_secs(3)));
    target.assert_nothing_written();
}

#[test]
fn a_finish_during_a_write_waits_for_it_and_fails_with_it() {
    // One part held, each part's PUT slow: the write of four parts waits for room after the
    // first. A finish then refuses its later pieces; it used to complete the object with the
    // pieces already written, while the write failed on its own thread.
    let target = Target::new("finish-during-write.bin");
    let mut options = target.options();
    options.max_in_flight(Some(1)).unwrap();
    target.server.delay_part_puts(Duration::from_millis(150));
    let writer = RemoteWriter::create_with(&target.url(), &options).unwrap();
    let bytes = common::random_bytes(4 * PART, 25);
    let (written, finished) = std::thread::scope(|scope| {
        let writing = scope.spawn(|| writer.pwrite(&bytes, 0));
        while target.server.part_puts() == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let finished = writer.finish();
        (writing.join().unwrap(), finished)
    });
    match written {
        // The write ended whole before the finish looked: the object is all of it.
        Ok(n) => {
            assert_eq!((n as u64, finished.unwrap()), (bytes.len() as u64, bytes.len() as u64));
            assert!(target.read_back() == bytes);
        }
        Err(e) => {
            let text = finished.unwrap_err().to_string();
            assert!(text.contains("the write of"), "{text} (the write: {e})");
            target.assert_nothing_written();
        }
    }
}

#[test]
fn an_upload_created_without_its_answer_is_named_and_holds_nothing() {
    // The store creates the upload after the writer gave up waiting: the writer has no id to
    // abort it by, so the error says what is left and that it holds no data.
    let target = Target::new("create-unanswered.bin");
    let mut options = target.options();
    options.timeout(Duration::from_millis(300)).unwrap();
    target.server.inject_creates([WriteFault::Stall(Duration::from_millis(800))]);
    let writer = RemoteWriter::create_with(&target.url(), &options).unwrap();
    let bytes = common::random_bytes(PART + 10, 24);
    writer.pwrite(&bytes, 0).unwrap();
    let e = writer.finish().unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::Timeout, .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.starts_with("create a multipart upload of"), "{text}");
    assert!(text.contains("it holds no data") && text.contains("lifecycle rule"), "{text}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while target.server.uploads_created() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!((target.server.open_uploads(), target.server.part_puts()), (1, 0));
    assert!(target.stored().is_none());
}

#[test]
fn abort_drops_the_upload_and_the_writer() {
    let target = Target::new("aborted.bin");
    let bytes = common::random_bytes(PART + 100, 14);
    let writer = target.writer();
    writer.pwrite(&bytes, 0).unwrap();
    writer.abort().unwrap();
    assert_eq!((target.server.uploads_created(), target.server.aborts()), (1, 1));
    target.assert_nothing_written();
    let e = writer.pwrite(&[1], 0).unwrap_err();
    assert!(e.to_string().contains("aborted"), "{e}");
    assert!(writer.finish().is_err());
    writer.abort().unwrap();
    drop(writer);
    assert_eq!(target.server.aborts(), 1, "one abort, whatever follows");
    // Before any part went out there is no upload to abort, and none is made.
    let target = Target::new("aborted-small.bin");
    let writer = target.writer();
    writer.pwrite(&bytes[..10], 0).unwrap();
    writer.abort().unwrap();
    assert_eq!(target.server.uploads_created() + target.server.plain_puts(), 0);
    target.assert_nothing_written();
}

#[test]
fn dropping_an_unfinished_writer_aborts_its_upload() {
    let target = Target::new("dropped.bin");
    let bytes = common::random_bytes(2 * PART + 100, 15);
    target.server.delay_part_puts(Duration::from_millis(100));
    let writer = target.writer();
    writer.pwrite(&bytes[..2 * PART + 50], 0).unwrap();
    drop(writer);
    // The drop waited for both parts in flight, then aborted.
    assert_eq!((target.server.part_puts(), target.server.aborts()), (2, 1));
    target.assert_nothing_written();
    // A finished writer's drop aborts nothing.
    let target = Target::new("kept.bin");
    let writer = target.writer();
    writer.pwrite(&bytes, 0).unwrap();
    writer.finish().unwrap();
    drop(writer);
    assert_eq!(target.server.aborts(), 0);
    assert!(target.stored().unwrap() == bytes);
}

#[test]
fn inside_an_async_runtime_calls_are_refused_and_a_drop_aborts_in_the_background() {
    let target = Target::new("async.bin");
    let bytes = common::random_bytes(PART + 10, 20);
    let writer = target.writer();
    writer.pwrite(&bytes, 0).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // A blocking call from a runtime's thread is refused before it changes anything.
    let e = runtime.block_on(async { writer.finish() }).unwrap_err();
    assert!(e.to_string().contains("async runtime"), "{e}");
    assert!(runtime.block_on(async { writer.abort() }).is_err());
    // Dropped there, the writer cannot block: the remote runtime aborts the upload.
    runtime.block_on(async move { drop(writer) });
    let start = Instant::now();
    while target.server.aborts() == 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(target.server.aborts(), 1);
    target.assert_nothing_written();
}

#[test]
fn part_sizes_and_the_objects_bounds_are_checked() {
    aws_environment();
    let mut options = RemoteOptions::default();
    for bad in [0, MIN_PART_SIZE - 1, MAX_PART_SIZE + 1] {
        let e = options.part_size(bad).unwrap_err();
        assert!(e.to_string().contains(&format!("part_size {bad}")), "{e}");
    }
    assert_eq!(options, RemoteOptions::default());
    let target = Target::new("bounds.bin");
    let writer = target.writer();
    assert_eq!(writer.part_size(), MIN_PART_SIZE);
    // Past the last part S3 takes, and past u64: refused, naming the write, nothing sent.
    let last = MAX_PARTS * MIN_PART_SIZE;
    let e = writer.pwrite(&[1, 2], last - 1).unwrap_err();
    assert!(e.to_string().contains(&format!("at offset {}", last - 1)), "{e}");
    assert!(matches!(writer.pwrite(&[1, 2], u64::MAX), Err(Error::Overflow { .. })));
    assert_eq!(writer.len(), 0);
    // Writes to an http(s) URL are refused: only S3 takes uploads.
    let e = RemoteWriter::create(&format!("{}/x.bin", target.server.endpoint())).unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::InvalidUrl, .. }), "{e:?}");
}

#[test]
fn parts_held_in_memory_are_bounded() {
    let target = Target::new("held.bin");
    let mut options = target.options();
    // Parts held: max_in_flight, and no more than 4 GiB of them (one at least).
    options.max_in_flight(Some(2)).unwrap();
    let writer = RemoteWriter::create_with(&target.url(), &options).unwrap();
    assert_eq!(writer.max_parts_held(), 2);
    let mut big = target.options();
    big.part_size(MAX_PART_SIZE).unwrap();
    assert_eq!(RemoteWriter::create_with(&target.url(), &big).unwrap().max_parts_held(), 1);
    big.part_size(1 << 30).unwrap();
    assert_eq!(RemoteWriter::create_with(&target.url(), &big).unwrap().max_parts_held(), 4);
    // In order, one thread: a write waits for room, so no more than 2 parts are ever out.
    target.server.delay_part_puts(Duration::from_millis(50));
    let bytes = common::random_bytes(6 * PART + 3, 16);
    write_in_pieces(&writer, &bytes, &[3 * PART]);
    assert_eq!(writer.finish().unwrap(), bytes.len() as u64);
    assert!(target.stored().unwrap() == bytes);
    assert!(target.server.max_active_part_puts() <= 2, "{}", target.server.max_active_part_puts());
    // Parts begun and left partly written fill the room: the next part is refused, naming
    // its byte, and the writer takes nothing more.
    let target = Target::new("held-partly.bin");
    let mut options = target.options();
    options.max_in_flight(Some(2)).unwrap();
    let writer = RemoteWriter::create_with(&target.url(), &options).unwrap();
    let bytes = common::random_bytes(3 * PART, 17);
    writer.pwrite(&bytes[1..PART], 1).unwrap();
    writer.pwrite(&bytes[PART + 1..2 * PART], PART as u64 + 1).unwrap();
    let e = writer.pwrite(&bytes[2 * PART + 1..], 2 * PART as u64 + 1).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains(&format!("byte {} of", 2 * PART + 1)) && text.contains("2 held"),
        "{text}"
    );
    assert!(writer.pwrite(&bytes[..1], 0).is_err());
    assert!(writer.finish().is_err());
    target.assert_nothing_written();
}

#[test]
fn one_write_of_many_parts_waits_for_room_part_by_part() {
    // Room for one part: a single write of four parts waits for each to be sent before it
    // fills the next, rather than being refused or holding them all.
    let target = Target::new("one-at-a-time.bin");
    let mut options = target.options();
    options.max_in_flight(Some(1)).unwrap();
    target.server.delay_part_puts(Duration::from_millis(50));
    let writer = RemoteWriter::create_with(&target.url(), &options).unwrap();
    assert_eq!(writer.max_parts_held(), 1);
    let bytes = common::random_bytes(4 * PART + 1, 18);
    assert_eq!(writer.pwrite(&bytes, 0).unwrap(), bytes.len());
    assert_eq!(writer.finish().unwrap(), bytes.len() as u64);
    assert!(target.read_back() == bytes);
    assert_eq!((target.server.part_puts(), target.server.max_active_part_puts()), (5, 1));
}

on_host_and_gpu!(writes_from_device_memory);

fn writes_from_device_memory(device: Device) {
    let target = Target::new("device.bin");
    let len = 2 * PART + 4097;
    let bytes = common::random_bytes(len, 19);
    let mut src = DeviceBuffer::alloc(&device, len).unwrap();
    src.copy_from_host(0, &bytes).unwrap();
    let writer = target.writer();
    // Two writes whose pieces are larger than a stage and end mid-part, the second first.
    let cut = PART + 3;
    let view = src.view();
    writer.pwrite_device(view.slice(cut..).unwrap(), cut as u64).unwrap();
    writer.pwrite_device(view.slice(..cut).unwrap(), 0).unwrap();
    assert_eq!(writer.finish().unwrap(), len as u64);
    assert!(target.read_back() == bytes, "{device:?}: bytes differ");
}
