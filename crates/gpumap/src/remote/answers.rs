//! [`CheckedAnswers`]: object_store's HTTP client with the answers it would mishandle made
//! into ones it handles, or into errors that say what the server did.
//!
//! - An error answer's body is read to [`MAX_ERROR_BODY`] bytes at most. object_store reads
//!   the whole body of a failed request to quote it in its error; a server (or anything
//!   between) that answers 500 with an endless body would make a 100-byte read hold gigabytes.
//! - A 206 sent chunked, without a `Content-Length`, is given the length its `Content-Range`
//!   states (object_store refuses an answer without one; libcurl takes it). The body is still
//!   counted as it arrives: one longer or shorter than that fails the range.
//! - A ranged GET answered by a success other than 206 and 200 (a `204 No Content`) fails as
//!   a bad answer naming the status, where object_store would call it a whole object.
//! - A redirect loop fails as a bad answer, final, where it looked like a connection failure
//!   (and was retried).
//! - A listing page (`ListObjectsV2`) answered 200 that is not a listing, or says it is cut
//!   short without the token to go on, fails as a bad answer: object_store would end the
//!   listing there, silently short.
//! - A `CompleteMultipartUpload` answered 200 with an error document (S3 documents that it
//!   may, for an error met after it started answering) is made the 500 it stands for, so that
//!   it is retried as one.
//!
//! Other answers pass untouched: their bodies are the data, streamed and bounded by the range
//! asked for.
#![forbid(unsafe_code)]

use async_trait::async_trait;
use futures_util::StreamExt;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, RANGE};
use http::{HeaderValue, Method, StatusCode};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;

/// Bytes of an error answer's body kept: more than any error document a store writes.
pub(crate) const MAX_ERROR_BODY: usize = 64 << 10;

/// Connects object_store's stores through [`CheckedAnswers`] over its reqwest client.
#[derive(Debug, Default)]
pub(crate) struct CheckedConnector;

impl HttpConnector for CheckedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(CheckedAnswers { inner }))
    }
}

/// An HTTP client whose answers are checked and mended as the module says.
#[derive(Debug)]
pub(crate) struct CheckedAnswers {
    inner: HttpClient,
}

#[async_trait]
impl HttpService for CheckedAnswers {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let ranged_get = request.method() == Method::GET && request.headers().contains_key(RANGE);
        let query = request.uri().query().unwrap_or_default();
        let listing = request.method() == Method::GET && query.contains("list-type=2");
        let completion = request.method() == Method::POST && query.contains("uploadId=");
        let mut answer = self.inner.execute(request).await.map_err(name_redirect_loops)?;
        let status = answer.status();
        if status.is_client_error() || status.is_server_error() {
            let (parts, body) = answer.into_parts();
            let kept = HttpResponseBody::from(start_of(body).await);
            return Ok(HttpResponse::from_parts(parts, kept));
        }
        if (listing || completion) && status == StatusCode::OK {
            let (mut parts, body) = answer.into_parts();
            let bytes = whole(body).await?;
            let text = String::from_utf8_lossy(&bytes);
            if listing {
                check_listing(&text)?;
            } else if is_error_document(&text) {
                parts.status = StatusCode::INTERNAL_SERVER_ERROR;
            }
            return Ok(HttpResponse::from_parts(parts, HttpResponseBody::from(bytes)));
        }
        if ranged_get && status.is_success() {
            if status == StatusCode::PARTIAL_CONTENT {
                give_chunked_range_its_length(answer.headers_mut());
            } else if status != StatusCode::OK {
                return Err(bad_answer(format!(
                    "the server answered {status} to a ranged GET, neither 206 Partial Content \
                     nor 200 OK: no bytes of the object"
                )));
            }
        }
        Ok(answer)
    }
}

/// The most bytes of a listing page or an upload's completion answer read: a page of 1,000
/// keys of 1,024 bytes each is about 1.3 MB.
const MAX_DOCUMENT: usize = 16 << 20;

/// All of `body`, at most [`MAX_DOCUMENT`] bytes (more is a bad answer).
async fn whole(body: HttpResponseBody) -> Result<Vec<u8>, HttpError> {
    let mut bytes = Vec::new();
    let mut stream = body.bytes_stream();
    while let Some(chunk) = stream.next().await {
        bytes.extend_from_slice(&chunk?);
        if bytes.len() > MAX_DOCUMENT {
            return Err(bad_answer(format!("an answer of more than {MAX_DOCUMENT} bytes")));
        }
    }
    Ok(bytes)
}

/// `Ok` where `page` is a `ListObjectsV2` result that is whole or says how to go on.
fn check_listing(page: &str) -> Result<(), HttpError> {
    if is_error_document(page) || !page.contains("<ListBucketResult") {
        let start: String = page.chars().take(200).collect();
        return Err(bad_answer(format!("a listing page answered 200 is not a listing: {start}")));
    }
    if page.contains("<IsTruncated>true</IsTruncated>") && !page.contains("<NextContinuationToken>")
    {
        return Err(bad_answer(
            "a listing page says there is more but gives no continuation token".to_owned(),
        ));
    }
    Ok(())
}

/// Whether `text` is an S3 error document (its root element `<Error>`).
fn is_error_document(text: &str) -> bool {
    let body = text.trim_start_matches('\u{feff}').trim_start();
    let body = match body.strip_prefix("<?xml") {
        Some(rest) => rest.split_once("?>").map_or("", |(_, after)| after).trim_start(),
        None => body,
    };
    body.starts_with("<Error>") || body.starts_with("<Error ")
}

/// A 206's `Content-Length`, where it has none and is not compressed, from the range its
/// `Content-Range` gives (`bytes a-b/size`: `b - a + 1`).
fn give_chunked_range_its_length(headers: &mut http::HeaderMap) {
    let compressed = headers
        .get(CONTENT_ENCODING)
        .is_some_and(|coding| !coding.as_bytes().eq_ignore_ascii_case(b"identity"));
    if headers.contains_key(CONTENT_LENGTH) || compressed {
        return;
    }
    let Some(len) = headers.get(CONTENT_RANGE).and_then(|v| range_len(v.to_str().ok()?)) else {
        return;
    };
    headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
}

/// The length of the range a `Content-Range` value gives (`bytes a-b/size` or `bytes a-b/*`).
fn range_len(value: &str) -> Option<u64> {
    let range = value.trim().strip_prefix("bytes ")?.split('/').next()?;
    let (first, last) = range.split_once('-')?;
    let (first, last) = (first.trim().parse::<u64>().ok()?, last.trim().parse::<u64>().ok()?);
    last.checked_sub(first)?.checked_add(1)
}

/// `error`, or a final bad-answer error where it is reqwest giving up on a redirect chain.
fn name_redirect_loops(error: HttpError) -> HttpError {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(e) = current {
        if e.to_string().starts_with("error following redirect") {
            return bad_answer(
                "the server's redirects did not end (more than 10 in a row, a redirect loop); \
                 check the URL"
                    .to_owned(),
            );
        }
        current = e.source();
    }
    error
}

/// An answer that is not one a read can use: final, never retried.
fn bad_answer(why: String) -> HttpError {
    HttpError::new(HttpErrorKind::Decode, std::io::Error::other(why))
}

/// The first [`MAX_ERROR_BODY`] bytes of `body` (fewer where it ends, or fails, first).
async fn start_of(body: HttpResponseBody) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut stream = body.bytes_stream();
    while kept.len() < MAX_ERROR_BODY {
        match stream.next().await {
            Some(Ok(chunk)) => {
                let room = MAX_ERROR_BODY - kept.len();
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Some(Err(_)) | None => break,
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_pages_and_error_documents_are_told_apart() {
        let page = |body: &str| check_listing(body).map_err(|e| e.to_string());
        let whole = "<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>false</IsTruncated>\
                     </ListBucketResult>";
        assert!(page(whole).is_ok());
        let more = "<ListBucketResult><IsTruncated>true</IsTruncated>\
                    <NextContinuationToken>t</NextContinuationToken></ListBucketResult>";
        assert!(page(more).is_ok());
        let cut = "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>";
        assert!(page(cut).unwrap_err().contains("no continuation token"));
        let error =
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>InternalError</Code></Error>";
        assert!(page(error).unwrap_err().contains("not a listing"));
        assert!(is_error_document(error) && is_error_document("<Error>x</Error>"));
        assert!(!is_error_document("<CompleteMultipartUploadResult><ETag>e</ETag>"));
    }

    #[test]
    fn content_ranges_give_their_length() {
        for (value, len) in [
            ("bytes 0-99/1000", Some(100)),
            ("bytes 5-5/*", Some(1)),
            (" bytes 10-19/20 ", Some(10)),
            ("bytes 0-18446744073709551615/*", None),
            ("bytes 9-3/10", None),
            ("bytes */10", None),
            ("items 0-9/10", None),
            ("bytes 1-x/10", None),
        ] {
            assert_eq!(range_len(value), len, "{value}");
        }
    }

    #[test]
    fn only_an_uncompressed_206_without_a_length_is_given_one() {
        let headers = |pairs: &[(http::HeaderName, &str)]| {
            let mut map = http::HeaderMap::new();
            for (name, value) in pairs {
                map.insert(name.clone(), HeaderValue::from_str(value).unwrap());
            }
            map
        };
        let mut chunked = headers(&[(CONTENT_RANGE, "bytes 100-199/1000")]);
        give_chunked_range_its_length(&mut chunked);
        assert_eq!(chunked.get(CONTENT_LENGTH).unwrap(), "100");
        let mut sized = headers(&[(CONTENT_RANGE, "bytes 100-199/1000"), (CONTENT_LENGTH, "7")]);
        give_chunked_range_its_length(&mut sized);
        assert_eq!(sized.get(CONTENT_LENGTH).unwrap(), "7");
        let mut gzip =
            headers(&[(CONTENT_RANGE, "bytes 100-199/1000"), (CONTENT_ENCODING, "gzip")]);
        give_chunked_range_its_length(&mut gzip);
        assert!(gzip.get(CONTENT_LENGTH).is_none());
    }
}
