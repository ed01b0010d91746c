//! The test S3 server's write side (tests/remote/server.rs), driven by object_store's own S3
//! client: plain puts, multipart uploads under AWS's rules, aborts and injected write faults. The
//! writer tests trust this server to refuse what S3 refuses; these tests are why.
#![cfg(feature = "remote")]

// The write side is what is under test here; the GET faults go unused.
#[allow(dead_code)]
#[path = "remote/server.rs"]
mod server;

use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{BackoffConfig, ObjectStoreExt, PutPayload, RetryConfig};
use server::{Server, WriteFault, KEY_ID, SECRET};

const BUCKET: &str = "test-bucket";
const MIB: usize = 1024 * 1024;

/// A client of `server`'s bucket, credentials given directly (no environment), retrying
/// `retries` times with short waits.
fn store(server: &Server, retries: usize) -> AmazonS3 {
    let backoff = BackoffConfig {
        init_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        base: 2.0,
    };
    let retry =
        RetryConfig { backoff, max_retries: retries, retry_timeout: Duration::from_secs(30) };
    AmazonS3Builder::new()
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_access_key_id(KEY_ID)
        .with_secret_access_key(SECRET)
        .with_endpoint(server.endpoint())
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_retry(retry)
        .build()
        .unwrap()
}

fn block_on<T>(work: impl Future<Output = T>) -> T {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(work)
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 13) as u8).collect()
}

#[test]
fn a_plain_put_reads_back_byte_for_byte() {
    let server = Server::s3(KEY_ID);
    let s3 = store(&server, 0);
    let data = bytes(3 * MIB + 17, 1);
    let path = Path::from("dir/plain.bin");
    block_on(async {
        let put = s3.put(&path, PutPayload::from(data.clone())).await.unwrap();
        assert!(put.e_tag.is_some());
        let got = s3.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], &data[..]);
    });
    assert_eq!(server.object("/test-bucket/dir/plain.bin").as_deref(), Some(&data[..]));
    assert_eq!(server.plain_puts(), 1);
}

#[test]
fn a_multipart_upload_out_of_order_completes_byte_for_byte() {
    let server = Server::s3(KEY_ID);
    let s3 = store(&server, 0);
    let parts = [bytes(5 * MIB, 2), bytes(5 * MIB, 3), vec![0xAB]];
    let path = Path::from("dir/multi part.bin");
    block_on(async {
        let id = s3.create_multipart(&path).await.unwrap();
        let mut ids = vec![None, None, None];
        for idx in [2, 0, 1] {
            let payload = PutPayload::from(parts[idx].clone());
            ids[idx] = Some(s3.put_part(&path, &id, idx, payload).await.unwrap());
        }
        assert_eq!(server.open_uploads(), 1);
        let ids = ids.into_iter().map(Option::unwrap).collect();
        s3.complete_multipart(&path, &id, ids).await.unwrap();
    });
    let whole = parts.concat();
    assert_eq!(server.object("/test-bucket/dir/multi part.bin").as_deref(), Some(&whole[..]));
    let got = block_on(async { s3.get(&path).await.unwrap().bytes().await.unwrap() });
    assert_eq!(&got[..], &whole[..]);
    assert_eq!((server.open_uploads(), server.completes(), server.part_puts()), (0, 1, 3));
}

#[test]
fn a_small_part_before_the_last_is_entity_too_small() {
    let server = Server::s3(KEY_ID);
    let s3 = store(&server, 0);
    let path = Path::from("small.bin");
    let e = block_on(async {
        let id = s3.create_multipart(&path).await.unwrap();
        let a = s3.put_part(&path, &id, 0, PutPayload::from(bytes(5 * MIB - 1, 4))).await;
        let b = s3.put_part(&path, &id, 1, PutPayload::from(bytes(10, 5))).await;
        s3.complete_multipart(&path, &id, vec![a.unwrap(), b.unwrap()]).await.unwrap_err()
    });
    assert!(e.to_string().contains("EntityTooSmall"), "{e}");
    assert_eq!((server.open_uploads(), server.completes()), (1, 0));
    assert!(server.object("/test-bucket/small.bin").is_none());
}

#[test]
fn an_abort_drops_the_upload_and_is_counted() {
    let server = Server::s3(KEY_ID);
    let s3 = store(&server, 0);
    let path = Path::from("aborted.bin");
    block_on(async {
        let id = s3.create_multipart(&path).await.unwrap();
        s3.put_part(&path, &id, 0, PutPayload::from(bytes(100, 6))).await.unwrap();
        s3.abort_multipart(&path, &id).await.unwrap();
        let e = s3.put_part(&path, &id, 1, PutPayload::from(bytes(100, 7))).await.unwrap_err();
        assert!(e.to_string().contains("NoSuchUpload"), "{e}");
    });
    assert_eq!((server.open_uploads(), server.aborts(), server.completes()), (0, 1, 0));
}

#[test]
fn an_injected_503_on_a_part_put_comes_back_as_an_error() {
    let server = Server::s3(KEY_ID);
    let s3 = store(&server, 0);
    let path = Path::from("faulted.bin");
    server.inject_writes([WriteFault::Status(503)]);
    block_on(async {
        let id = s3.create_multipart(&path).await.unwrap();
        let e = s3.put_part(&path, &id, 0, PutPayload::from(bytes(100, 8))).await.unwrap_err();
        assert!(e.to_string().contains("SlowDown"), "{e}");
        // The fault was used up: the same part goes through now.
        s3.put_part(&path, &id, 0, PutPayload::from(bytes(100, 8))).await.unwrap();
    });
    assert_eq!(server.part_puts(), 2);
}

#[test]
fn retries_ride_out_stalls_drops_and_503s() {
    let server = Server::s3(KEY_ID);
    let s3 = store(&server, 3);
    let data = bytes(1000, 9);
    let path = Path::from("retried.bin");
    server.inject_writes([
        WriteFault::Drop,
        WriteFault::Status(500),
        WriteFault::Stall(Duration::from_millis(50)),
    ]);
    block_on(async { s3.put(&path, PutPayload::from(data.clone())).await.unwrap() });
    assert_eq!(server.object("/test-bucket/retried.bin").as_deref(), Some(&data[..]));
    assert_eq!(server.plain_puts(), 3);
}

#[test]
fn parts_in_flight_at_once_are_counted() {
    let server = Server::s3(KEY_ID);
    let s3 = store(&server, 0);
    server.delay_part_puts(Duration::from_millis(100));
    let path = Path::from("parallel.bin");
    block_on(async {
        let id = s3.create_multipart(&path).await.unwrap();
        let puts = (0..3).map(|idx| s3.put_part(&path, &id, idx, PutPayload::from(vec![1; 10])));
        for put in futures_util::future::join_all(puts).await {
            put.unwrap();
        }
    });
    assert_eq!(server.max_active_part_puts(), 3);
}

#[test]
fn unsigned_writes_are_refused() {
    let server = Server::s3(KEY_ID);
    let s3 = AmazonS3Builder::new()
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_endpoint(server.endpoint())
        .with_allow_http(true)
        .with_skip_signature(true)
        .with_retry(RetryConfig { max_retries: 0, ..RetryConfig::default() })
        .build()
        .unwrap();
    let e = block_on(s3.put(&Path::from("x.bin"), PutPayload::from(vec![1]))).unwrap_err();
    assert!(e.to_string().contains("AccessDenied"), "{e}");
    assert!(server.object("/test-bucket/x.bin").is_none());
}

#[test]
fn a_part_listed_with_another_etag_is_an_invalid_part() {
    let server = Server::s3(KEY_ID);
    let s3 = store(&server, 0);
    let path = Path::from("etag.bin");
    let e = block_on(async {
        let id = s3.create_multipart(&path).await.unwrap();
        s3.put_part(&path, &id, 0, PutPayload::from(bytes(10, 10))).await.unwrap();
        let wrong = PartId { content_id: "\"0123\"".to_owned() };
        s3.complete_multipart(&path, &id, vec![wrong]).await.unwrap_err()
    });
    assert!(e.to_string().contains("InvalidPart"), "{e}");
    assert_eq!(server.open_uploads(), 1);
}

/// One request by hand, as object_store never sends it (its part numbers follow its list); the
/// server checks only that `Authorization` names the key id. The answer's status line and body.
fn by_hand(server: &Server, head: &str, body: &str) -> (String, String) {
    let mut stream = TcpStream::connect(server.endpoint().trim_start_matches("http://")).unwrap();
    let auth = format!("AWS4-HMAC-SHA256 Credential={KEY_ID}/20261125/us-east-1/s3/aws4_request");
    let request = format!(
        "{head} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (status, rest) = answer.split_once("\r\n").unwrap();
    (status.to_owned(), rest.split_once("\r\n\r\n").unwrap().1.to_owned())
}

#[test]
fn parts_listed_out_of_order_are_an_invalid_part_order() {
    let server = Server::s3(KEY_ID);
    let s3 = store(&server, 0);
    let path = Path::from("order.bin");
    let (id, etags) = block_on(async {
        let id = s3.create_multipart(&path).await.unwrap();
        let a = s3.put_part(&path, &id, 0, PutPayload::from(bytes(5 * MIB, 11))).await.unwrap();
        let b = s3.put_part(&path, &id, 1, PutPayload::from(bytes(10, 12))).await.unwrap();
        (id, [a.content_id, b.content_id])
    });
    let part = |n: usize| {
        format!("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>", n + 1, etags[n])
    };
    let complete = |parts: String| {
        let body = format!("<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>");
        by_hand(&server, &format!("POST /test-bucket/order.bin?uploadId={id}"), &body)
    };
    let (status, body) = complete(part(1) + &part(0));
    assert!(status.contains(" 400 ") && body.contains("InvalidPartOrder"), "{status} {body}");
    let (status, body) = complete(part(0) + &part(1));
    assert!(status.contains(" 200 ") && body.contains("<ETag>"), "{status} {body}");
    let whole = [bytes(5 * MIB, 11), bytes(10, 12)].concat();
    assert_eq!(server.object("/test-bucket/order.bin").as_deref(), Some(&whole[..]));
}

#[test]
fn writes_to_a_plain_http_server_are_not_allowed() {
    let server = Server::http();
    let (status, _) = by_hand(&server, "PUT /data/x.bin", "abc");
    assert!(status.contains(" 405 "), "{status}");
    assert!(server.object("/data/x.bin").is_none());
}
