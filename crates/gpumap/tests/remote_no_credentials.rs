//! Opening S3 objects and prefixes where no credentials are configured, neither in the
//! environment nor in the AWS files, as on a machine that reads public buckets or has only an
//! instance's role. Runs against the S3 responder of tests/remote/server.rs and a stand-in for
//! the instance metadata service, both on 127.0.0.1. A test binary of its own: it empties the
//! process's AWS variables, which the other remote tests fill.
#![cfg(feature = "remote")]

mod common;
#[allow(dead_code)] // This binary uses a part of the shared responder only.
#[path = "remote/server.rs"]
mod server;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use gpumap::error::{Error, RemoteErrorKind};
use gpumap::remote::{EndpointKind, RemoteEntry, RemoteFile, RemoteOptions, RemotePrefix};
use server::{Server, AWS_CREDENTIAL_AND_ENDPOINT_VARS, KEY_ID, SECRET};

/// A stand-in for EC2's instance metadata service: it hands out [`KEY_ID`] as the role's
/// credentials, and counts the requests it answers.
struct InstanceRole {
    endpoint: String,
    asked: Arc<AtomicUsize>,
}

impl InstanceRole {
    fn start() -> InstanceRole {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let asked = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&asked);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
                answer_metadata(stream);
            }
        });
        InstanceRole { endpoint, asked }
    }

    fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

/// Answers one metadata request (IMDSv2: a token, the role's name, then its credentials) and
/// closes the connection.
fn answer_metadata(mut stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line == "\r\n" => break,
            Ok(_) => {}
        }
    }
    const ROLE_PATH: &str = "/latest/meta-data/iam/security-credentials/";
    let path = first.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = match path {
        "/latest/api/token" => (200, "metadata-token".to_owned()),
        ROLE_PATH => (200, "gpumap-test-role".to_owned()),
        p if p == format!("{ROLE_PATH}gpumap-test-role") => (
            200,
            format!(
                r#"{{"Code":"Success","AccessKeyId":"{KEY_ID}","SecretAccessKey":"{SECRET}","Token":"role-token","Expiration":"2100-01-01T00:00:00Z"}}"#
            ),
        ),
        _ => (404, String::new()),
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// Empties the process's AWS credentials (variables and files) and points the instance
/// metadata service at the stand-in, once, before any test opens anything.
fn instance_role_only() -> &'static InstanceRole {
    static ROLE: OnceLock<InstanceRole> = OnceLock::new();
    ROLE.get_or_init(|| {
        let role = InstanceRole::start();
        let missing = std::env::temp_dir().join(format!("gpumap-no-aws-{}", std::process::id()));
        for var in AWS_CREDENTIAL_AND_ENDPOINT_VARS {
            std::env::remove_var(var);
        }
        std::env::set_var("AWS_CONFIG_FILE", missing.join("config"));
        std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", missing.join("credentials"));
        std::env::set_var("AWS_DEFAULT_REGION", "us-east-1");
        std::env::set_var("AWS_METADATA_ENDPOINT", &role.endpoint);
        role
    })
}

/// A responder holding `public/` (listable and readable by anyone) and `private/` buckets, each
/// with the same objects under `data/`, and options that reach it.
fn buckets() -> (Server, Vec<u8>, RemoteOptions) {
    let server = Server::s3(KEY_ID);
    let bytes = common::random_bytes(200_003, 5);
    for bucket in ["public", "private"] {
        server.put(&format!("/{bucket}/data/a.bin"), bytes.clone());
        server.put(&format!("/{bucket}/data/sub/b.bin"), bytes[..17].to_vec());
    }
    for path in ["/public", "/public/", "/public/data/a.bin", "/public/data/sub/b.bin"] {
        server.make_public(path);
    }
    let mut options = RemoteOptions::default();
    options.s3_endpoint(Some(server.endpoint()));
    options.backoff(Duration::from_millis(5), Duration::from_millis(20));
    options.request_size(65_536).unwrap();
    (server, bytes, options)
}

fn entries(prefix: &RemotePrefix) -> Vec<RemoteEntry> {
    prefix.list("").unwrap().collect::<gpumap::Result<Vec<_>>>().unwrap()
}

fn reads_exactly(file: &RemoteFile, bytes: &[u8]) {
    let mut out = vec![0u8; bytes.len() - 3];
    assert_eq!(file.read(&mut out, 3).unwrap(), out.len());
    assert!(out == bytes[3..], "the bytes read differ from the object's");
}

#[test]
fn a_public_bucket_is_listed_and_read_unsigned() {
    let _role = instance_role_only();
    let (server, bytes, options) = buckets();
    let prefix = RemotePrefix::open_auto("s3://public/data/", &options).unwrap();
    assert!(prefix.is_unsigned());
    let expected = [
        RemoteEntry { name: "a.bin".into(), len: bytes.len() as u64 },
        RemoteEntry { name: "sub/b.bin".into(), len: 17 },
    ];
    assert_eq!(entries(&prefix), expected);
    let file = prefix.open_file("a.bin", None).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::S3Public);
    reads_exactly(&file, &bytes);
    // Not one request was signed.
    let (unsigned, signed) = server.unsigned_and_signed_requests();
    assert!(unsigned >= 3 && signed == 0, "{unsigned} unsigned, {signed} signed requests");
    // Writing is refused (the bucket lets anyone read, not write), typed; nothing is stored.
    let writer = prefix.create_file("new.bin", None).unwrap();
    let wrote = writer.pwrite(&bytes[..100], 0).and_then(|_| writer.finish());
    assert!(
        matches!(wrote, Err(Error::Remote { kind: RemoteErrorKind::AccessDenied, .. })),
        "{wrote:?}"
    );
    assert_eq!(server.object("/public/data/new.bin"), None);
}

#[test]
fn a_private_bucket_is_signed_with_the_instance_role_after_the_unsigned_listing_is_refused() {
    let role = instance_role_only();
    let (server, bytes, options) = buckets();
    let lists_before = server.lists();
    let prefix = RemotePrefix::open_auto("s3://private/data", &options).unwrap();
    assert!(!prefix.is_unsigned());
    // The one unsigned listing page asked for at open, refused.
    assert_eq!((server.lists() - lists_before, server.unsigned_and_signed_requests().0), (1, 1));
    assert_eq!(entries(&prefix).len(), 2);
    let file = prefix.open_file("a.bin", Some(bytes.len() as u64)).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::S3);
    reads_exactly(&file, &bytes);
    assert!(role.asked() >= 3, "the role's credentials were not fetched");
    // A file opened on its own takes the same way: unsigned first, signed when refused.
    let file =
        RemoteFile::open_auto("s3://private/data/a.bin", &EndpointKind::ALL, &options).unwrap();
    assert_eq!(file.endpoint_kind(), EndpointKind::S3);
    reads_exactly(&file, &bytes);
    let public =
        RemoteFile::open_auto("s3://public/data/a.bin", &EndpointKind::ALL, &options).unwrap();
    assert_eq!(public.endpoint_kind(), EndpointKind::S3Public);
}

#[test]
fn options_that_decide_the_signing_open_a_prefix_with_no_request() {
    let _role = instance_role_only();
    let (server, _, options) = buckets();
    let before = server.lists() + server.heads() + server.gets();
    let mut unsigned = options.clone();
    unsigned.unsigned(true);
    assert!(RemotePrefix::open_auto("s3://private/data/", &unsigned).unwrap().is_unsigned());
    assert!(!RemotePrefix::open_with("s3://public/data/", &options).unwrap().is_unsigned());
    assert_eq!(server.lists() + server.heads() + server.gets(), before);
    // Unsigned said outright, a private bucket's listing is refused at use, typed.
    let prefix = RemotePrefix::open_with("s3://private/data/", &unsigned).unwrap();
    let e = prefix.list_dir("").unwrap_err();
    assert!(matches!(e, Error::Remote { kind: RemoteErrorKind::AccessDenied, .. }), "{e:?}");
}
