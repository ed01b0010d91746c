//! `gpumap read` and `gpumap write` of URLs, against the library's test server on 127.0.0.1
//! (crates/gpumap/tests/remote/server.rs): the bytes `gpumap write` made, served and verified,
//! objects written to S3 as parts and read back, and the errors a user would hit, as JSON.

mod common;

#[allow(dead_code)]
#[path = "../../gpumap/tests/remote/server.rs"]
mod server;

use std::process::Command;

fn run(args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = Command::new(common::gpumap_bin()).args(args).output().expect("gpumap runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), json, format!("{stdout}{stderr}"))
}

#[test]
fn a_url_is_read_over_http_and_verified_against_the_pattern() {
    let dir = common::scratch();
    let file = dir.path().join("pattern.bin");
    let path = file.to_str().unwrap();
    let (code, _, text) = run(&["write", "--size", "3MiB", "--json", path]);
    assert_eq!(code, 0, "{text}");
    let server = server::Server::http();
    server.put("/pattern.bin", std::fs::read(&file).unwrap());
    let url = format!("{}/pattern.bin", server.endpoint());
    let (code, report, text) = run(&[
        "read",
        "--host",
        "--json",
        "--verify-pattern",
        "--offset",
        "4097",
        "--request-size",
        "100KiB",
        "--max-in-flight",
        "8",
        &url,
    ]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(report["op"], "read");
    assert_eq!(report["bytes"], (3 << 20) - 4097);
    assert_eq!(report["url"], url.as_str());
    assert_eq!(report["max_in_flight"], 8);
    assert!(server.gets() >= 30, "{} GETs", server.gets());
    // A byte changed on the server is caught.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[70_000] ^= 1;
    server.put("/pattern.bin", bytes);
    let (code, _, text) = run(&["read", "--host", "--verify-pattern", &url]);
    assert_eq!(code, 3, "{text}");
}

#[test]
fn url_errors_are_typed_in_json() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dead = format!("http://127.0.0.1:{port}/x");
    for (args, kind) in [
        (vec!["read", "--host", "--json", "s3://Not_A_Bucket/key"], "remote"),
        (vec!["read", "--host", "--json", "--http-max-attempts", "1", dead.as_str()], "remote"),
        (vec!["read", "--host", "--json", "--cold", dead.as_str()], "invalid_argument"),
    ] {
        let (code, report, text) = run(&args);
        assert_ne!(code, 0, "{text}");
        assert_eq!(report["error"]["kind"], kind, "{args:?}: {text}");
    }
}

/// The retry settings of the settings table reach `gpumap read` of a URL: two 503s are retried
/// past by default (3 attempts, as KvikIO's), and fail the read under
/// `KVIKIO_HTTP_MAX_ATTEMPTS=1`.
#[test]
fn url_reads_take_the_retry_settings_from_the_environment() {
    let server = server::Server::http();
    server.put("/x.bin", vec![7u8; 10_000]);
    let url = format!("{}/x.bin", server.endpoint());
    let read = |env: Option<&str>| {
        let mut command = Command::new(common::gpumap_bin());
        command.args(["read", "--host", "--json", &url]);
        if let Some(attempts) = env {
            command.env("KVIKIO_HTTP_MAX_ATTEMPTS", attempts);
        }
        let out = command.output().expect("gpumap runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    };
    server.inject([server::Fault::Status(503)]);
    let (code, text) = read(Some("1"));
    assert_ne!(code, 0, "one attempt cannot pass a 503: {text}");
    assert!(text.contains("503"), "{text}");
    server.inject([server::Fault::Status(503), server::Fault::Status(503)]);
    let (code, text) = read(None);
    assert_eq!(code, 0, "three attempts pass two 503s: {text}");
    // The retries' warnings, to a pipe, are plain text (no terminal styling of their fields).
    assert!(text.contains("retrying") && !text.contains('\x1b'), "{text:?}");
}

const KEY_ID: &str = "GPUMAPTESTKEYID";

/// `gpumap ARGS` with the AWS environment of the test S3 server at `endpoint`.
fn run_s3(endpoint: &str, args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = Command::new(common::gpumap_bin())
        .args(args)
        .env("AWS_ACCESS_KEY_ID", KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", "gpumap-test-secret-never-shown")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", endpoint)
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE")
        .output()
        .expect("gpumap runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), json, format!("{stdout}{stderr}"))
}

#[test]
fn an_s3_object_is_written_as_parts_and_read_back_against_the_pattern() {
    let server = server::Server::s3(KEY_ID);
    let endpoint = server.endpoint();
    let size = (11 << 20) + 123;
    let url = "s3://test-bucket/dir/written.bin";
    let (code, report, text) = run_s3(
        &endpoint,
        &["write", "--host", "--json", "--size", &size.to_string(), "--part-size", "5MiB", url],
    );
    assert_eq!(code, 0, "{text}");
    assert_eq!(report["op"], "write");
    assert_eq!(report["url"], url);
    assert_eq!(report["bytes"], size);
    assert_eq!(report["part_size"], 5 << 20);
    assert_eq!(report["durable"], true);
    assert_eq!((server.uploads_created(), server.completes(), server.part_puts()), (1, 1, 3));
    assert_eq!(server.object("/test-bucket/dir/written.bin").map(|b| b.len()), Some(size));
    // Exit status 3 if a byte differed from the pattern.
    let (code, report, text) =
        run_s3(&endpoint, &["read", "--host", "--json", "--verify-pattern", url]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(report["bytes"], size);
    // A small object is one PUT, and its text line names the URL.
    let (code, _, text) =
        run_s3(&endpoint, &["write", "--host", "--size", "1000", "s3://test-bucket/small.bin"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("wrote 1000 bytes to s3://test-bucket/small.bin"), "{text}");
    assert_eq!(server.plain_puts(), 1);
}

#[test]
fn remote_write_errors_are_typed_and_leave_nothing_behind() {
    let server = server::Server::s3(KEY_ID);
    let endpoint = server.endpoint();
    let url = "s3://test-bucket/refused.bin";
    for (args, kind) in [
        (
            vec!["write", "--host", "--json", "--size", "10", "--offset", "5", url],
            "invalid_argument",
        ),
        (vec!["write", "--host", "--json", "--size", "10", "--sync", url], "invalid_argument"),
        (
            vec!["write", "--host", "--json", "--size", "10", "--part-size", "1MiB", url],
            "invalid_argument",
        ),
        (vec!["write", "--host", "--json", "--size", "10", "http://127.0.0.1:9/x"], "remote"),
    ] {
        let (code, report, text) = run_s3(&endpoint, &args);
        assert_ne!(code, 0, "{args:?}: {text}");
        assert_eq!(report["error"]["kind"], kind, "{args:?}: {text}");
    }
    // --part-size is for URLs only.
    let dir = common::scratch();
    let file = dir.path().join("local.bin");
    let (code, report, text) =
        run(&["write", "--json", "--size", "10", "--part-size", "5MiB", file.to_str().unwrap()]);
    assert_ne!(code, 0, "{text}");
    assert_eq!(report["error"]["kind"], "invalid_argument", "{text}");
    assert!(!file.exists());
    // Parts refused for good: the upload is aborted, no object is written.
    server.inject_writes([500, 500].map(server::WriteFault::Status));
    let args = [
        "write",
        "--host",
        "--json",
        "--size",
        "6MiB",
        "--part-size",
        "5MiB",
        "--http-max-attempts",
        "2",
        url,
    ];
    let (code, report, text) = run_s3(&endpoint, &args);
    assert_eq!(code, 1, "{text}");
    assert_eq!(report["error"]["kind"], "remote", "{text}");
    assert!(!text.contains("gpumap-test-secret-never-shown"), "{text}");
    assert_eq!((server.aborts(), server.open_uploads(), server.completes()), (1, 0, 0));
    assert!(server.object("/test-bucket/refused.bin").is_none());
}
