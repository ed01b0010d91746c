//! Google Cloud Storage objects (`gs://bucket/object`) and prefixes read, written and listed
//! through object_store's GCS client, against the GCS stand-in of tests/remote/server.rs on
//! 127.0.0.1 (`GOOGLE_BASE_URL` points the client there): byte for byte, retried, signed with a
//! bearer token or unsigned for public objects, and the fall-back between the two. A test
//! binary of its own with one test: it sets the process's Google variables phase by phase.
#![cfg(feature = "remote")]

mod common;
#[allow(dead_code)] // This binary uses a part of the shared responder only.
#[path = "remote/server.rs"]
mod server;

use std::time::Duration;

use gpumap::error::{Error, RemoteErrorKind};
use gpumap::remote::{
    EndpointKind, RemoteEntry, RemoteFile, RemoteOptions, RemotePrefix, RemoteWriter,
};
use server::{Fault, Server};

const TOKEN: &str = "gpumap-test-bearer-token";

fn options() -> RemoteOptions {
    let mut options = RemoteOptions::default();
    options.backoff(Duration::from_millis(5), Duration::from_millis(20));
    options.request_size(65_536).unwrap();
    options
}

/// Reads all of `file` but its first 5 bytes, in requests of 64 KiB in parallel, and checks
/// them against `bytes`.
fn reads_exactly(file: &RemoteFile, bytes: &[u8]) {
    assert_eq!(file.len(), bytes.len() as u64);
    let mut out = vec![0u8; bytes.len() - 5];
    assert_eq!(file.read(&mut out, 5).unwrap(), out.len());
    assert!(out == bytes[5..], "the bytes read differ from the object's");
}

fn kind_of(result: gpumap::Result<RemoteFile>) -> (RemoteErrorKind, Option<u16>, String) {
    match result {
        Err(e @ Error::Remote { .. }) => {
            let Error::Remote { kind, status, .. } = &e else { unreachable!() };
            (*kind, *status, gpumap::error::Report(&e).to_string())
        }
        other => panic!("not a remote error: {other:?}"),
    }
}

#[test]
fn gcs_objects_are_read_and_written_signed_or_unsigned() {
    let server = Server::gcs(TOKEN);
    let bytes = common::random_bytes(1_000_003, 17);
    server.put("/gpumap-bkt/private/weights.bin", bytes.clone());
    server.put("/gpumap-bkt/pub/weights.bin", bytes.clone());
    server.make_public("/gpumap-bkt/pub/weights.bin");
    let home = std::env::temp_dir().join(format!("gpumap-gcs-home-{}", std::process::id()));
    // This binary has this one test, so no other thread reads the environment while it changes.
    for var in [
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_PATH",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        "SERVICE_ACCOUNT",
    ] {
        std::env::remove_var(var);
    }
    std::env::set_var("HOME", &home); // no gcloud credentials file
    std::env::set_var("GOOGLE_BASE_URL", server.endpoint());
    std::env::set_var("GOOGLE_BEARER_TOKEN", TOKEN);

    // Credentials configured: signed, byte for byte, 503s retried.
    let private = "gs://gpumap-bkt/private/weights.bin";
    let file = RemoteFile::open_with(private, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::Gcs);
    assert_eq!(file.url().to_string(), private);
    server.inject([Fault::Status(503), Fault::Status(503)]);
    reads_exactly(&file, &bytes);
    assert_eq!(server.unsigned_and_signed_requests().0, 0);
    // A missing object: typed, naming the URL.
    let (kind, status, text) =
        kind_of(RemoteFile::open_with("gs://gpumap-bkt/missing.bin", &options()));
    assert_eq!((kind, status), (RemoteErrorKind::NotFound, Some(404)), "{text}");
    assert!(text.contains("gs://gpumap-bkt/missing.bin") && !text.contains(TOKEN), "{text}");

    // Public objects read unsigned when asked; a private one is refused unsigned.
    let (unsigned_before, signed_before) = server.unsigned_and_signed_requests();
    let public_url = "gs://gpumap-bkt/pub/weights.bin";
    let file = RemoteFile::open_as(public_url, EndpointKind::GcsPublic, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::GcsPublic);
    reads_exactly(&file, &bytes);
    let (unsigned, signed) = server.unsigned_and_signed_requests();
    assert!(unsigned > unsigned_before + 10 && signed == signed_before, "{unsigned} / {signed}");
    let (kind, status, _) =
        kind_of(RemoteFile::open_as(private, EndpointKind::GcsPublic, &options()));
    assert_eq!((kind, status), (RemoteErrorKind::AccessDenied, Some(401)));

    // Credentials the server refuses: a public object falls back to unsigned requests; a
    // private one is refused both ways, typed.
    std::env::set_var("GOOGLE_BEARER_TOKEN", "some-other-token");
    let file = RemoteFile::open_with(public_url, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::GcsPublic);
    reads_exactly(&file, &bytes);
    let (kind, _, text) = kind_of(RemoteFile::open_with(private, &options()));
    assert_eq!(kind, RemoteErrorKind::AccessDenied);
    assert!(!text.contains("some-other-token"), "{text}");
    // Without GCS_PUBLIC allowed, the refusal stands.
    let only_signed = [EndpointKind::Gcs];
    let (kind, _, _) = kind_of(RemoteFile::open_auto(public_url, &only_signed, &options()));
    assert_eq!(kind, RemoteErrorKind::AccessDenied);

    // A token no header can hold (object_store's request panicked on it): refused at open,
    // naming the variable, not the token.
    std::env::set_var("GOOGLE_BEARER_TOKEN", "tok\u{1}en");
    let e = RemoteFile::open_with(private, &options()).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidConfig { var, .. } if var == "GOOGLE_BEARER_TOKEN"),
        "{e:?}"
    );
    assert!(!gpumap::error::Report(&e).to_string().contains("tok\u{1}en"), "{e:?}");

    // No credentials anywhere: a public object is read unsigned first, with no signed request.
    std::env::remove_var("GOOGLE_BEARER_TOKEN");
    let signed_before = server.unsigned_and_signed_requests().1;
    let file = RemoteFile::open_with(public_url, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::GcsPublic);
    reads_exactly(&file, &bytes);
    assert_eq!(server.unsigned_and_signed_requests().1, signed_before);

    // Writes: unsigned (no credentials), refused and nothing stored; with the token, a
    // multipart upload of three parts and a one-PUT object, read back byte for byte.
    let written = common::random_bytes(11 * 1024 * 1024 + 7, 23);
    let writer = RemoteWriter::create_with("gs://gpumap-bkt/out/nope.bin", &options()).unwrap();
    let wrote = writer.pwrite(&written[..1000], 0).and_then(|_| writer.finish());
    assert!(
        matches!(wrote, Err(Error::Remote { kind: RemoteErrorKind::AccessDenied, .. })),
        "{wrote:?}"
    );
    assert_eq!(server.object("/gpumap-bkt/out/nope.bin"), None);
    std::env::set_var("GOOGLE_BEARER_TOKEN", TOKEN);
    let mut parts = options();
    parts.part_size(5 * 1024 * 1024).unwrap();
    let out = "gs://gpumap-bkt/out/big.bin";
    let writer = RemoteWriter::create_with(out, &parts).unwrap();
    // Written back to front, in pieces that straddle the parts.
    let step = 3 * 1024 * 1024 + 1;
    let pieces: Vec<(usize, &[u8])> = written.chunks(step).enumerate().collect();
    for &(i, bytes) in pieces.iter().rev() {
        writer.pwrite(bytes, (i * step) as u64).unwrap();
    }
    assert_eq!(writer.finish().unwrap(), written.len() as u64);
    assert!(server.completes() == 1 && server.part_puts() == 3);
    assert!(server.object("/gpumap-bkt/out/big.bin").as_deref() == Some(&written[..]));
    reads_exactly(&RemoteFile::open_with(out, &options()).unwrap(), &written);
    let small = RemoteWriter::create_with("gs://gpumap-bkt/out/small.bin", &options()).unwrap();
    small.pwrite(&written[..4097], 0).unwrap();
    small.finish().unwrap();
    assert!(server.object("/gpumap-bkt/out/small.bin").as_deref() == Some(&written[..4097]));

    // A prefix: listed, sized, opened, written and deleted through one client.
    let prefix = RemotePrefix::open_auto("gs://gpumap-bkt/out", &options()).unwrap();
    assert!(!prefix.is_unsigned());
    assert_eq!(prefix.url().to_string(), "gs://gpumap-bkt/out/");
    let entry = |name: &str, len: usize| RemoteEntry { name: name.into(), len: len as u64 };
    let all = |p: &RemotePrefix| p.list("").unwrap().collect::<gpumap::Result<Vec<_>>>().unwrap();
    assert_eq!(all(&prefix), [entry("big.bin", written.len()), entry("small.bin", 4097)]);
    assert_eq!(prefix.len_of("small.bin").unwrap(), Some(4097));
    assert_eq!(prefix.url_of("a b.bin").unwrap().to_string(), "gs://gpumap-bkt/out/a%20b.bin");
    reads_exactly(&prefix.open_file("big.bin", None).unwrap(), &written);
    let new = prefix.create_file("sub/new.bin", None).unwrap();
    new.pwrite(b"hello", 0).unwrap();
    new.finish().unwrap();
    let level = prefix.list_dir("").unwrap();
    assert_eq!((level.objects.len(), level.dirs), (2, vec!["sub".to_owned()]));
    // A name with no object is no error, though GCS answers its delete with 404.
    prefix.delete(&["small.bin", "sub/new.bin", "never-written.bin"]).unwrap();
    assert_eq!(server.object("/gpumap-bkt/out/small.bin"), None);
    assert_eq!(all(&prefix), [entry("big.bin", written.len())]);
    // With no credentials: unsigned where the bucket lists to anyone, else signed (here with
    // no metadata server to give credentials: a port that refuses at once).
    std::env::remove_var("GOOGLE_BEARER_TOKEN");
    std::env::set_var("GCE_METADATA_HOST", "127.0.0.1:9");
    std::env::set_var("GCE_METADATA_IP", "127.0.0.1:9");
    assert!(!RemotePrefix::open_auto("gs://gpumap-bkt/out/", &options()).unwrap().is_unsigned());
    server.make_public("/gpumap-bkt");
    let public = RemotePrefix::open_auto("gs://gpumap-bkt/out/", &options()).unwrap();
    assert!(public.is_unsigned());
    assert_eq!(all(&public), [entry("big.bin", written.len())]);

    // An endpoint object_store would panic on when it puts a request together: refused at open.
    for bad in ["not a url", "http://127.0.0.1:9/\u{1}", "ftp://host"] {
        std::env::set_var("GOOGLE_BASE_URL", bad);
        let e = RemoteFile::open_with(public_url, &options()).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("GOOGLE_BASE_URL")), "{e:?}");
    }
}
