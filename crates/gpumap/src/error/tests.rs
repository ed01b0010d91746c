//! The error type's tests: messages that name their values, causes shown once, stable codes,
//! errno, and the hints of remote errors.

use super::*;

#[test]
fn io_error_keeps_errno_and_context() {
    let e =
        Error::io("open", Path::new("/x/y"), Some(7), io::Error::from_raw_os_error(libc::ENOENT));
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    let msg = e.to_string();
    assert_eq!(msg, "open failed on /x/y at offset 7");
    let back: io::Error = e.into();
    assert_eq!(back.raw_os_error(), Some(libc::ENOENT));
}

/// What `anyhow`'s `{:#}` prints: every error of the chain, joined by ": ".
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        parts.push(c.to_string());
        cause = c.source();
    }
    parts.join(": ")
}

#[test]
fn each_error_displays_its_source_once() {
    let os = io::Error::from_raw_os_error(libc::ENOENT);
    let os_text = os.to_string();
    let e = Error::io("open", Path::new("/x/y"), None, os);
    let printed = chain(&e);
    assert_eq!(printed, format!("open failed on /x/y: {os_text}"));
    assert_eq!(printed.matches("os error 2").count(), 1, "{printed}");
    assert_eq!(Report(&e).to_string(), printed);
    // Converted to io::Error (for std::io callers), a non-OS error still shows once.
    let wrapped: io::Error = Error::OutOfRange { offset: 1, len: 2, file_len: 0 }.into();
    assert_eq!(chain(&wrapped).matches("outside the file").count(), 1, "{}", chain(&wrapped));
}

#[test]
fn codes_are_stable_names() {
    let e = Error::io("open", Path::new("/x"), None, io::Error::from_raw_os_error(libc::EIO));
    assert_eq!(e.code(), "io");
    let e = Error::NotRegularFile { path: Some("/dev/zero".into()), what: "a character device" };
    assert_eq!(e.code(), "not_regular_file");
    assert_eq!(e.to_string(), "/dev/zero is a character device, not a regular file");
}

#[test]
fn argument_errors_name_their_values() {
    let e = Error::OutOfRange { offset: 10, len: 20, file_len: 15 };
    assert_eq!(e.to_string(), "range 10..30 is outside the file of 15 bytes");
    let e = Error::OutOfRange { offset: u64::MAX, len: 1, file_len: 15 };
    assert_eq!(
        e.to_string(),
        "range of 1 bytes at offset 18446744073709551615 ends past the largest offset \
         (2**64 - 1); the file has 15 bytes"
    );
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    let e = Error::UnexpectedEof {
        path: Some("/d/x".into()),
        offset: 8 << 20,
        wanted: 4096,
        file_len: 1 << 20,
    };
    assert_eq!(e.to_string(), "/d/x is 1048576 bytes long; bytes 8388608..8392704 were asked for");
    let e = Error::OutOfView { offset: 40, len: 20, view_offset: 4096, view_len: 50 };
    assert_eq!(
        e.to_string(),
        "range 40..60 is outside the view of 50 bytes (file bytes 4096..4146)"
    );
    let e = Error::RowIndex { position: 7, index: -3, rows: 100 };
    assert_eq!(e.to_string(), "row index -3 at position 7 is outside the file's 100 rows");
    assert_eq!((e.code(), e.kind()), ("row_index", io::ErrorKind::InvalidInput));
}

#[test]
fn remote_errors_name_the_url_status_attempts_and_what_to_do() {
    let e = Error::Remote {
        url: "s3://bucket/key".into(),
        op: "GET bytes 0-9 of".into(),
        kind: RemoteErrorKind::Status,
        status: Some(503),
        attempts: 3,
        reason: "the server answered 503 Service Unavailable".into(),
    };
    let text = e.to_string();
    assert!(
        text.starts_with(
            "GET bytes 0-9 of s3://bucket/key failed with HTTP status 503 after 3 attempts: \
             the server answered 503"
        ),
        "{text}"
    );
    assert!(text.ends_with(RemoteErrorKind::Status.hint()), "{text}");
    assert_eq!((e.code(), e.kind()), ("remote", io::ErrorKind::Other));
    let bad = RemoteErrorKind::BadResponse;
    assert!(bad.hint_for("GET bytes 0-9 of").contains("Range requests"));
    assert!(!bad.hint_for("PUT part 2 (5 bytes) of").contains("Range"));
    let denied = RemoteErrorKind::AccessDenied;
    assert!(denied.hint_for("GET bytes 0-9 of").contains("may read"));
    for op in ["PUT part 2 (5 bytes) of", "PUT (1 bytes)", "create a multipart upload of"] {
        assert!(denied.hint_for(op).contains("may write"), "{op}");
        assert!(!denied.hint_for(op).contains("read"), "{op}");
    }
    assert!(denied.hint_for("complete the upload (3 parts) of").contains("may write"));
    assert!(denied.hint_for("DELETE objects under").contains("may delete"));
    assert!(denied.hint_for("LIST").contains("may list"));
    assert_eq!(RemoteErrorKind::Status.hint_for("PUT (1 bytes)"), RemoteErrorKind::Status.hint());
    let e = Error::Remote {
        url: "https://h/x?…".into(),
        op: "open".into(),
        kind: RemoteErrorKind::NotFound,
        status: Some(404),
        attempts: 1,
        reason: "no such object".into(),
    };
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(!e.to_string().contains("attempts"), "{e}");
    assert_eq!(e.duplicate().to_string(), e.to_string());
}

#[test]
fn a_request_larger_than_the_budget_says_so() {
    let e = Error::OutOfBudget { requested: 3 << 20, budget: 2 << 20, in_use: 0 };
    assert_eq!(
        e.to_string(),
        "3145728 bytes of device memory requested: the request alone exceeds the \
         2097152-byte budget"
    );
    let e = Error::OutOfBudget { requested: 1 << 20, budget: 2 << 20, in_use: 2 << 20 };
    assert!(e.to_string().ends_with("in use and none can be evicted"), "{e}");
}
