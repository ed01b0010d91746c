//! [`RemotePrefix`]: the objects under one S3, GCS or Azure prefix, used as a directory —
//! listed, sized, opened, written and deleted through one client, whose connections they all
//! share.
//!
//! Listing pages through the bucket lazily ([`RemoteObjects`] is an iterator), so a prefix of
//! millions of keys costs memory for one page at a time; a page that fails is asked again, with
//! the options' retries, from the last key already given out, so that no key is given twice or
//! skipped.
//!
//! Folder markers — the empty objects `sub/` that consoles make for folders — are not listed
//! as objects: object_store's paths drop a key's last `/`, so a marker would show as an empty
//! object `sub` beside the folder `sub/`. A marker is known by the keys under it (or, in a
//! level's listing, by being that level's own key); one with nothing under it is
//! indistinguishable from an empty object of that name, and is listed as one.
#![forbid(unsafe_code)]

use std::sync::Arc;

use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use crate::config::Config;
use crate::error::Result;
use crate::per_process::ForkLocal;
use crate::remote::client::{self, Client, Connections, StoreRecipe, WriteStore};
use crate::remote::failure::Failure;
use crate::remote::file::{self, RemoteFile};
use crate::remote::options::RemoteOptions;
use crate::remote::retry::Attempts;
use crate::remote::url::{self, BucketStore, RemoteUrl};
use crate::remote::writer::RemoteWriter;

/// Keys deleted by one request: S3's own limit for `DeleteObjects`.
const DELETE_BATCH: usize = 1000;

/// One object found under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteEntry {
    /// Its key relative to the prefix (`a/b.bin` under `s3://bucket/data/`).
    pub name: String,
    /// Its size in bytes.
    pub len: u64,
}

/// One level of a prefix, as a directory listing shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteListing {
    /// The objects directly at this level, by name.
    pub objects: Vec<RemoteEntry>,
    /// The names of the levels below (`sub` for keys `sub/...`), without a trailing `/`.
    pub dirs: Vec<String>,
}

/// The objects under `s3://bucket/prefix/` (or `gs://bucket/prefix/`,
/// `az://container/prefix/`). Cloning is cheap; clones, and the files and writers they open,
/// share one connection pool.
#[derive(Debug, Clone)]
pub struct RemotePrefix {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// S3, GCS or Azure.
    bucket_store: BucketStore,
    bucket: String,
    /// Without a trailing `/`; empty for the whole bucket.
    prefix: String,
    /// `s3://bucket/prefix/`, as errors name it.
    url: RemoteUrl,
    /// Its store for listings, deletes and writes (a forked child makes its own).
    store: ForkLocal<Arc<dyn WriteStore>>,
    options: RemoteOptions,
    /// The store and the permits of the requests in flight, shared by every file it opens.
    connections: Arc<ForkLocal<Connections>>,
    /// The recipe of its stores, shared by every file it opens, so that a read lane makes one
    /// store for them all.
    recipe: Arc<StoreRecipe>,
}

impl Inner {
    /// Its store in this process.
    fn store(&self) -> Result<Arc<dyn WriteStore>> {
        self.store.get(|| level_store(&self.url, &self.options))
    }
}

/// The store of the bucket of a prefix's `url` (always an S3, GCS or Azure URL).
fn level_store(url: &RemoteUrl, options: &RemoteOptions) -> Result<Arc<dyn WriteStore>> {
    client::bucket_store(url, options)?
        .ok_or_else(|| crate::Error::InvalidArgument(format!("{url} is not a bucket's prefix")))
}

impl RemotePrefix {
    /// Opens `url` (`s3://bucket/`, `s3://bucket/prefix/`, `gs://...`, `az://...` alike; the
    /// trailing `/` may be left out) with the options the settings give
    /// ([`RemoteOptions::from_config`] of [`Config::global`]), signed or unsigned as
    /// [`open_auto`](Self::open_auto) decides.
    pub fn open(url: &str) -> Result<RemotePrefix> {
        Self::open_auto(url, &RemoteOptions::from_config(Config::global()?)?)
    }

    /// Opens `url` with `options` (endpoint, region, retries, credentials or unsigned requests;
    /// a known length is ignored). Requests are signed unless the options say otherwise.
    pub fn open_with(url: &str, options: &RemoteOptions) -> Result<RemotePrefix> {
        let (bucket_store_kind, bucket, prefix) = url::parse_bucket_prefix(url)?;
        let level = if prefix.is_empty() { String::new() } else { format!("{prefix}/") };
        let shown = bucket_store_kind.url(&bucket, level);
        let store = level_store(&shown, options)?;
        let mut options = options.clone();
        options.known_len(None);
        let recipe = Arc::new(StoreRecipe::new(&shown, &options));
        let connections = Connections::through(store.clone(), &recipe);
        let connections = Arc::new(ForkLocal::new(connections));
        let store = ForkLocal::new(store);
        let inner = Inner {
            bucket_store: bucket_store_kind,
            bucket,
            prefix,
            url: shown,
            store,
            options,
            connections,
            recipe,
        };
        Ok(RemotePrefix { inner: Arc::new(inner) })
    }

    /// Opens `url` signed or unsigned, whichever the bucket takes, as
    /// [`RemoteFile::open_auto`] opens an object. Where `options` give credentials or ask for
    /// unsigned requests, it opens as they say; where credentials are configured (in the
    /// environment or the AWS files), signed, with no request. Where none are, it asks for one
    /// listing page unsigned: if the server gives it, the prefix stays unsigned (a public
    /// bucket needs no credentials); if it refuses (401, 403), the prefix is signed, with the
    /// credentials object_store finds then (an instance's role). A bucket whose objects are
    /// public but whose listing is not must be opened with [`RemoteOptions::unsigned`].
    pub fn open_auto(url: &str, options: &RemoteOptions) -> Result<RemotePrefix> {
        let (kind, _, _) = url::parse_bucket_prefix(url)?;
        let configured = match kind {
            BucketStore::S3 => {
                options.s3_credentials.is_some() || client::s3_credentials_configured()
            }
            BucketStore::Gcs => client::gcs_credentials_configured(),
            BucketStore::Azure => client::azure_credentials_configured(),
        };
        if options.unsigned || configured {
            return Self::open_with(url, options);
        }
        let mut unsigned = options.clone();
        unsigned.unsigned(true);
        let prefix = Self::open_with(url, &unsigned)?;
        match prefix.ask_one_page() {
            Ok(()) => Ok(prefix),
            Err(e) if file::refused(&e) => {
                tracing::debug!(error = %e, "unsigned listing refused; the prefix signs");
                Self::open_with(url, options)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether its requests go unsigned (KvikIO's `S3_PUBLIC`).
    pub fn is_unsigned(&self) -> bool {
        self.inner.options.unsigned
    }

    /// `s3://bucket/prefix/` (or `gs://...`, `az://...`).
    pub fn url(&self) -> &RemoteUrl {
        &self.inner.url
    }

    /// The options it was opened with.
    pub fn options(&self) -> &RemoteOptions {
        &self.inner.options
    }

    /// The URL of `name` (a key relative to the prefix, checked as keys are).
    pub fn url_of(&self, name: &str) -> Result<RemoteUrl> {
        RemoteUrl::in_bucket(self.inner.bucket_store, &self.inner.bucket, &self.key_of(name))
    }

    /// Opens the object `name` for reading; `len`, where known, spares the HEAD request.
    pub fn open_file(&self, name: &str, len: Option<u64>) -> Result<RemoteFile> {
        let (url, path) = self.locate(name)?;
        let connections = Arc::clone(&self.inner.connections);
        let client = Client::sharing(connections, path, Arc::clone(&self.inner.recipe));
        let mut options = self.inner.options.clone();
        options.known_len(len);
        RemoteFile::open_on(url, client, &options)
    }

    /// Starts writing the object `name` (replacing it when finished), with `options`' part
    /// size and parts held, or the prefix's when `None`.
    pub fn create_file(&self, name: &str, options: Option<&RemoteOptions>) -> Result<RemoteWriter> {
        let url = self.url_of(name)?;
        RemoteWriter::create_on(url, self.inner.store()?, options.unwrap_or(&self.inner.options))
    }

    /// The size of the object `name`, or `None` where there is none (a HEAD request, retried).
    pub fn len_of(&self, name: &str) -> Result<Option<u64>> {
        let (url, path) = self.locate(name)?;
        let store = self.inner.store()?;
        let asked = Attempts::new(&self.inner.options, &url).run("HEAD", || async {
            match store.head(&path).await {
                Ok(meta) => Ok(Some(meta.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(Failure::from_store(&e, &url)),
            }
        });
        client::block_on(async { asked.await.map_err(|gave_up| gave_up.into_error(&url)) })
    }

    /// Every object under `under` (a name relative to the prefix; `""` for all of them), in key
    /// order, one page at a time. Folder markers with keys under them are left out (see the
    /// module's docs).
    pub fn list(&self, under: &str) -> Result<RemoteObjects> {
        let path = self.path_under(under)?;
        Ok(RemoteObjects {
            inner: Arc::clone(&self.inner),
            path,
            stream: None,
            last: None,
            done: false,
            ahead: None,
        })
    }

    /// The objects and the levels directly under `under` (`""` for the prefix itself): one
    /// level, as `ls` shows a directory. The listing is read whole (with retries) before it
    /// returns.
    pub fn list_dir(&self, under: &str) -> Result<RemoteListing> {
        let path = self.path_under(under)?;
        let inner = &self.inner;
        let store = inner.store()?;
        let asked = Attempts::new(&inner.options, &inner.url).run("LIST", || async {
            store
                .list_with_delimiter(Some(&path))
                .await
                .map_err(|e| Failure::from_store(&e, &inner.url))
        });
        let found = client::block_on(async { asked.await.map_err(|g| g.into_error(&inner.url)) })?;
        // The level's own folder marker (`sub/` when listing `sub`) is not one of its objects.
        let objects = found
            .objects
            .iter()
            .filter(|meta| !(meta.size == 0 && meta.location == path))
            .filter_map(|meta| {
                Some(RemoteEntry { name: inner.name_of(&meta.location)?, len: meta.size })
            })
            .collect();
        let dirs = found.common_prefixes.iter().filter_map(|p| inner.name_of(p)).collect();
        Ok(RemoteListing { objects, dirs })
    }

    /// Deletes the objects `names` (relative to the prefix), up to a thousand to a request
    /// (Azure's batches take 256), each request retried; names with no object are no error
    /// (S3's own rule, kept for the stores that answer 404). Every name is checked before
    /// anything is deleted.
    pub fn delete<S: AsRef<str>>(&self, names: &[S]) -> Result<()> {
        let paths = names
            .iter()
            .map(|name| Ok(self.locate(name.as_ref())?.1))
            .collect::<Result<Vec<_>>>()?;
        let inner = &self.inner;
        let store = inner.store()?;
        for batch in paths.chunks(DELETE_BATCH) {
            let asked =
                Attempts::new(&inner.options, &inner.url).run("DELETE objects under", || {
                    let batch: Vec<object_store::Result<StorePath>> =
                        batch.iter().cloned().map(Ok).collect();
                    let store = &store;
                    async move {
                        store
                            .delete_stream(futures_util::stream::iter(batch).boxed())
                            .filter(|deleted| {
                                let gone =
                                    matches!(deleted, Err(object_store::Error::NotFound { .. }));
                                std::future::ready(!gone)
                            })
                            .try_collect::<Vec<_>>()
                            .await
                            .map_err(|e| Failure::from_store(&e, &inner.url))
                    }
                });
            client::block_on(async { asked.await.map_err(|g| g.into_error(&inner.url)) })?;
        }
        Ok(())
    }

    /// Asks for the first listing page of the prefix (retried as any request), and drops it:
    /// whether the server lists it for this prefix's store at all.
    fn ask_one_page(&self) -> Result<()> {
        let path = self.path_under("")?;
        let inner = &self.inner;
        let store = inner.store()?;
        let asked = Attempts::new(&inner.options, &inner.url).run("LIST", || async {
            match store.list(Some(&path)).next().await {
                Some(Err(e)) => Err(Failure::from_store(&e, &inner.url)),
                None | Some(Ok(_)) => Ok(()),
            }
        });
        client::block_on(async { asked.await.map_err(|g| g.into_error(&inner.url)) })
    }

    /// The URL of `name` (checked as keys are) and its path in the store.
    fn locate(&self, name: &str) -> Result<(RemoteUrl, StorePath)> {
        let key = self.key_of(name);
        let url = RemoteUrl::in_bucket(self.inner.bucket_store, &self.inner.bucket, &key)?;
        Ok((url, RemoteUrl::store_path(&key)?))
    }

    fn key_of(&self, name: &str) -> String {
        if self.inner.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.inner.prefix)
        }
    }

    /// The store path of the level `under`, checked as a key (empty: the prefix itself).
    fn path_under(&self, under: &str) -> Result<StorePath> {
        let under = under.strip_suffix('/').unwrap_or(under);
        if under.is_empty() {
            return RemoteUrl::store_path(&self.inner.prefix);
        }
        Ok(self.locate(under)?.1)
    }
}

impl Inner {
    /// A listed location's name relative to the prefix (`None` for one outside it, which a
    /// well-behaved store never lists).
    fn name_of(&self, location: &StorePath) -> Option<String> {
        let key = location.as_ref();
        if self.prefix.is_empty() {
            return Some(key.to_owned());
        }
        key.strip_prefix(self.prefix.as_str())?.strip_prefix('/').map(str::to_owned)
    }
}

/// The objects under a level of a [`RemotePrefix`], in key order: an iterator that asks for
/// the next page when the last one is used up. The first error ends it.
pub struct RemoteObjects {
    inner: Arc<Inner>,
    path: StorePath,
    stream: Option<BoxStream<'static, object_store::Result<ObjectMeta>>>,
    /// The last location given out: a page asked again starts after it.
    last: Option<StorePath>,
    done: bool,
    /// The entry read after an empty one, to tell whether that was a folder marker.
    ahead: Option<Result<RemoteEntry>>,
}

impl std::fmt::Debug for RemoteObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteObjects")
            .field("url", &self.inner.url)
            .field("under", &self.path.as_ref())
            .field("done", &self.done)
            .finish()
    }
}

impl RemoteObjects {
    /// The next entry of the listing, as the store gives it.
    fn fetch(&mut self) -> Option<Result<RemoteEntry>> {
        if self.done {
            return None;
        }
        let next = client::block_on(self.next_entry());
        match next {
            Ok(Some(entry)) => Some(Ok(entry)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }

    async fn next_entry(&mut self) -> Result<Option<RemoteEntry>> {
        let inner = Arc::clone(&self.inner);
        let mut attempts = Attempts::new(&inner.options, &inner.url);
        loop {
            let stream = match &mut self.stream {
                Some(stream) => stream,
                None => {
                    let store = inner.store()?;
                    self.stream.insert(match &self.last {
                        Some(last) => store.list_with_offset(Some(&self.path), last),
                        None => store.list(Some(&self.path)),
                    })
                }
            };
            let page = async {
                stream.next().await.transpose().map_err(|e| Failure::from_store(&e, &inner.url))
            };
            let failure = match attempts.attempt(page).await {
                Ok(Some(meta)) => {
                    let name = inner.name_of(&meta.location);
                    self.last = Some(meta.location);
                    match name {
                        Some(name) => return Ok(Some(RemoteEntry { name, len: meta.size })),
                        None => continue,
                    }
                }
                Ok(None) => return Ok(None),
                Err(failure) => failure,
            };
            // The stream is spent by its error: the next attempt lists again from the last
            // key given out.
            self.stream = None;
            attempts.retry_after(failure, "LIST").await.map_err(|g| g.into_error(&inner.url))?;
        }
    }
}

impl Iterator for RemoteObjects {
    type Item = Result<RemoteEntry>;

    fn next(&mut self) -> Option<Result<RemoteEntry>> {
        loop {
            let entry = match self.ahead.take() {
                Some(ahead) => ahead,
                None => self.fetch()?,
            };
            // An empty object with keys under it is a folder marker (`sub/`, shown as `sub`):
            // the next key in key order tells.
            let marker = match &entry {
                Ok(empty) if empty.len == 0 => format!("{}/", empty.name),
                _ => return Some(entry),
            };
            self.ahead = self.fetch();
            match &self.ahead {
                Some(Ok(next)) if next.name.starts_with(&marker) => continue,
                _ => return Some(entry),
            }
        }
    }
}
