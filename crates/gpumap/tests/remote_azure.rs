//! Azure Blob Storage blobs (`az://container/blob`) and prefixes read, written and listed
//! through object_store's Azure client, against the Azure stand-in of tests/remote/server.rs on
//! 127.0.0.1 (`AZURE_STORAGE_ENDPOINT` points the client there): byte for byte, retried, signed
//! with a bearer token or unsigned for public blobs, and the fall-back between the two. A test
//! binary of its own with one test: it sets the process's Azure variables phase by phase.
#![cfg(feature = "remote")]

#[path = "remote/bucket_suite.rs"]
mod bucket_suite;
mod common;
#[allow(dead_code)] // This binary uses a part of the shared responder only.
#[path = "remote/server.rs"]
mod server;

use std::time::Duration;

use bucket_suite::{kind_of, options, Store};
use gpumap::error::{Error, RemoteErrorKind};
use gpumap::remote::{EndpointKind, RemoteFile, RemotePrefix, RemoteWriter};
use server::{Fault, Server};

const TOKEN: &str = "gpumap-test-azure-token";

/// Azure's stand-in refuses an unsigned request for a private blob as an account without
/// anonymous access refuses it (409), and another token with 403.
const AZURE: Store = Store {
    scheme: "az",
    bucket: "models",
    signed: EndpointKind::Azure,
    unsigned: EndpointKind::AzurePublic,
    token_var: "AZURE_STORAGE_TOKEN",
    refuses_anonymous: 409,
    refuses_other_token: 403,
};

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

#[test]
fn azure_blobs_are_read_and_written_signed_or_unsigned() {
    let server = Server::azure(TOKEN);
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

    let (public_url, _) = bucket_suite::reads_signed_or_unsigned(&server, &AZURE, TOKEN);
    // With no credentials, a private blob is refused unsigned (409), and the signed try finds
    // no managed identity: the unsigned refusal is what is reported.
    let private = AZURE.url("private/weights.bin");
    let (kind, status, _) = kind_of(RemoteFile::open_with(&private, &options()));
    assert_eq!((kind, status), (RemoteErrorKind::AccessDenied, Some(409)));
    bucket_suite::writes_and_prefixes(&server, &AZURE, TOKEN);

    std::env::set_var("AZURE_STORAGE_TOKEN", TOKEN);
    let written = common::random_bytes(11 * 1024 * 1024 + 7, 29);
    let mut parts = options();
    parts.part_size(5 * 1024 * 1024).unwrap();
    // A block refused for good: the upload fails and no blob is committed.
    server.inject_writes([server::WriteFault::Status(400)]);
    let failing = RemoteWriter::create_with("az://models/out/failed.bin", &parts).unwrap();
    let wrote = failing.pwrite(&written, 0).and_then(|_| failing.finish());
    assert!(wrote.is_err(), "{wrote:?}");
    assert_eq!(server.object("/models/out/failed.bin"), None);

    // A listing of two blobs a page, one page refused once: Azure's `startFrom` names the
    // last blob given out again (object_store drops it), and none is given twice.
    let names = ["a.bin", "b.bin", "sub/c.bin", "tail-1.bin", "tail-2.bin"];
    for name in names {
        server.put(&AZURE.path(&format!("pages/{name}")), b"hello".to_vec());
    }
    server.list_page_size(2);
    let prefix = RemotePrefix::open_auto(&AZURE.url("pages/"), &options()).unwrap();
    // (The first page answered well, the second refused once.)
    server.inject([Fault::Stall(Duration::ZERO), Fault::Status(503)]);
    let listed: Vec<String> = prefix.list("").unwrap().map(|e| e.unwrap().name).collect();
    assert_eq!(listed, names);
    // Deleted through Azure's batches.
    prefix.delete(&names).unwrap();
    assert_eq!(prefix.list("").unwrap().count(), 0);

    // Settings object_store would panic on, or refuse without naming the variable: refused
    // at open, naming it.
    for bad in ["not a url", "http://127.0.0.1:9/\u{1}", "ftp://host", "mailto:x@y"] {
        std::env::set_var("AZURE_STORAGE_ENDPOINT", bad);
        let e = RemoteFile::open_with(&public_url, &options()).unwrap_err();
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
        let e = RemoteFile::open_as(&private, EndpointKind::Azure, &options()).unwrap_err();
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
        let e = RemoteFile::open_with(&public_url, &options()).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidConfig { var, .. } if var == "AZURE_STORAGE_ACCOUNT_NAME"),
            "{bad:?}: {e:?}"
        );
    }
    std::env::remove_var("AZURE_STORAGE_ACCOUNT_NAME");
    let e = RemoteFile::open_with(&public_url, &options()).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidConfig { var, .. } if var == "AZURE_STORAGE_ACCOUNT_NAME"),
        "{e:?}"
    );
}
