//! One conformance suite for the bucket stores other than S3 (GCS, Azure), run by each store's
//! test binary against its stand-in of [`server`](crate::server): reads signed and unsigned and
//! the fall-backs between them, writes (a multipart upload and a one-PUT object) and a prefix
//! used as a directory, byte for byte. A binary sets its store's environment (the endpoint,
//! no other credentials, no metadata service) before it runs the suite; the suite sets and
//! removes the store's token itself.

use std::time::Duration;

use gpumap::error::{Error, RemoteErrorKind};
use gpumap::remote::{
    EndpointKind, RemoteEntry, RemoteFile, RemoteOptions, RemotePrefix, RemoteWriter,
};

use crate::common;
use crate::server::{Fault, Server};

/// A store under test, and how its stand-in answers.
pub struct Store {
    /// `gs`, `az`.
    pub scheme: &'static str,
    /// The bucket (or container) the suite uses.
    pub bucket: &'static str,
    /// The kind of its signed requests.
    pub signed: EndpointKind,
    /// The kind of its unsigned requests.
    pub unsigned: EndpointKind,
    /// The variable whose bearer token the stand-in wants.
    pub token_var: &'static str,
    /// The status of an unsigned request for a private object.
    pub refuses_anonymous: u16,
    /// The status of a request signed with another token.
    pub refuses_other_token: u16,
}

impl Store {
    /// The URL of `key` in the suite's bucket.
    pub fn url(&self, key: &str) -> String {
        format!("{}://{}/{key}", self.scheme, self.bucket)
    }

    /// The stand-in's path of `key`.
    pub fn path(&self, key: &str) -> String {
        format!("/{}/{key}", self.bucket)
    }
}

/// Short backoffs, and requests of 64 KiB, so that a test object is many requests.
pub fn options() -> RemoteOptions {
    let mut options = RemoteOptions::default();
    options.backoff(Duration::from_millis(5), Duration::from_millis(20));
    options.request_size(65_536).unwrap();
    options
}

/// Reads all of `file` but its first 5 bytes, in requests of 64 KiB in parallel, and checks
/// them against `bytes`.
pub fn reads_exactly(file: &RemoteFile, bytes: &[u8]) {
    assert_eq!(file.len(), bytes.len() as u64);
    let mut out = vec![0u8; bytes.len() - 5];
    assert_eq!(file.read(&mut out, 5).unwrap(), out.len());
    assert!(out == bytes[5..], "the bytes read differ from the object's");
}

/// The kind, status and message of an open that failed remotely.
pub fn kind_of(result: gpumap::Result<RemoteFile>) -> (RemoteErrorKind, Option<u16>, String) {
    match result {
        Err(e @ Error::Remote { .. }) => {
            let Error::Remote { kind, status, .. } = &e else { unreachable!() };
            (*kind, *status, gpumap::error::Report(&e).to_string())
        }
        other => panic!("not a remote error: {other:?}"),
    }
}

/// Reads on a fresh `server`: signed where the token is set (503s retried), a missing object
/// typed, unsigned for a public object (a private one refused), the fall-back to unsigned
/// after another token is refused (and none where the unsigned kind is not allowed), a token
/// no header can hold refused at open, and unsigned first with no token at all. Returns the
/// public object's URL and bytes; the token is left unset.
pub fn reads_signed_or_unsigned(server: &Server, store: &Store, token: &str) -> (String, Vec<u8>) {
    let bytes = common::random_bytes(1_000_003, 17);
    server.put(&store.path("private/weights.bin"), bytes.clone());
    server.put(&store.path("pub/weights.bin"), bytes.clone());
    server.make_public(&store.path("pub/weights.bin"));
    std::env::set_var(store.token_var, token);

    // Credentials configured: signed, byte for byte, 503s retried.
    let private = store.url("private/weights.bin");
    let file = RemoteFile::open_with(&private, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), store.signed);
    assert_eq!(file.url().to_string(), private);
    server.inject([Fault::Status(503), Fault::Status(503)]);
    reads_exactly(&file, &bytes);
    assert_eq!(server.unsigned_and_signed_requests().0, 0);
    // A missing object: typed, naming the URL and not the token.
    let missing = store.url("missing.bin");
    let (kind, status, text) = kind_of(RemoteFile::open_with(&missing, &options()));
    assert_eq!((kind, status), (RemoteErrorKind::NotFound, Some(404)), "{text}");
    assert!(text.contains(&missing) && !text.contains(token), "{text}");

    // Public objects read unsigned when asked; a private one is refused unsigned.
    let (unsigned_before, signed_before) = server.unsigned_and_signed_requests();
    let public = store.url("pub/weights.bin");
    let file = RemoteFile::open_as(&public, store.unsigned, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), store.unsigned);
    reads_exactly(&file, &bytes);
    let (unsigned, signed) = server.unsigned_and_signed_requests();
    assert!(unsigned > unsigned_before + 10 && signed == signed_before, "{unsigned} / {signed}");
    let (kind, status, text) = kind_of(RemoteFile::open_as(&private, store.unsigned, &options()));
    let refused = (RemoteErrorKind::AccessDenied, Some(store.refuses_anonymous));
    assert_eq!((kind, status), refused, "{text}");

    // A token the server refuses: a public object falls back to unsigned requests; a private
    // one is refused both ways, typed, the token in no message.
    std::env::set_var(store.token_var, "some-other-token");
    let file = RemoteFile::open_with(&public, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), store.unsigned);
    reads_exactly(&file, &bytes);
    let (kind, status, text) = kind_of(RemoteFile::open_with(&private, &options()));
    let refused = (RemoteErrorKind::AccessDenied, Some(store.refuses_other_token));
    assert_eq!((kind, status), refused, "{text}");
    assert!(!text.contains("some-other-token"), "{text}");
    // Without the unsigned kind allowed, the refusal stands.
    let (kind, _, _) = kind_of(RemoteFile::open_auto(&public, &[store.signed], &options()));
    assert_eq!(kind, RemoteErrorKind::AccessDenied);

    // A token no header can hold (object_store's request panics on it): refused at open,
    // naming the variable, not the token.
    std::env::set_var(store.token_var, "tok\u{1}en");
    let e = RemoteFile::open_with(&private, &options()).unwrap_err();
    assert!(matches!(&e, Error::InvalidConfig { var, .. } if var == store.token_var), "{e:?}");
    assert!(!gpumap::error::Report(&e).to_string().contains("tok\u{1}en"), "{e:?}");

    // No credentials anywhere: a public object is read unsigned first, with no signed request.
    std::env::remove_var(store.token_var);
    let signed_before = server.unsigned_and_signed_requests().1;
    let file = RemoteFile::open_with(&public, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), store.unsigned);
    reads_exactly(&file, &bytes);
    assert_eq!(server.unsigned_and_signed_requests().1, signed_before);
    (public, bytes)
}

/// Writes and a prefix, on a server no test has written to: with no token (and a metadata
/// service that refuses) a write fails and stores nothing; with it, an 11 MiB object of three parts written back to front and a
/// one-PUT object read back byte for byte; the prefix `out/` listed, sized, opened, written and
/// deleted through one client (a name with no object no error); with no token again, the
/// prefix signs, or goes unsigned once the bucket lists to anyone. The token is left unset.
pub fn writes_and_prefixes(server: &Server, store: &Store, token: &str) {
    let written = common::random_bytes(11 * 1024 * 1024 + 7, 23);
    std::env::remove_var(store.token_var);
    let writer = RemoteWriter::create_with(&store.url("out/nope.bin"), &options()).unwrap();
    let wrote = writer.pwrite(&written[..1000], 0).and_then(|_| writer.finish());
    // No token, and the metadata service the binary points at refuses: the signed write
    // finds no credentials, fails typed, and stores nothing.
    assert!(
        matches!(wrote, Err(Error::Remote { kind: RemoteErrorKind::Connection, .. })),
        "{wrote:?}"
    );
    assert_eq!(server.object(&store.path("out/nope.bin")), None);
    std::env::set_var(store.token_var, token);
    let mut parts = options();
    parts.part_size(5 * 1024 * 1024).unwrap();
    let out = store.url("out/big.bin");
    let writer = RemoteWriter::create_with(&out, &parts).unwrap();
    // Written back to front, in pieces that straddle the parts.
    let step = 3 * 1024 * 1024 + 1;
    let pieces: Vec<(usize, &[u8])> = written.chunks(step).enumerate().collect();
    for &(i, bytes) in pieces.iter().rev() {
        writer.pwrite(bytes, (i * step) as u64).unwrap();
    }
    assert_eq!(writer.finish().unwrap(), written.len() as u64);
    assert!(server.completes() == 1 && server.part_puts() == 3);
    assert!(server.object(&store.path("out/big.bin")).as_deref() == Some(&written[..]));
    reads_exactly(&RemoteFile::open_with(&out, &options()).unwrap(), &written);
    let small = RemoteWriter::create_with(&store.url("out/small.bin"), &options()).unwrap();
    small.pwrite(&written[..4097], 0).unwrap();
    small.finish().unwrap();
    assert!(server.object(&store.path("out/small.bin")).as_deref() == Some(&written[..4097]));

    // A prefix: listed, sized, opened, written and deleted through one client.
    let prefix = RemotePrefix::open_auto(&store.url("out"), &options()).unwrap();
    assert!(!prefix.is_unsigned());
    assert_eq!(prefix.url().to_string(), store.url("out/"));
    let entry = |name: &str, len: usize| RemoteEntry { name: name.into(), len: len as u64 };
    let all = |p: &RemotePrefix| p.list("").unwrap().collect::<gpumap::Result<Vec<_>>>().unwrap();
    assert_eq!(all(&prefix), [entry("big.bin", written.len()), entry("small.bin", 4097)]);
    assert_eq!(prefix.len_of("small.bin").unwrap(), Some(4097));
    assert_eq!(prefix.url_of("a b.bin").unwrap().to_string(), store.url("out/a%20b.bin"));
    reads_exactly(&prefix.open_file("big.bin", None).unwrap(), &written);
    let new = prefix.create_file("sub/new.bin", None).unwrap();
    new.pwrite(b"hello", 0).unwrap();
    new.finish().unwrap();
    let level = prefix.list_dir("").unwrap();
    assert_eq!((level.objects.len(), level.dirs), (2, vec!["sub".to_owned()]));
    // A name with no object is no error, though these stores answer its delete with 404.
    prefix.delete(&["small.bin", "sub/new.bin", "never-written.bin"]).unwrap();
    assert_eq!(server.object(&store.path("out/small.bin")), None);
    assert_eq!(all(&prefix), [entry("big.bin", written.len())]);
    // With no credentials: signed where the bucket lists to no one (with no credentials found
    // then), unsigned where it lists to anyone.
    std::env::remove_var(store.token_var);
    assert!(!RemotePrefix::open_auto(&store.url("out/"), &options()).unwrap().is_unsigned());
    server.make_public(&format!("/{}", store.bucket));
    let public = RemotePrefix::open_auto(&store.url("out/"), &options()).unwrap();
    assert!(public.is_unsigned());
    assert_eq!(all(&public), [entry("big.bin", written.len())]);
}
