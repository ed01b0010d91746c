//! The kinds of endpoint a URL opens as (KvikIO's `RemoteEndpointType`): unsigned S3 requests
//! for public objects, the fall-back from signed to unsigned, credentials given by the caller,
//! and S3 objects named by `http(s)://` URLs, against the S3 responder of tests/remote/server.rs
//! on 127.0.0.1, which tells signed requests from unsigned ones.
#![cfg(feature = "remote")]

mod common;
// The shared responder: this binary uses its S3 mode alone.
#[allow(dead_code)]
#[path = "remote/server.rs"]
mod server;

use std::time::Duration;

use gpumap::error::{Error, RemoteErrorKind};
use gpumap::remote::{EndpointKind, RemoteFile, RemoteOptions, S3Credentials};
use server::{aws_environment, Fault, Server, KEY_ID, SECRET};

/// An S3 responder that wants `key_id`, holding a public and a private object.
fn bucket(key_id: &str) -> (Server, Vec<u8>, RemoteOptions) {
    aws_environment();
    let server = Server::s3(key_id);
    let bytes = common::random_bytes(300_001, 11);
    server.put("/test-bucket/pub/object.bin", bytes.clone());
    server.make_public("/test-bucket/pub/object.bin");
    server.put("/test-bucket/private/object.bin", bytes.clone());
    let mut options = RemoteOptions::default();
    options.s3_endpoint(Some(server.endpoint()));
    options.backoff(Duration::from_millis(5), Duration::from_millis(20));
    options.request_size(65_536).unwrap();
    (server, bytes, options)
}

/// Reads the whole object at an odd offset and checks it byte for byte.
fn reads_exactly(file: &RemoteFile, bytes: &[u8]) {
    assert_eq!(file.len(), bytes.len() as u64);
    let mut out = vec![0u8; bytes.len() - 7];
    assert_eq!(file.read(&mut out, 7).unwrap(), out.len());
    assert!(out == bytes[7..], "the bytes read differ from the object's");
}

fn refused(result: gpumap::Result<RemoteFile>) -> (Option<u16>, String) {
    match result {
        Err(e @ Error::Remote { kind: RemoteErrorKind::AccessDenied, .. }) => {
            let Error::Remote { status, .. } = &e else { unreachable!() };
            (*status, gpumap::error::Report(&e).to_string())
        }
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn unsigned_requests_read_public_objects_and_carry_no_signature() {
    let (server, bytes, options) = bucket(KEY_ID);
    let url = "s3://test-bucket/pub/object.bin";
    let file = RemoteFile::open_as(url, EndpointKind::S3Public, &options).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::S3Public);
    // A few injected 503s on the way: unsigned requests are retried as signed ones are.
    server.inject([Fault::Status(503), Fault::Status(503)]);
    reads_exactly(&file, &bytes);
    let (unsigned, signed) = server.unsigned_and_signed_requests();
    assert!(unsigned > 2 && signed == 0, "{unsigned} unsigned, {signed} signed requests");
    // A private object is refused to unsigned requests, typed, naming the URL.
    let (status, text) = refused(RemoteFile::open_as(
        "s3://test-bucket/private/object.bin",
        EndpointKind::S3Public,
        &options,
    ));
    assert_eq!(status, Some(403));
    assert!(text.contains("s3://test-bucket/private/object.bin"), "{text}");
}

#[test]
fn auto_falls_back_to_unsigned_requests_where_signed_ones_are_refused() {
    // The server knows another key: this process's credentials are refused.
    let (server, bytes, options) = bucket("SOMEOTHERKEYID");
    let url = "s3://test-bucket/pub/object.bin";
    let file = RemoteFile::open_auto(url, &EndpointKind::ALL, &options).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::S3Public);
    reads_exactly(&file, &bytes);
    // The signed open went first, refused once; everything after it went unsigned.
    assert_eq!(server.unsigned_and_signed_requests().1, 1);
    // Without S3_PUBLIC among the kinds allowed, the refusal stands.
    let signed_only = [EndpointKind::S3, EndpointKind::Http];
    let (status, text) = refused(RemoteFile::open_auto(url, &signed_only, &options));
    assert_eq!(status, Some(403));
    assert!(text.contains("s3://test-bucket/pub/object.bin") && !text.contains(SECRET), "{text}");
    assert_eq!(server.unsigned_and_signed_requests().1, 2);
    // A private object is refused both ways, typed.
    let (unsigned, signed) = server.unsigned_and_signed_requests();
    let private = "s3://test-bucket/private/object.bin";
    let (status, _) = refused(RemoteFile::open_auto(private, &EndpointKind::ALL, &options));
    assert_eq!(status, Some(403));
    assert_eq!(server.unsigned_and_signed_requests(), (unsigned + 1, signed + 1));
    // With credentials configured and the size known, the open asks nothing (a checkpoint's
    // shards open so): it is signed, and the refusal shows at the first read.
    let mut sized = options.clone();
    sized.known_len(Some(bytes.len() as u64));
    let before = server.heads() + server.gets();
    let file = RemoteFile::open_auto(url, &EndpointKind::ALL, &sized).unwrap();
    assert_eq!((file.endpoint_kind(), server.heads() + server.gets()), (EndpointKind::S3, before));
    let e = file.read(&mut [0u8; 10], 0).unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::AccessDenied, .. }), "{e:?}");
}

#[test]
fn auto_opens_signed_where_the_credentials_are_taken() {
    let (server, bytes, options) = bucket(KEY_ID);
    let file =
        RemoteFile::open_auto("s3://test-bucket/private/object.bin", &EndpointKind::ALL, &options)
            .unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::S3);
    reads_exactly(&file, &bytes);
    assert_eq!(server.unsigned_and_signed_requests().0, 0);
    // A URL of no kind allowed is refused before any request.
    let before = server.heads() + server.gets();
    let e =
        RemoteFile::open_auto("s3://test-bucket/pub/object.bin", &[EndpointKind::Http], &options)
            .unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::InvalidUrl, .. }), "{e:?}");
    assert_eq!(server.heads() + server.gets(), before);
}

#[test]
fn credentials_given_replace_the_environments_and_are_never_shown() {
    let (server, bytes, mut options) = bucket("GIVENKEYID");
    // The environment's key is refused by this server (and unsigned requests, tried next)...
    refused(RemoteFile::open_with("s3://test-bucket/private/object.bin", &options));
    let (unsigned, _) = server.unsigned_and_signed_requests();
    assert_eq!(unsigned, 1);
    // ...the one given is taken, alone, and its secret is nowhere in the options' Debug.
    let given =
        S3Credentials::new("GIVENKEYID", "given-secret-xyz", Some("tok-abc".into())).unwrap();
    options.s3_credentials(Some(given));
    let file = RemoteFile::open_with("s3://test-bucket/private/object.bin", &options).unwrap();
    reads_exactly(&file, &bytes);
    assert_eq!(server.unsigned_and_signed_requests().0, unsigned);
    let shown = format!("{options:?}");
    assert!(shown.contains("GIVENKEYID"), "{shown}");
    assert!(!shown.contains("given-secret-xyz") && !shown.contains("tok-abc"), "{shown}");
    // Given credentials are the caller's choice: no fall-back to unsigned requests.
    let mut wrong = options.clone();
    wrong.s3_credentials(Some(S3Credentials::new("WRONGKEY", "s", None).unwrap()));
    refused(RemoteFile::open_auto("s3://test-bucket/pub/object.bin", &EndpointKind::ALL, &wrong));
    for (id, secret) in [("", "s"), ("id", ""), ("id\n", "s"), ("id", "s\r")] {
        assert!(S3Credentials::new(id, secret, None).is_err(), "{id:?} {secret:?}");
    }
}

#[test]
fn http_urls_of_s3_objects_are_read_path_style_on_their_own_host() {
    let (server, bytes, _) = bucket(KEY_ID);
    // No endpoint in the options: the URL's host is where the requests go.
    let mut options = RemoteOptions::default();
    options.request_size(65_536).unwrap();
    let url = format!("{}/test-bucket/private/object.bin", server.endpoint());
    let file = RemoteFile::open_as(&url, EndpointKind::S3, &options).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::S3);
    assert_eq!(file.url().to_string(), "s3://test-bucket/private/object.bin");
    reads_exactly(&file, &bytes);
    assert_eq!(server.unsigned_and_signed_requests().0, 0);
    let public = format!("{}/test-bucket/pub/object.bin", server.endpoint());
    let file = RemoteFile::open_as(&public, EndpointKind::S3Public, &options).unwrap();
    reads_exactly(&file, &bytes);
    // A URL that names a bucket but no key is refused before any request.
    let before = server.heads() + server.gets();
    let bare = format!("{}/test-bucket", server.endpoint());
    let e = RemoteFile::open_as(&bare, EndpointKind::S3, &options).unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::InvalidUrl, .. }), "{e:?}");
    assert_eq!(server.heads() + server.gets(), before);
}

#[test]
fn a_virtual_hosted_endpoint_holds_the_bucket_so_the_path_is_the_key() {
    let (server, bytes, mut options) = bucket(KEY_ID);
    // The bucket's own host: requests name the key alone.
    server.put("/dir/vh.bin", bytes.clone());
    options.s3_virtual_hosted(true);
    let file = RemoteFile::open_with("s3://test-bucket/dir/vh.bin", &options).unwrap();
    // Had the bucket gone into the path too, `/test-bucket/dir/vh.bin` would be asked for,
    // and the server holds that object only under `/dir/vh.bin` with this key: compare both.
    reads_exactly(&file, &bytes);
    options.s3_virtual_hosted(false);
    let e = RemoteFile::open_with("s3://test-bucket/dir/vh.bin", &options).unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::NotFound, .. }), "{e:?}");
}

#[test]
fn each_kind_opens_only_urls_of_its_form() {
    let server = Server::http();
    let bytes = common::random_bytes(5_000, 3);
    server.put("/b/k.bin", bytes.clone());
    let plain = format!("{}/b/k.bin", server.endpoint());
    let presigned = format!("{plain}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=s3cr3t");
    let options = RemoteOptions::default();
    let file = RemoteFile::open_as(&presigned, EndpointKind::S3PresignedUrl, &options).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::S3PresignedUrl);
    reads_exactly(&file, &bytes);
    let file = RemoteFile::open_as(&plain, EndpointKind::Http, &options).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::Http);
    let file = RemoteFile::open_auto(&plain, &EndpointKind::ALL, &options).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::Http);
    for (url, kind) in [
        (plain.as_str(), EndpointKind::S3PresignedUrl),
        (plain.as_str(), EndpointKind::WebHdfs),
        ("s3://bkt/k.bin", EndpointKind::Http),
        ("s3://bkt/k.bin", EndpointKind::S3PresignedUrl),
    ] {
        match RemoteFile::open_as(url, kind, &options) {
            Err(Error::Remote {
                kind: RemoteErrorKind::InvalidUrl, reason, url: shown, ..
            }) => {
                assert!(
                    !shown.contains("s3cr3t") && !reason.contains("s3cr3t"),
                    "{shown} {reason}"
                );
            }
            other => panic!("{url} opened as {kind}: {other:?}"),
        }
    }
}
