//! Google Cloud Storage objects (`gs://bucket/object`) and prefixes read, written and listed
//! through object_store's GCS client, against the GCS stand-in of tests/remote/server.rs on
//! 127.0.0.1 (`GOOGLE_BASE_URL` points the client there): the bucket stores' suite
//! (tests/remote/bucket_suite.rs), then what is GCS's own. A test binary of its own with one
//! test: it sets the process's Google variables phase by phase.
#![cfg(feature = "remote")]

#[path = "remote/bucket_suite.rs"]
mod bucket_suite;
mod common;
#[allow(dead_code)] // This binary uses a part of the shared responder only.
#[path = "remote/server.rs"]
mod server;

use bucket_suite::{options, Store};
use gpumap::error::Error;
use gpumap::remote::{EndpointKind, RemoteFile};
use server::Server;

const TOKEN: &str = "gpumap-test-bearer-token";

const GCS: Store = Store {
    scheme: "gs",
    bucket: "gpumap-bkt",
    signed: EndpointKind::Gcs,
    unsigned: EndpointKind::GcsPublic,
    token_var: "GOOGLE_BEARER_TOKEN",
    refuses_anonymous: 401,
    refuses_other_token: 401,
};

#[test]
fn gcs_objects_are_read_and_written_signed_or_unsigned() {
    let server = Server::gcs(TOKEN);
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
    // A signed try with no credentials asks the metadata server: here a port that refuses at
    // once, not a name to resolve on a machine without a network.
    std::env::set_var("GCE_METADATA_HOST", "127.0.0.1:9");
    std::env::set_var("GCE_METADATA_IP", "127.0.0.1:9");

    let (public, _) = bucket_suite::reads_signed_or_unsigned(&server, &GCS, TOKEN);
    bucket_suite::writes_and_prefixes(&server, &GCS, TOKEN);

    // An endpoint object_store would panic on when it puts a request together: refused at open.
    for bad in ["not a url", "http://127.0.0.1:9/\u{1}", "ftp://host"] {
        std::env::set_var("GOOGLE_BASE_URL", bad);
        let e = RemoteFile::open_with(&public, &options()).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("GOOGLE_BASE_URL")), "{e:?}");
    }
}
