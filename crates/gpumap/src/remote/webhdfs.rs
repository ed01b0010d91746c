//! WebHDFS — Hadoop's REST API — as an object_store, reads only, so that a
//! [`RemoteFile`](super::RemoteFile) reads an HDFS file with the same ranged requests, retries
//! and bounce buffers as any object (KvikIO's `open_webhdfs`).
//!
//! The file `http://namenode:port/webhdfs/v1/<path>`: its size from `?op=GETFILESTATUS` (the
//! JSON `FileStatus.length`), a range from `?op=OPEN&offset=A&length=N`, which the namenode
//! answers with a redirect to a datanode (followed by the HTTP client). The URL's own query
//! (`user.name`, a delegation token) goes with every request and is never shown.
#![forbid(unsafe_code)]

use std::fmt;

use async_trait::async_trait;
use futures_util::stream::{self, BoxStream};
use futures_util::{StreamExt, TryStreamExt};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody};
use object_store::path::Path as StorePath;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult, MultipartUpload,
    ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use crate::remote::answers::CheckedConnector;

/// The longest `GETFILESTATUS` answer read: a status is a few hundred bytes.
const MAX_STATUS_BYTES: usize = 64 << 10;

/// The most of a refusal's body read, for its message.
const MAX_ERROR_BYTES: usize = 4 << 10;

const STORE: &str = "WebHDFS";

/// One WebHDFS file, as a store whose every path names it.
#[derive(Debug)]
pub(crate) struct WebHdfs {
    client: HttpClient,
    /// `http(s)://namenode:port/webhdfs/v1/<path>[?user.name=...]`.
    url: url::Url,
    /// The URL as errors show it (no query).
    shown: String,
}

impl WebHdfs {
    pub(crate) fn new(
        url: url::Url,
        shown: String,
        options: &object_store::ClientOptions,
    ) -> object_store::Result<WebHdfs> {
        let client = CheckedConnector.connect(options)?;
        Ok(WebHdfs { client, url, shown })
    }

    /// The file's URL with `op` and `params` added to its own query.
    fn request_url(&self, op: &str, params: &[(&str, u64)]) -> String {
        let mut url = self.url.clone();
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("op", op);
            for (name, value) in params {
                query.append_pair(name, &value.to_string());
            }
        }
        url.to_string()
    }

    async fn send(&self, url: &str) -> object_store::Result<object_store::client::HttpResponse> {
        let request = http::Request::get(url)
            .body(HttpRequestBody::empty())
            .map_err(|e| generic(format!("a request for {} could not be made: {e}", self.shown)))?;
        let response = self
            .client
            .execute(request)
            .await
            .map_err(|e| object_store::Error::Generic { store: STORE, source: Box::new(e) })?;
        let status = response.status().as_u16();
        if response.status().is_success() {
            return Ok(response);
        }
        // The body of a refusal says why (a RemoteException's JSON); its start is enough.
        let (body, _) = read_at_most(response, MAX_ERROR_BYTES).await.unwrap_or_default();
        let why: String = String::from_utf8_lossy(&body).chars().take(300).collect();
        let source = format!("status code: {status}: {}", why.trim()).into();
        Err(match status {
            404 => object_store::Error::NotFound { path: self.shown.clone(), source },
            401 => object_store::Error::Unauthenticated { path: self.shown.clone(), source },
            403 => object_store::Error::PermissionDenied { path: self.shown.clone(), source },
            _ => object_store::Error::Generic { store: STORE, source },
        })
    }

    /// The file's length, from `GETFILESTATUS`.
    async fn length(&self) -> object_store::Result<u64> {
        let response = self.send(&self.request_url("GETFILESTATUS", &[])).await?;
        let (body, cut) = read_at_most(response, MAX_STATUS_BYTES).await?;
        if cut {
            return Err(generic(format!(
                "a file status of more than {MAX_STATUS_BYTES} bytes is not one"
            )));
        }
        let status: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| generic(format!("the file status is not JSON: {e}")))?;
        let file = &status["FileStatus"];
        if file["type"].as_str().is_some_and(|kind| kind != "FILE") {
            return Err(generic(format!("{} is a {}, not a file", self.shown, file["type"])));
        }
        file["length"]
            .as_u64()
            .ok_or_else(|| generic("the file status has no FileStatus.length".to_owned()))
    }

    fn meta(&self, size: u64) -> ObjectMeta {
        ObjectMeta {
            location: StorePath::default(),
            last_modified: Default::default(),
            size,
            e_tag: None,
            version: None,
        }
    }
}

/// Up to `max` bytes of `response`'s body, and whether there was more: a server's answer never
/// sizes what is held.
async fn read_at_most(
    response: object_store::client::HttpResponse,
    max: usize,
) -> object_store::Result<(Vec<u8>, bool)> {
    let mut body = Vec::new();
    let mut chunks = response.into_body().bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk
            .map_err(|e| object_store::Error::Generic { store: STORE, source: Box::new(e) })?;
        let room = max - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

fn generic(reason: String) -> object_store::Error {
    object_store::Error::Generic { store: STORE, source: reason.into() }
}

fn unsupported(what: &str) -> object_store::Error {
    object_store::Error::NotSupported {
        source: format!("gpumap reads WebHDFS files; it does not {what}").into(),
    }
}

impl fmt::Display for WebHdfs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WebHDFS({})", self.shown)
    }
}

#[async_trait]
impl ObjectStore for WebHdfs {
    async fn get_opts(
        &self,
        _location: &StorePath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let (range, size) = match (&options.range, options.head) {
            (_, true) | (None, false) => {
                let len = self.length().await?;
                (0..len, len)
            }
            (Some(GetRange::Bounded(range)), false) => (range.clone(), range.end),
            (Some(_), false) => return Err(unsupported("read open-ended ranges")),
        };
        let payload = if options.head || range.is_empty() {
            GetResultPayload::Stream(stream::empty().boxed())
        } else {
            let params = [("offset", range.start), ("length", range.end - range.start)];
            let response = self.send(&self.request_url("OPEN", &params)).await?;
            let body = response
                .into_body()
                .bytes_stream()
                .map_err(|e| object_store::Error::Generic { store: STORE, source: Box::new(e) });
            GetResultPayload::Stream(body.boxed())
        };
        Ok(GetResult {
            payload,
            meta: self.meta(size),
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    async fn put_opts(
        &self,
        _location: &StorePath,
        _payload: PutPayload,
        _opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        Err(unsupported("write"))
    }

    async fn put_multipart_opts(
        &self,
        _location: &StorePath,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(unsupported("write"))
    }

    fn delete_stream(
        &self,
        _locations: BoxStream<'static, object_store::Result<StorePath>>,
    ) -> BoxStream<'static, object_store::Result<StorePath>> {
        stream::once(async { Err(unsupported("delete")) }).boxed()
    }

    fn list(
        &self,
        _prefix: Option<&StorePath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        stream::once(async { Err(unsupported("list")) }).boxed()
    }

    async fn list_with_delimiter(
        &self,
        _prefix: Option<&StorePath>,
    ) -> object_store::Result<ListResult> {
        Err(unsupported("list"))
    }

    async fn copy_opts(
        &self,
        _from: &StorePath,
        _to: &StorePath,
        _options: CopyOptions,
    ) -> object_store::Result<()> {
        Err(unsupported("copy"))
    }
}
