//! The kinds of endpoint a URL is read as (KvikIO's `RemoteEndpointType`, less `AUTO`, and
//! four of gpumap's own for Google Cloud Storage and Azure Blob Storage), told from the URL's
//! form alone, and the S3 objects that `http(s)://` URLs name.
//!
//! Pure functions: no request is made here. Which kind a URL is *opened* as, including the
//! fall-back from signed to unsigned S3 requests, is [`RemoteFile::open_auto`]'s.
//!
//! [`RemoteFile::open_auto`]: super::RemoteFile::open_auto
#![forbid(unsafe_code)]

use std::fmt;

use crate::error::Result;
use crate::remote::url::{self as urls, RemoteUrl};

/// How a URL is read: signed S3 requests, unsigned ones (public objects), a presigned S3 URL,
/// WebHDFS, plain HTTP GETs, or GCS or Azure requests signed or not. The names are KvikIO's,
/// but for the GCS and Azure kinds, which KvikIO does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EndpointKind {
    /// S3, requests signed with credentials (KvikIO's `S3`).
    S3,
    /// S3 objects anyone may read: requests not signed, no credentials looked for
    /// (`S3_PUBLIC`).
    S3Public,
    /// A presigned S3 URL: plain GETs, the signature in its query (`S3_PRESIGNED_URL`).
    S3PresignedUrl,
    /// Hadoop's WebHDFS REST API (`WEBHDFS`).
    WebHdfs,
    /// Plain HTTP(S) GETs with a `Range` header (`HTTP`).
    Http,
    /// Google Cloud Storage (`gs://bucket/object`), requests signed with the credentials
    /// object_store finds (`GCS`).
    Gcs,
    /// GCS objects anyone may read: requests not signed, no credentials looked for
    /// (`GCS_PUBLIC`).
    GcsPublic,
    /// Azure Blob Storage (`az://container/blob`), requests signed with the credentials
    /// object_store finds (`AZURE`).
    Azure,
    /// Azure blobs anyone may read (a container of public access): requests not signed, no
    /// credentials looked for (`AZURE_PUBLIC`).
    AzurePublic,
}

impl EndpointKind {
    /// Every kind, in the order an open with no kind asked for tries them (KvikIO's default
    /// allow list, then the GCS and Azure kinds, whose URLs no other kind takes).
    pub const ALL: [EndpointKind; 9] = [
        EndpointKind::S3,
        EndpointKind::S3Public,
        EndpointKind::S3PresignedUrl,
        EndpointKind::WebHdfs,
        EndpointKind::Http,
        EndpointKind::Gcs,
        EndpointKind::GcsPublic,
        EndpointKind::Azure,
        EndpointKind::AzurePublic,
    ];

    /// KvikIO's name of the kind (`"S3_PUBLIC"`).
    pub fn name(self) -> &'static str {
        match self {
            EndpointKind::S3 => "S3",
            EndpointKind::S3Public => "S3_PUBLIC",
            EndpointKind::S3PresignedUrl => "S3_PRESIGNED_URL",
            EndpointKind::WebHdfs => "WEBHDFS",
            EndpointKind::Http => "HTTP",
            EndpointKind::Gcs => "GCS",
            EndpointKind::GcsPublic => "GCS_PUBLIC",
            EndpointKind::Azure => "AZURE",
            EndpointKind::AzurePublic => "AZURE_PUBLIC",
        }
    }

    /// The kind that reads the same URLs unsigned (`S3_PUBLIC` for `S3`, `GCS_PUBLIC` for
    /// `GCS`, `AZURE_PUBLIC` for `AZURE`), where there is one.
    pub fn unsigned_twin(self) -> Option<EndpointKind> {
        match self {
            EndpointKind::S3 => Some(EndpointKind::S3Public),
            EndpointKind::Gcs => Some(EndpointKind::GcsPublic),
            EndpointKind::Azure => Some(EndpointKind::AzurePublic),
            _ => None,
        }
    }

    /// The kind KvikIO names `name` (case as KvikIO writes it), if any.
    pub fn from_name(name: &str) -> Option<EndpointKind> {
        EndpointKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// Whether `text` is a URL of this kind by its form, as KvikIO's `is_url_valid` decides
    /// (no request is made): `s3://bucket/key` or an AWS S3 `https://` URL without a
    /// signature for the two S3 kinds, `gs://bucket/object` for the two GCS kinds,
    /// `az://container/blob` for the two Azure kinds, a path
    /// under `/webhdfs/v1/` (or `webhdfs://`) for WebHDFS, and any `http(s)://` URL with a
    /// path for plain HTTP. A presigned URL is any
    /// `http(s)://` URL whose query carries an S3 signature (`X-Amz-Signature`), where KvikIO
    /// also wants an AWS host and `X-Amz-Algorithm`: MinIO's presigned URLs are presigned URLs
    /// too.
    pub fn accepts(self, text: &str) -> bool {
        let Ok(url) = RemoteUrl::parse(text) else { return false };
        let http_scheme = text.get(..8).is_some_and(|head| {
            let head = head.to_ascii_lowercase();
            head.starts_with("http://") || head.starts_with("https://")
        });
        match (self, &url) {
            (EndpointKind::S3 | EndpointKind::S3Public, RemoteUrl::S3 { .. }) => true,
            (EndpointKind::S3 | EndpointKind::S3Public, RemoteUrl::Http(u)) => {
                !is_presigned(u) && aws_form(u).is_some()
            }
            (EndpointKind::S3PresignedUrl, RemoteUrl::Http(u)) => is_presigned(u),
            (EndpointKind::WebHdfs, RemoteUrl::WebHdfs(_)) => true,
            (EndpointKind::Gcs | EndpointKind::GcsPublic, RemoteUrl::Gcs { .. }) => true,
            (EndpointKind::Azure | EndpointKind::AzurePublic, RemoteUrl::Azure { .. }) => true,
            (EndpointKind::Http, RemoteUrl::Http(u) | RemoteUrl::WebHdfs(u)) => {
                http_scheme && u.path().len() > 1
            }
            _ => false,
        }
    }

    /// The first of `allowed` that [accepts](Self::accepts) `text`, as an open with no kind
    /// asked for picks it (KvikIO's `infer_remote_endpoint_type`).
    pub fn infer(text: &str, allowed: &[EndpointKind]) -> Option<EndpointKind> {
        allowed.iter().copied().find(|kind| kind.accepts(text))
    }
}

impl fmt::Display for EndpointKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether an `http(s)://` URL carries an S3 query-string signature (`X-Amz-Signature`).
pub(crate) fn is_presigned(url: &url::Url) -> bool {
    url.query_pairs().any(|(name, _)| name == "X-Amz-Signature")
}

/// An S3 object named by an `http(s)://` URL, and where its requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Address {
    /// The object, as `s3://bucket/key`.
    pub url: RemoteUrl,
    /// The scheme, host and port requests go to: the bucket's own host where `virtual_hosted`
    /// (`https://bucket.s3.us-east-2.amazonaws.com`), else the service's
    /// (`http://127.0.0.1:9000`, the bucket first in the path).
    pub endpoint: String,
    /// Whether the bucket is in the host name rather than the path.
    pub virtual_hosted: bool,
    /// The region the host names (`us-east-2`), where it names one.
    pub region: Option<String>,
}

/// How an AWS host names the bucket and region.
#[derive(Debug, PartialEq, Eq)]
struct AwsForm {
    /// The bucket where the host holds it (virtual-hosted style); `None`: the path's first
    /// segment (path style).
    bucket: Option<String>,
    region: Option<String>,
}

/// The AWS S3 forms of host KvikIO reads (its `url_has_aws_s3_http_format`):
/// `bucket.s3.REGION.amazonaws.com`, `s3.REGION.amazonaws.com/bucket`, the legacy global
/// `bucket.s3.amazonaws.com` and `s3.amazonaws.com/bucket`, and the legacy regional
/// `bucket.s3-REGION.amazonaws.com` and `s3-REGION.amazonaws.com/bucket`, each with a key.
fn aws_form(url: &url::Url) -> Option<AwsForm> {
    let host = url.host_str()?.to_ascii_lowercase();
    let service = host.strip_suffix(".amazonaws.com")?;
    // The bucket is everything before the last `s3` label: bucket names may hold dots.
    let (bucket, rest) = match service.rsplit_once(".s3") {
        Some((bucket, rest)) if !bucket.is_empty() => (Some(bucket.to_owned()), rest),
        _ => (None, service.strip_prefix("s3")?),
    };
    let region = match rest {
        "" => None,
        _ => {
            let region = rest.strip_prefix('.').or_else(|| rest.strip_prefix('-'))?;
            let plain = |c: char| c.is_ascii_alphanumeric() || c == '-';
            if region.is_empty() || !region.chars().all(plain) {
                return None;
            }
            Some(region.to_owned())
        }
    };
    // A key after the bucket: `/key` where the host holds the bucket, `/bucket/key` if not.
    let path = url.path().strip_prefix('/')?;
    let has_key = match &bucket {
        Some(_) => !path.is_empty(),
        None => path.split_once('/').is_some_and(|(b, key)| !b.is_empty() && !key.is_empty()),
    };
    has_key.then_some(AwsForm { bucket, region })
}

impl S3Address {
    /// Reads `text`, an `http(s)://` URL, as an S3 object's (KvikIO's `open_s3_url` with such
    /// a URL): on an AWS host in one of the forms KvikIO reads, the bucket and region from the
    /// host or path; on any other host, path style (`http://host:port/bucket/key`), as MinIO
    /// and moto serve. The key is the rest of the path, percent-decoded once. A URL with a
    /// query string (a presigned one is opened as such) or another `amazonaws.com` host is
    /// refused.
    pub fn of_http(text: &str) -> Result<S3Address> {
        let url = match RemoteUrl::parse(text)? {
            RemoteUrl::Http(u) | RemoteUrl::WebHdfs(u) => u,
            other => return Err(urls::invalid(&other.redacted(), "not an http(s):// URL")),
        };
        let shown = urls::redact_url(&url);
        if url.query().is_some() || url.fragment().is_some() {
            return Err(urls::invalid(
                &shown,
                "an S3 object's URL has no query or fragment (open a presigned URL as one)",
            ));
        }
        let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
        let origin = match url.port() {
            Some(port) => format!("{}://{host}:{port}", url.scheme()),
            None => format!("{}://{host}", url.scheme()),
        };
        let path = url.path().strip_prefix('/').unwrap_or(url.path());
        let form = match aws_form(&url) {
            Some(form) => Some(form),
            None if host.ends_with(".amazonaws.com") || host.ends_with(".amazonaws.com.cn") => {
                return Err(urls::invalid(
                    &shown,
                    "an AWS host that is not one of S3's forms (bucket.s3.REGION.amazonaws.com, \
                     s3.REGION.amazonaws.com/bucket, and their legacy forms); use \
                     s3://bucket/key",
                ))
            }
            None => None,
        };
        let (host_bucket, region) = form.map_or((None, None), |f| (f.bucket, f.region));
        let (bucket, encoded_key, virtual_hosted) = match host_bucket {
            Some(bucket) => (bucket, path, true),
            None => {
                // Path style: the first segment is the bucket.
                let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
                (bucket.to_owned(), key, false)
            }
        };
        // Refusals name the URL as given (without its query), not the s3:// form made of it.
        let as_given = |e: crate::Error| match e {
            crate::Error::Remote { url: _, op, kind, status, attempts, reason } => {
                crate::Error::Remote { url: shown.clone(), op, kind, status, attempts, reason }
            }
            other => other,
        };
        let key = urls::percent_decoded(text, encoded_key).map_err(as_given)?;
        let url = RemoteUrl::s3(&bucket, &key).map_err(as_given)?;
        Ok(S3Address { url, endpoint: origin, virtual_hosted, region })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, RemoteErrorKind};

    const AWS: [&str; 6] = [
        "https://my.bucket.s3.us-east-2.amazonaws.com/dir/a%20b.bin",
        "https://s3.us-east-2.amazonaws.com/my.bucket/dir/a%20b.bin",
        "https://my.bucket.s3.amazonaws.com/dir/a%20b.bin",
        "https://s3.amazonaws.com/my.bucket/dir/a%20b.bin",
        "https://my.bucket.s3-us-east-2.amazonaws.com/dir/a%20b.bin",
        "http://s3-us-east-2.amazonaws.com/my.bucket/dir/a%20b.bin",
    ];

    #[test]
    fn aws_hosts_name_bucket_key_and_region_in_each_of_their_forms() {
        let expected = [
            ("https://my.bucket.s3.us-east-2.amazonaws.com", true, Some("us-east-2")),
            ("https://s3.us-east-2.amazonaws.com", false, Some("us-east-2")),
            ("https://my.bucket.s3.amazonaws.com", true, None),
            ("https://s3.amazonaws.com", false, None),
            ("https://my.bucket.s3-us-east-2.amazonaws.com", true, Some("us-east-2")),
            ("http://s3-us-east-2.amazonaws.com", false, Some("us-east-2")),
        ];
        for (text, (endpoint, virtual_hosted, region)) in AWS.iter().zip(expected) {
            let got = S3Address::of_http(text).unwrap();
            let want = S3Address {
                url: RemoteUrl::S3 { bucket: "my.bucket".into(), key: "dir/a b.bin".into() },
                endpoint: endpoint.into(),
                virtual_hosted,
                region: region.map(str::to_owned),
            };
            assert_eq!(got, want, "{text}");
            assert!(EndpointKind::S3.accepts(text), "{text}");
            assert!(EndpointKind::S3Public.accepts(text), "{text}");
            assert!(!EndpointKind::S3PresignedUrl.accepts(text), "{text}");
            assert!(EndpointKind::Http.accepts(text), "{text}");
        }
    }

    #[test]
    fn other_hosts_are_read_path_style_with_their_port() {
        let got = S3Address::of_http("http://127.0.0.1:9000/test-bucket/k/x%2By.bin").unwrap();
        assert_eq!(
            got.url,
            RemoteUrl::S3 { bucket: "test-bucket".into(), key: "k/x+y.bin".into() }
        );
        assert_eq!(got.endpoint, "http://127.0.0.1:9000");
        assert!(!got.virtual_hosted);
        assert_eq!(got.region, None);
        // Not an AWS host: KvikIO's `open` reads it as plain HTTP, never as S3.
        let text = "http://127.0.0.1:9000/test-bucket/k.bin";
        assert!(!EndpointKind::S3.accepts(text));
        assert_eq!(EndpointKind::infer(text, &EndpointKind::ALL), Some(EndpointKind::Http));
    }

    #[test]
    fn urls_that_name_no_object_are_refused_naming_the_url_without_its_query() {
        for (text, shown) in [
            (
                "https://s3.us-east-1.amazonaws.com/bucket-only",
                "https://s3.us-east-1.amazonaws.com/bucket-only",
            ),
            ("https://bkt.s3.us-east-1.amazonaws.com/", "https://bkt.s3.us-east-1.amazonaws.com/"),
            ("http://127.0.0.1:9000/bucket-only", "http://127.0.0.1:9000/bucket-only"),
            ("http://127.0.0.1:9000/Bad_Bucket/k", "http://127.0.0.1:9000/Bad_Bucket/k"),
            ("http://127.0.0.1:9000/bkt/a//b", "http://127.0.0.1:9000/bkt/a//b"),
            ("http://127.0.0.1:9000/bkt/%ZZ", "http://127.0.0.1:9000/bkt/%ZZ"),
            (
                "https://bkt.s3.us-east-1.amazonaws.com/k?X-Amz-Signature=SECRET",
                "https://bkt.s3.us-east-1.amazonaws.com/k?…",
            ),
            (
                "https://bkt.s3.dualstack.us-east-1.amazonaws.com/k",
                "https://bkt.s3.dualstack.us-east-1.amazonaws.com/k",
            ),
            (
                "https://ec2.us-east-1.amazonaws.com/bkt/k",
                "https://ec2.us-east-1.amazonaws.com/bkt/k",
            ),
            ("s3://bkt/k", "s3://bkt/k"),
        ] {
            match S3Address::of_http(text) {
                Err(Error::Remote { kind: RemoteErrorKind::InvalidUrl, url, reason, .. }) => {
                    assert_eq!(url, shown, "{text}");
                    assert!(!reason.contains("SECRET"), "{text}: {reason}");
                }
                other => panic!("{text} was not refused: {other:?}"),
            }
        }
    }

    #[test]
    fn kinds_are_told_from_the_url_in_kvikios_order() {
        let presigned = "https://bkt.s3.us-east-1.amazonaws.com/k.bin?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=ab";
        let local_presigned =
            "http://127.0.0.1:9000/bkt/k.bin?X-Amz-Algorithm=A&X-Amz-Signature=ab";
        for (text, kind) in [
            ("s3://bkt/k.bin", Some(EndpointKind::S3)),
            (AWS[0], Some(EndpointKind::S3)),
            (presigned, Some(EndpointKind::S3PresignedUrl)),
            // KvikIO also wants an AWS host for a presigned URL; MinIO's are presigned too.
            (local_presigned, Some(EndpointKind::S3PresignedUrl)),
            ("http://nn:9870/webhdfs/v1/data/x.bin?user.name=me", Some(EndpointKind::WebHdfs)),
            ("webhdfs://nn:9870/data/x.bin", Some(EndpointKind::WebHdfs)),
            ("https://example.org/data.bin", Some(EndpointKind::Http)),
            ("gs://bkt/k.bin", Some(EndpointKind::Gcs)),
            ("gs://bkt", None),
            ("az://ctr/k.bin", Some(EndpointKind::Azure)),
            ("az://ctr", None),
            ("https://example.org/", None),
            ("s3://bkt", None),
            ("ftp://example.org/x", None),
            ("not a url", None),
        ] {
            assert_eq!(EndpointKind::infer(text, &EndpointKind::ALL), kind, "{text}");
        }
        // An allow list is tried in its own order.
        let http_first = [EndpointKind::Http, EndpointKind::S3];
        assert_eq!(EndpointKind::infer(AWS[0], &http_first), Some(EndpointKind::Http));
        assert_eq!(EndpointKind::infer("s3://bkt/k", &[EndpointKind::Http]), None);
        assert_eq!(
            EndpointKind::infer("s3://bkt/k", &[EndpointKind::S3Public]),
            Some(EndpointKind::S3Public)
        );
        assert_eq!(
            EndpointKind::infer("gs://bkt/k", &[EndpointKind::GcsPublic]),
            Some(EndpointKind::GcsPublic)
        );
        assert!(!EndpointKind::S3.accepts("gs://bkt/k") && !EndpointKind::Gcs.accepts("s3://b/k"));
        assert_eq!(EndpointKind::S3.unsigned_twin(), Some(EndpointKind::S3Public));
        assert_eq!(EndpointKind::Gcs.unsigned_twin(), Some(EndpointKind::GcsPublic));
        assert_eq!(EndpointKind::Azure.unsigned_twin(), Some(EndpointKind::AzurePublic));
        assert_eq!(
            EndpointKind::infer("az://ctr/k", &[EndpointKind::AzurePublic]),
            Some(EndpointKind::AzurePublic)
        );
        assert!(
            !EndpointKind::Gcs.accepts("az://ctr/k") && !EndpointKind::Azure.accepts("gs://b/k")
        );
        assert_eq!(EndpointKind::Http.unsigned_twin(), None);
        // Hadoop's scheme is WebHDFS only, never plain HTTP.
        assert!(!EndpointKind::Http.accepts("webhdfs://nn:9870/data/x.bin"));
    }

    proptest::proptest! {
        /// Every form of URL gives back the bucket, the key (percent-encoded any way) and the
        /// region it was written with, and the kinds agree with the form.
        #[test]
        fn bucket_key_and_region_come_back_from_every_form(
            bucket in "[a-z0-9][a-z0-9.-]{1,20}[a-z0-9]",
            segments in proptest::collection::vec("[a-zA-Z0-9 ~!*'()+,;=:@$&_.-]{1,12}", 1..4),
            region in proptest::option::of("[a-z]{2}-[a-z]{4,9}-[1-9]"),
            form in 0usize..4,
            port in 1u16..65535,
        ) {
            let key = segments.join("/");
            proptest::prop_assume!(key.split('/').all(|s| s != "." && s != ".."));
            let encoded: String = key
                .bytes()
                .map(|b| match b {
                    b' ' | b'%' => format!("%{b:02X}"),
                    b'$' | b'&' => format!("%{b:02x}"),
                    _ => (b as char).to_string(),
                })
                .collect();
            let s3 = |r: &Option<String>| r.as_ref().map(|r| format!("s3.{r}")).unwrap_or("s3".into());
            let (text, aws) = match form {
                0 => (format!("https://{bucket}.{}.amazonaws.com/{encoded}", s3(&region)), true),
                1 => (format!("https://{}.amazonaws.com/{bucket}/{encoded}", s3(&region)), true),
                2 => (format!("http://{bucket}.s3-{}.amazonaws.com/{encoded}", region.clone().unwrap_or("us-east-1".into())), true),
                _ => (format!("http://127.0.0.1:{port}/{bucket}/{encoded}"), false),
            };
            let got = S3Address::of_http(&text).unwrap();
            proptest::prop_assert_eq!(got.url, RemoteUrl::S3 { bucket: bucket.clone(), key: key.clone() });
            let want_region = match form {
                2 => Some(region.clone().unwrap_or("us-east-1".into())),
                3 => None,
                _ => region.clone(),
            };
            proptest::prop_assert_eq!(got.region, want_region);
            proptest::prop_assert_eq!(got.virtual_hosted, form == 0 || form == 2);
            proptest::prop_assert_eq!(EndpointKind::S3.accepts(&text), aws);
            proptest::prop_assert!(EndpointKind::Http.accepts(&text));
        }

        /// Nothing a caller types makes the parsing or the inference panic.
        #[test]
        fn any_text_is_parsed_or_refused(text in "(s3|gs|https?|webhdfs|ftp)://[ -~]{0,60}") {
            let _ = S3Address::of_http(&text);
            let _ = EndpointKind::infer(&text, &EndpointKind::ALL);
        }
    }

    #[test]
    fn names_read_back() {
        for kind in EndpointKind::ALL {
            assert_eq!(EndpointKind::from_name(kind.name()), Some(kind));
            assert_eq!(kind.to_string(), kind.name());
        }
        assert_eq!(EndpointKind::from_name("AUTO"), None);
        assert_eq!(EndpointKind::from_name("s3"), None);
    }
}
