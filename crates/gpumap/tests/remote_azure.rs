//! Azure Blob Storage blobs (`az://container/blob`) and prefixes read, written and listed
//! through object_store's Azure client, against the Azure stand-in of tests/remote/server.rs on
//! 127.0.0.1 (`AZURE_STORAGE_ENDPOINT` points the client there): byte for byte, retried, signed
//! with a bearer token or unsigned for public blobs, and the fall-back between the two. A test
//! binary of its own with one test: it sets the process's Azure variables phase by phase.
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

const TOKEN: &str = "gpumap-test-azure-token";

/// The variables by which object_store could find Azure credentials other than the test's.
const OTHER_AZURE_CREDENTIALS: [&str; 11] = [
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_MASTER_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_USE_AZURE_CLI",
    "AZURE_STORAGE_USE_EMULATOR",
];

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
    assert!(out == bytes[5..], "the bytes read differ from the blob's");
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
fn azure_blobs_are_read_and_written_signed_or_unsigned() {
    let server = Server::azure(TOKEN);
    let bytes = common::random_bytes(1_000_003, 19);
    server.put("/models/private/weights.bin", bytes.clone());
    server.put("/models/pub/weights.bin", bytes.clone());
    server.make_public("/models/pub/weights.bin");
    // This binary has this one test, so no other thread reads the environment while it changes.
    for var in OTHER_AZURE_CREDENTIALS {
        std::env::remove_var(var);
    }
    // A signed try with no credentials asks a managed identity's endpoint: here a port that
    // refuses at once, not the link-local address of a machine without a network.
    std::env::set_var("AZURE_MSI_ENDPOINT", "http://127.0.0.1:9/token");
    std::env::set_var("IDENTITY_ENDPOINT", "http://127.0.0.1:9/token");
    std::env::set_var("AZURE_STORAGE_ACCOUNT_NAME", "gpumapacct");
    std::env::set_var("AZURE_STORAGE_ENDPOINT", server.endpoint());
    std::env::set_var("AZURE_STORAGE_TOKEN", TOKEN);

    // Credentials configured: signed, byte for byte, 503s retried.
    let private = "az://models/private/weights.bin";
    let file = RemoteFile::open_with(private, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::Azure);
    assert_eq!(file.url().to_string(), private);
    server.inject([Fault::Status(503), Fault::Status(503)]);
    reads_exactly(&file, &bytes);
    assert_eq!(server.unsigned_and_signed_requests().0, 0);
    // A missing blob: typed, naming the URL.
    let (kind, status, text) =
        kind_of(RemoteFile::open_with("az://models/missing.bin", &options()));
    assert_eq!((kind, status), (RemoteErrorKind::NotFound, Some(404)), "{text}");
    assert!(text.contains("az://models/missing.bin") && !text.contains(TOKEN), "{text}");

    // Public blobs read unsigned when asked; a private one is refused unsigned, as an account
    // without anonymous access refuses it (409).
    let (unsigned_before, signed_before) = server.unsigned_and_signed_requests();
    let public_url = "az://models/pub/weights.bin";
    let file = RemoteFile::open_as(public_url, EndpointKind::AzurePublic, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::AzurePublic);
    reads_exactly(&file, &bytes);
    let (unsigned, signed) = server.unsigned_and_signed_requests();
    assert!(unsigned > unsigned_before + 10 && signed == signed_before, "{unsigned} / {signed}");
    let (kind, status, text) =
        kind_of(RemoteFile::open_as(private, EndpointKind::AzurePublic, &options()));
    assert_eq!((kind, status), (RemoteErrorKind::AccessDenied, Some(409)), "{text}");

    // Credentials the server refuses: a public blob falls back to unsigned requests; a
    // private one is refused both ways, typed.
    std::env::set_var("AZURE_STORAGE_TOKEN", "some-other-token");
    let file = RemoteFile::open_with(public_url, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::AzurePublic);
    reads_exactly(&file, &bytes);
    let (kind, status, text) = kind_of(RemoteFile::open_with(private, &options()));
    assert_eq!((kind, status), (RemoteErrorKind::AccessDenied, Some(403)), "{text}");
    assert!(!text.contains("some-other-token"), "{text}");
    let only_signed = [EndpointKind::Azure];
    let (kind, _, _) = kind_of(RemoteFile::open_auto(public_url, &only_signed, &options()));
    assert_eq!(kind, RemoteErrorKind::AccessDenied);

    // A token no header can hold (object_store's request would panic on it): refused at open,
    // naming the variable, not the token.
    std::env::set_var("AZURE_STORAGE_TOKEN", "tok\u{1}en");
    let e = RemoteFile::open_with(private, &options()).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidConfig { var, .. } if var == "AZURE_STORAGE_TOKEN"),
        "{e:?}"
    );
    assert!(!gpumap::error::Report(&e).to_string().contains("tok\u{1}en"), "{e:?}");

    // No credentials anywhere: a public blob is read unsigned first, with no signed request; a
    // private one is refused unsigned (409), then signed with a managed identity that is not
    // there.
    std::env::remove_var("AZURE_STORAGE_TOKEN");
    let signed_before = server.unsigned_and_signed_requests().1;
    let file = RemoteFile::open_with(public_url, &options()).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::AzurePublic);
    reads_exactly(&file, &bytes);
    assert_eq!(server.unsigned_and_signed_requests().1, signed_before);
    let (kind, status, _) = kind_of(RemoteFile::open_with(private, &options()));
    assert_eq!((kind, status), (RemoteErrorKind::AccessDenied, Some(409)));

    // Writes: with no credentials, refused and nothing stored; with the token, blocks put and
    // committed as one blob, and a one-PUT blob, read back byte for byte.
    let written = common::random_bytes(11 * 1024 * 1024 + 7, 29);
    let writer = RemoteWriter::create_with("az://models/out/nope.bin", &options()).unwrap();
    let wrote = writer.pwrite(&written[..1000], 0).and_then(|_| writer.finish());
    assert!(wrote.is_err(), "{wrote:?}");
    assert_eq!(server.object("/models/out/nope.bin"), None);
    std::env::set_var("AZURE_STORAGE_TOKEN", TOKEN);
    let mut parts = options();
    parts.part_size(5 * 1024 * 1024).unwrap();
    let out = "az://models/out/big.bin";
    let writer = RemoteWriter::create_with(out, &parts).unwrap();
    // Written back to front, in pieces that straddle the blocks.
    let step = 3 * 1024 * 1024 + 1;
    let pieces: Vec<(usize, &[u8])> = written.chunks(step).enumerate().collect();
    for &(i, bytes) in pieces.iter().rev() {
        writer.pwrite(bytes, (i * step) as u64).unwrap();
    }
    assert_eq!(writer.finish().unwrap(), written.len() as u64);
    assert!(server.completes() == 1 && server.part_puts() == 3);
    assert!(server.object("/models/out/big.bin").as_deref() == Some(&written[..]));
    reads_exactly(&RemoteFile::open_with(out, &options()).unwrap(), &written);
    let small = RemoteWriter::create_with("az://models/out/small.bin", &options()).unwrap();
    small.pwrite(&written[..4097], 0).unwrap();
    small.finish().unwrap();
    assert!(server.object("/models/out/small.bin").as_deref() == Some(&written[..4097]));
    // A block refused for good: the upload fails and no blob is committed.
    server.inject_writes([server::WriteFault::Status(400)]);
    let failing = RemoteWriter::create_with("az://models/out/failed.bin", &parts).unwrap();
    let wrote = failing.pwrite(&written, 0).and_then(|_| failing.finish());
    assert!(wrote.is_err(), "{wrote:?}");
    assert_eq!(server.object("/models/out/failed.bin"), None);

    // A prefix: listed (two blobs a page, so that the listing pages on), sized, opened,
    // written and deleted through one client.
    server.list_page_size(2);
    let prefix = RemotePrefix::open_auto("az://models/out", &options()).unwrap();
    assert!(!prefix.is_unsigned());
    assert_eq!(prefix.url().to_string(), "az://models/out/");
    let entry = |name: &str, len: usize| RemoteEntry { name: name.into(), len: len as u64 };
    let all = |p: &RemotePrefix| p.list("").unwrap().collect::<gpumap::Result<Vec<_>>>().unwrap();
    assert_eq!(all(&prefix), [entry("big.bin", written.len()), entry("small.bin", 4097)]);
    assert_eq!(prefix.len_of("small.bin").unwrap(), Some(4097));
    assert_eq!(prefix.url_of("a b.bin").unwrap().to_string(), "az://models/out/a%20b.bin");
    reads_exactly(&prefix.open_file("big.bin", None).unwrap(), &written);
    for name in ["sub/new.bin", "tail-1.bin", "tail-2.bin"] {
        let new = prefix.create_file(name, None).unwrap();
        new.pwrite(b"hello", 0).unwrap();
        new.finish().unwrap();
    }
    let level = prefix.list_dir("").unwrap();
    assert_eq!((level.objects.len(), level.dirs), (4, vec!["sub".to_owned()]));
    // A page that fails is asked again from the last blob given out: Azure's `startFrom`
    // names that blob again (object_store drops it), and it is not given twice.
    // (The first page answered well, the second refused once.)
    server.inject([Fault::Stall(Duration::ZERO), Fault::Status(503)]);
    let names: Vec<String> = prefix.list("").unwrap().map(|e| e.unwrap().name).collect();
    assert_eq!(names, ["big.bin", "small.bin", "sub/new.bin", "tail-1.bin", "tail-2.bin"]);
    // Deleted through Azure's batches; a name with no blob is no error.
    prefix.delete(&["small.bin", "sub/new.bin", "never-written.bin"]).unwrap();
    assert_eq!(server.object("/models/out/small.bin"), None);
    prefix.delete(&["tail-1.bin", "tail-2.bin"]).unwrap();
    assert_eq!(all(&prefix), [entry("big.bin", written.len())]);
    // With no credentials: unsigned where the container lists to anyone, else signed.
    std::env::remove_var("AZURE_STORAGE_TOKEN");
    assert!(!RemotePrefix::open_auto("az://models/out/", &options()).unwrap().is_unsigned());
    server.make_public("/models");
    let public = RemotePrefix::open_auto("az://models/out/", &options()).unwrap();
    assert!(public.is_unsigned());
    assert_eq!(all(&public), [entry("big.bin", written.len())]);

    // Settings object_store would panic on, or refuse without naming the variable: refused
    // at open, naming it.
    for bad in ["not a url", "http://127.0.0.1:9/\u{1}", "ftp://host", "mailto:x@y"] {
        std::env::set_var("AZURE_STORAGE_ENDPOINT", bad);
        let e = RemoteFile::open_with(public_url, &options()).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("AZURE_STORAGE_ENDPOINT")),
            "{e:?}"
        );
    }
    std::env::set_var("AZURE_STORAGE_ENDPOINT", server.endpoint());
    // Where a signed open asks for its token, and what goes into that request's path and
    // headers (object_store's token requests panicked on each).
    let named = |e: &Error, var: &str| match e {
        Error::InvalidArgument(m) => m.contains(var),
        Error::InvalidConfig { var: named, .. } => named == var,
        _ => false,
    };
    std::env::set_var("AZURE_CLIENT_ID", "client");
    std::env::set_var("AZURE_CLIENT_SECRET", "secret");
    std::env::set_var("AZURE_TENANT_ID", "contoso.onmicrosoft.com");
    for (var, bad) in [
        ("IDENTITY_ENDPOINT", "::::"),
        ("AZURE_AUTHORITY_HOST", "mailto:x"),
        ("AZURE_AUTHORITY_HOST", "http://a b"),
        ("AZURE_TENANT_ID", "t\u{1}"),
        ("AZURE_TENANT_ID", "a/b?c"),
        ("AZURE_FABRIC_TOKEN_SERVICE_URL", "mailto:x"),
        ("AZURE_FABRIC_WORKLOAD_HOST", "h\u{1}"),
    ] {
        let kept = std::env::var(var).ok();
        std::env::set_var(var, bad);
        let e = RemoteFile::open_as(private, EndpointKind::Azure, &options()).unwrap_err();
        assert!(named(&e, var), "{var}={bad:?}: {e:?}");
        match kept {
            Some(value) => std::env::set_var(var, value),
            None => std::env::remove_var(var),
        }
    }
    for var in ["AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID", "AZURE_MSI_ENDPOINT"] {
        std::env::remove_var(var);
    }
    for bad in ["Upper", "a\u{1}b", "x", "has-dash"] {
        std::env::set_var("AZURE_STORAGE_ACCOUNT_NAME", bad);
        let e = RemoteFile::open_with(public_url, &options()).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidConfig { var, .. } if var == "AZURE_STORAGE_ACCOUNT_NAME"),
            "{bad:?}: {e:?}"
        );
    }
    std::env::remove_var("AZURE_STORAGE_ACCOUNT_NAME");
    let e = RemoteFile::open_with(public_url, &options()).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidConfig { var, .. } if var == "AZURE_STORAGE_ACCOUNT_NAME"),
        "{e:?}"
    );
}
