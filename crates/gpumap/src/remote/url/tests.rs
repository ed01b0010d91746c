//! The URL parser's tests: each scheme's buckets and keys, percent-decoding, refusals by kind,
//! redaction, bucket prefixes, and URLs told from local paths.

use super::*;

fn refused(text: &str) -> String {
    match RemoteUrl::parse(text) {
        Err(Error::Remote { kind: RemoteErrorKind::InvalidUrl, url, .. }) => url,
        other => panic!("{text:?} was not refused as an invalid URL: {other:?}"),
    }
}

#[test]
fn s3_urls_split_into_bucket_and_key() {
    let url = RemoteUrl::parse("s3://my-bucket/dir/file.bin").unwrap();
    assert_eq!(url, RemoteUrl::S3 { bucket: "my-bucket".into(), key: "dir/file.bin".into() });
    assert_eq!(url.redacted(), "s3://my-bucket/dir/file.bin");
    assert!(url.secrets().is_empty());
}

/// The key is the URL's path percent-decoded, once, and shown so that it reads back: keys
/// were sent encoded twice (`epoch~1` stored as `epoch%7E1`, `a%20b` as `a%2520b`).
#[test]
fn s3_keys_are_percent_decoded_once_and_shown_encoded() {
    for (text, key, shown) in [
        ("s3://bkt/ckpt/epoch~1.bin", "ckpt/epoch~1.bin", "s3://bkt/ckpt/epoch~1.bin"),
        ("s3://bkt/a%20b.bin", "a b.bin", "s3://bkt/a%20b.bin"),
        ("s3://bkt/new%C3%A9.bin", "new\u{e9}.bin", "s3://bkt/new\u{e9}.bin"),
        ("s3://bkt/new\u{e9}.bin", "new\u{e9}.bin", "s3://bkt/new\u{e9}.bin"),
        ("s3://bkt/100%25/x[0]", "100%/x[0]", "s3://bkt/100%25/x[0]"),
        ("s3://bkt/q%3F%23", "q?#", "s3://bkt/q%3F%23"),
    ] {
        let url = RemoteUrl::parse(text).unwrap();
        assert_eq!(url, RemoteUrl::S3 { bucket: "bkt".into(), key: key.into() }, "{text}");
        assert_eq!(url.redacted(), shown, "{text}");
        assert_eq!(RemoteUrl::parse(&url.redacted()).unwrap(), url, "{text}");
        assert_eq!(RemoteUrl::s3("bkt", key).unwrap(), url, "{text}");
        assert_eq!(RemoteUrl::store_path(key).unwrap().as_ref(), key, "{text}");
    }
    for bad in
        ["s3://bkt/a%2", "s3://bkt/a%zz", "s3://bkt/a%FF", "s3://bkt/a%0A", "s3://bkt/a%2F%2Fb"]
    {
        refused(bad);
    }
    assert!(RemoteUrl::s3("bkt", "tab\there").is_err());
    let (_, _, prefix) = parse_bucket_prefix("s3://bkt/my%20data/").unwrap();
    assert_eq!(prefix, "my data");
}

#[test]
fn gcs_and_azure_urls_split_by_each_stores_rules() {
    let gcs = |b: &str, k: &str| RemoteUrl::Gcs { bucket: b.into(), key: k.into() };
    let azure = |c: &str, k: &str| RemoteUrl::Azure { container: c.into(), key: k.into() };
    let dotted = format!("{}.{}", "a".repeat(63), "b".repeat(63));
    let long_container = "a".repeat(63);
    for (text, want) in [
        ("gs://my-bucket/dir/file.bin".to_owned(), gcs("my-bucket", "dir/file.bin")),
        ("GS://my_bucket.v2/a%20b~1.bin".to_owned(), gcs("my_bucket.v2", "a b~1.bin")),
        ("gs://a.example.com/x".to_owned(), gcs("a.example.com", "x")),
        (format!("gs://{dotted}/k"), gcs(&dotted, "k")),
        ("az://models/llama/m.safetensors".to_owned(), azure("models", "llama/m.safetensors")),
        ("AZ://data-2026/a%20b~1.bin".to_owned(), azure("data-2026", "a b~1.bin")),
        ("az://$root/x".to_owned(), azure("$root", "x")),
        ("abfs://models/a.bin".to_owned(), azure("models", "a.bin")),
        ("ABFSS://models/dir/a.bin".to_owned(), azure("models", "dir/a.bin")),
        (format!("az://{long_container}/k"), azure(&long_container, "k")),
    ] {
        let url = RemoteUrl::parse(&text).unwrap();
        assert_eq!(url, want, "{text}");
        assert_eq!(RemoteUrl::parse(&url.redacted()).unwrap(), url, "{text}");
        assert!(url.secrets().is_empty(), "{text}");
        let built = match &url {
            RemoteUrl::Gcs { bucket, key } => RemoteUrl::gcs(bucket, key),
            RemoteUrl::Azure { container, key } => RemoteUrl::azure(container, key),
            other => panic!("{other:?}"),
        };
        assert_eq!(built.unwrap(), url, "{text}");
    }
    let too_long = [format!("gs://{}/k", "a".repeat(64)), format!("gs://{}.b/k", "a".repeat(64))];
    let too_long_azure = format!("az://{}/k", "a".repeat(64));
    for bad in [
        "gs://",
        "gs://bucket",
        "gs://bucket/",
        "gs://Bucket/k",
        "gs://-bucket/k",
        "gs://bucket_/k",
        "gs://ab/k",
        "gs://user@bucket/k",
        "gs://bucket/k?alt=media",
        "gs://bucket/a//b",
        "gs://bucket/a/../b",
        "gs://bucket/a%zz",
        "az://",
        "az://container",
        "az://container/",
        "az://Container/k",
        "az://-container/k",
        "az://container-/k",
        "az://con--tainer/k",
        "az://con_tainer/k",
        "az://con.tainer/k",
        "az://ab/k",
        "az://$other/k",
        "az://account@container/k",
        "az://container/k?sv=2024",
        "az://container/a//b",
        "az://container/a/../b",
        "abfss://models@acct.dfs.core.windows.net/a.bin",
        "abfs://Models/a.bin",
        &too_long[0],
        &too_long[1],
        &too_long_azure,
    ] {
        refused(bad);
    }
    assert!(RemoteUrl::azure("Bad", "k").is_err() && RemoteUrl::azure("good", "").is_err());
    for text in ["gs://b/k", "GS://b/k", "az://c/k", "AZ://c/k", "abfs://c/k", "abfss://c/k"] {
        assert!(is_remote_url(text), "{text}");
    }
}

#[test]
fn hostile_and_malformed_urls_are_refused_by_kind() {
    for text in [
        "ftp://host/file",
        "file:///etc/passwd",
        "hdfs://namenode/path",
        "no-scheme/at/all",
        "s3://",
        "s3://bucket",
        "s3://bucket/",
        "s3://Bucket/key",
        "s3://b/key",
        "s3://bucket//key",
        "s3://bucket/a/../b",
        "s3://bucket/key?x=1",
        "http://",
        "http:///path",
        "https://host/a\r\nHost: evil",
        "https://host/a b",
        "https://host/\u{0}",
    ] {
        refused(text);
    }
    let long = format!("https://host/{}", "a".repeat(MAX_URL_LEN));
    assert!(refused(&long).len() < 100);
}

#[test]
fn credentials_never_appear_in_what_is_shown() {
    let shown = refused("https://user:hunter2@host/key?X-Amz-Signature=abc");
    assert!(!shown.contains("hunter2") && !shown.contains("abc"), "{shown}");
    let shown = refused("https://user:hunter2@host/a b?sig=abc");
    assert!(!shown.contains("hunter2") && !shown.contains("abc"), "{shown}");
    // Too long to be read at all: still nothing of its secrets shown.
    let pad = "a".repeat(MAX_URL_LEN);
    for long in [
        format!("http://admin:hunter2@host/{pad}"),
        format!("https://h/k?X-Amz-Signature=0123abc{pad}"),
        format!("s3://AKIAEXAMPLE:wJalrSECRET@bucket/{pad}"),
        format!("hunter2{pad}"),
    ] {
        let shown = refused(&long);
        for secret in ["admin", "hunter2", "0123abc", "AKIAEXAMPLE", "wJalrSECRET"] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }
    let url = RemoteUrl::parse(
        "https://bucket.s3.amazonaws.com/key?X-Amz-Credential=AKIA&X-Amz-Signature=abc",
    )
    .unwrap();
    assert_eq!(url.redacted(), "https://bucket.s3.amazonaws.com/key?…");
    assert_eq!(format!("{url:?}"), "RemoteUrl(https://bucket.s3.amazonaws.com/key?…)");
    assert!(url.secrets().iter().any(|s| s.contains("X-Amz-Signature=abc")));
}

#[test]
fn bucket_prefixes_name_a_store_a_bucket_and_an_optional_prefix() {
    let parse = |t: &str| parse_bucket_prefix(t).unwrap();
    let s3 = BucketStore::S3;
    assert_eq!(parse("s3://bucket"), (s3, "bucket".into(), "".into()));
    assert_eq!(parse("s3://bucket/"), (s3, "bucket".into(), "".into()));
    assert_eq!(parse("s3://bucket/a/b"), (s3, "bucket".into(), "a/b".into()));
    assert_eq!(parse("s3://bucket/a/b/"), (s3, "bucket".into(), "a/b".into()));
    assert_eq!(parse("GS://my_bkt/a/"), (BucketStore::Gcs, "my_bkt".into(), "a".into()));
    assert_eq!(parse("az://ctr/a/b/"), (BucketStore::Azure, "ctr".into(), "a/b".into()));
    assert_eq!(parse("abfss://ctr/a/"), (BucketStore::Azure, "ctr".into(), "a".into()));
    for text in [
        "az://",
        "az://c_tr/",
        "abfss://ctr@acct.dfs.core.windows.net/a/",
        "az://ctr/a//b/",
        "gs://",
        "gs://_bkt/",
        "gs://bkt/a//b/",
        "s3://",
        "s3://B/",
        "s3://bucket//",
        "s3://bucket/a//b/",
        "s3://bucket/../x/",
        "s3://bucket/a?x=1",
        "s3://user@bucket/",
        "https://host/dir/",
        "bucket/dir/",
    ] {
        assert!(
            matches!(
                parse_bucket_prefix(text),
                Err(Error::Remote { kind: RemoteErrorKind::InvalidUrl, .. })
            ),
            "{text:?} was not refused"
        );
    }
}

#[test]
fn webhdfs_urls_are_told_from_plain_http_and_keep_their_query() {
    let url = RemoteUrl::parse("http://nn:9870/webhdfs/v1/data/x.bin?user.name=me").unwrap();
    assert!(matches!(&url, RemoteUrl::WebHdfs(u) if u.query() == Some("user.name=me")));
    assert_eq!(url.redacted(), "http://nn:9870/webhdfs/v1/data/x.bin?…");
    let hadoop = RemoteUrl::parse("webhdfs://nn:9870/data/x.bin").unwrap();
    assert!(
        matches!(&hadoop, RemoteUrl::WebHdfs(u) if u.as_str() == "http://nn:9870/webhdfs/v1/data/x.bin")
    );
    let secure = RemoteUrl::parse("swebhdfs://nn:9871/x").unwrap();
    assert_eq!(secure.redacted(), "https://nn:9871/webhdfs/v1/x");
    assert!(matches!(RemoteUrl::parse("http://nn/data/webhdfs/v1/x").unwrap(), RemoteUrl::Http(_)));
    assert!(RemoteUrl::webhdfs("http://nn/data/x").is_err());
    for text in [
        "http://nn/webhdfs/v1/",
        "http://nn/webhdfs/v1/x?op=DELETE",
        "webhdfs:///x",
        "webhdfs://user:pw@nn/x",
    ] {
        refused(text);
    }
    assert!(is_remote_url("webhdfs://nn/x") && is_remote_url("SWEBHDFS://nn/x"));
}

#[test]
fn remote_urls_are_told_from_paths() {
    assert!(is_remote_url("s3://b/k") && is_remote_url("HTTPS://h/x"));
    assert!(is_remote_url("http://h"));
    assert!(!is_remote_url("/data/s3://x") && !is_remote_url("file.bin"));
    assert!(!is_remote_url("é"));
    // Hadoop's form, which the parser refuses, is still a URL and not a local path.
    assert!(is_remote_url("abfss://c@acct.dfs.core.windows.net/x"));
    assert!(!is_remote_url("dir/az://x") && !is_remote_url("s3:/b/k"));
}
