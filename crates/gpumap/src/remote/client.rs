//! The object_store client behind a [`RemoteFile`](super::RemoteFile), and the runtime that
//! drives it.
//!
//! object_store is async; gpumap's calls are blocking (and its futures run on the I/O pool),
//! so one multi-threaded tokio runtime of the library's own, made at the first remote open,
//! runs every request. Its own retries are off: `fetch` (the ranged GETs) retries with the caller's
//! status codes and backoff.
#![forbid(unsafe_code)]

use std::sync::Arc;

use object_store::multipart::MultipartStore;
use object_store::path::Path as StorePath;
use object_store::{ClientOptions, ObjectStore, RetryConfig};
use tokio::sync::Semaphore;

use crate::error::{Error, RemoteErrorKind, Result};
use crate::per_process::{ForkLocal, PerProcess};
use crate::remote::answers::CheckedConnector;
use crate::remote::aws_profile::Profile;
use crate::remote::failure::{self, Failure};
use crate::remote::loops::{LoopSet, Queues, StoreSource};
use crate::remote::options::{is_sendable_credential, RemoteOptions, S3Credentials};
use crate::remote::stores::StoreOwner;
use crate::remote::url::RemoteUrl;
use crate::remote::webhdfs::WebHdfs;

/// A store, the object in it, and the permits of the requests in flight through it.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    /// The store and permits of the process (see [`Connections`]).
    connections: Arc<ForkLocal<Connections>>,
    /// A read lane's or request loop's own store, in place of the shared one (see
    /// [`Client::with_store`]).
    thread_store: Option<Arc<dyn ObjectStore>>,
    pub(crate) path: StorePath,
    /// How to make another store like the shared one: a read lane makes its own (see
    /// [`lanes`](super::lanes)), whose connections live on the lane's runtime, and a forked
    /// child makes its own too.
    pub(crate) recipe: Arc<StoreRecipe>,
}

/// A store and its request permits, as one process uses them. A forked child that reads a
/// file opened before the fork makes its own from the recipe: the parent's pooled connections
/// are driven by the parent's runtime, which the child does not have (a request on one waited
/// for ever), and permits the parent's requests held at the fork would never come back.
#[derive(Debug, Clone)]
pub(crate) struct Connections {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// One permit per ranged GET in flight, shared by every read of the file (and by the files
    /// a [`RemotePrefix`](super::RemotePrefix) opens): many reads started at once queue here
    /// rather than each open a connection of its own.
    pub(crate) requests: Arc<Semaphore>,
    /// Where its reads of one request wait for a request loop, each loop with its share of
    /// the requests in flight: a small read's queues, and a large one's
    /// ([`LoopSet`], in that order). The permits bound both together.
    pub(crate) queues: [Arc<Queues>; 2],
}

impl Connections {
    /// Connections made from `recipe` (a store of its own, and its permits).
    pub(crate) fn made_from(recipe: &Arc<StoreRecipe>) -> Result<Connections> {
        Ok(Connections::through(recipe.store()?, recipe))
    }

    /// Connections through `store`, made from `recipe`.
    pub(crate) fn through(store: Arc<dyn ObjectStore>, recipe: &Arc<StoreRecipe>) -> Connections {
        let in_flight = recipe.options.requests_in_flight();
        let queues = |set: LoopSet| {
            let recipe = Arc::clone(recipe);
            let source = StoreSource {
                owner: Arc::clone(&recipe.owner),
                make: Arc::new(move || recipe.per_thread_store(set.count())),
            };
            Arc::new(Queues::new(set, in_flight, source))
        };
        Connections {
            store,
            requests: request_permits(&recipe.options),
            queues: [queues(LoopSet::Small), queues(LoopSet::Large)],
        }
    }
}

/// What a store is made from: a second store made from it reaches the same objects with the
/// same credentials and settings, through connections of its own.
#[derive(Debug)]
pub(crate) struct StoreRecipe {
    url: RemoteUrl,
    pub(crate) options: RemoteOptions,
    /// The lanes and loops keep the stores they make from this recipe while it lives.
    pub(crate) owner: Arc<StoreOwner>,
}

impl StoreRecipe {
    /// The recipe of the stores for `url` opened with `options` (for S3, any key of the
    /// bucket: the store is the bucket's).
    pub(crate) fn new(url: &RemoteUrl, options: &RemoteOptions) -> StoreRecipe {
        StoreRecipe { url: url.clone(), options: options.clone(), owner: Arc::default() }
    }

    /// A new store: S3 with credentials, region and endpoint from the standard AWS environment
    /// variables, then the shared AWS files (the options' endpoint and region override both),
    /// plain HTTP, or WebHDFS.
    pub(crate) fn store(&self) -> Result<Arc<dyn ObjectStore>> {
        self.store_keeping(self.options.requests_in_flight())
    }

    /// A store for one of `threads` read lanes or request loops that share the file's
    /// requests: it keeps as many idle connections as one of them has requests in flight at
    /// most, so that together they keep about the file's bound (each keeping the whole bound
    /// kept up to sixteen times as many sockets open).
    pub(crate) fn per_thread_store(&self, threads: usize) -> Result<Arc<dyn ObjectStore>> {
        self.store_keeping(self.options.requests_in_flight().div_ceil(threads.max(1)) + 1)
    }

    /// A store whose connection pool keeps at most `idle` connections unused.
    fn store_keeping(&self, idle: usize) -> Result<Arc<dyn ObjectStore>> {
        let (url, options) = (&self.url, &self.options);
        let client_options = client_options(options).with_pool_max_idle_per_host(idle);
        Ok(match url {
            RemoteUrl::S3 { bucket, .. } => {
                Arc::new(s3_store_with(url, bucket, options, client_options)?)
            }
            RemoteUrl::Gcs { bucket, .. } => {
                Arc::new(gcs_store_with(url, bucket, options, client_options)?)
            }
            RemoteUrl::Azure { container, .. } => {
                Arc::new(azure_store_with(url, container, options, client_options)?)
            }
            RemoteUrl::Http(full) => {
                // The whole URL is the store's base and the object's path is empty, so the
                // request goes to exactly the URL given, query string (a presigned URL's
                // signature) included.
                let store = object_store::http::HttpBuilder::new()
                    .with_url(full.as_str())
                    .with_client_options(client_options)
                    .with_http_connector(CheckedConnector)
                    .with_retry(no_retries())
                    .build()
                    .map_err(|e| invalid(url, &e))?;
                Arc::new(store)
            }
            RemoteUrl::WebHdfs(full) => Arc::new(
                WebHdfs::new(full.clone(), url.redacted(), &client_options)
                    .map_err(|e| invalid(url, &e))?,
            ),
        })
    }
}

/// The permits of a client opened with `options`
/// ([`requests_in_flight`](RemoteOptions::requests_in_flight)).
fn request_permits(options: &RemoteOptions) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(options.requests_in_flight()))
}

impl Client {
    /// A client for `url` (see [`StoreRecipe::store`]), with the permits `options` give.
    pub(crate) fn connect(url: &RemoteUrl, options: &RemoteOptions) -> Result<Client> {
        let recipe = Arc::new(StoreRecipe::new(url, options));
        let path = match url {
            RemoteUrl::S3 { key, .. }
            | RemoteUrl::Gcs { key, .. }
            | RemoteUrl::Azure { key, .. } => RemoteUrl::store_path(key)?,
            RemoteUrl::Http(_) | RemoteUrl::WebHdfs(_) => StorePath::default(),
        };
        let connections = Arc::new(ForkLocal::new(Connections::made_from(&recipe)?));
        Ok(Client { connections, thread_store: None, path, recipe })
    }

    /// A client of the object at `path` through `connections` (a prefix's, shared by the
    /// files it opens), whose store `recipe` makes.
    pub(crate) fn sharing(
        connections: Arc<ForkLocal<Connections>>,
        path: StorePath,
        recipe: Arc<StoreRecipe>,
    ) -> Client {
        Client { connections, thread_store: None, path, recipe }
    }

    /// This client with `store` in place of its own (a lane's, made from the same recipe).
    pub(crate) fn with_store(&self, store: Arc<dyn ObjectStore>) -> Client {
        Client { thread_store: Some(store), ..self.clone() }
    }

    /// The store its requests go through in this process.
    pub(crate) fn store(&self) -> Result<Arc<dyn ObjectStore>> {
        match &self.thread_store {
            Some(store) => Ok(store.clone()),
            None => Ok(self.connections()?.store),
        }
    }

    /// The permits of its requests in this process.
    pub(crate) fn requests(&self) -> Result<Arc<Semaphore>> {
        Ok(self.connections()?.requests)
    }

    /// Where its reads of one request of `len` bytes wait for a request loop, in this process.
    pub(crate) fn queues(&self, len: usize) -> Result<Arc<Queues>> {
        let [small, large] = self.connections()?.queues;
        Ok(match LoopSet::for_len(len) {
            LoopSet::Small => small,
            LoopSet::Large => large,
        })
    }

    fn connections(&self) -> Result<Connections> {
        self.connections.get(|| Connections::made_from(&self.recipe))
    }
}

/// The S3 store of `bucket` (for `url`, named in errors): credentials, region and endpoint
/// from the standard AWS environment variables, then the shared AWS files; the options'
/// endpoint and region override both.
fn s3_store(
    url: &RemoteUrl,
    bucket: &str,
    options: &RemoteOptions,
) -> Result<object_store::aws::AmazonS3> {
    s3_store_with(url, bucket, options, client_options(options))
}

/// [`s3_store`] with `client_options` of the caller's.
fn s3_store_with(
    url: &RemoteUrl,
    bucket: &str,
    options: &RemoteOptions,
    client_options: ClientOptions,
) -> Result<object_store::aws::AmazonS3> {
    let mut builder = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_client_options(client_options)
        .with_http_connector(CheckedConnector)
        .with_retry(no_retries());
    // Unsigned requests need no credentials, so none are looked for (the AWS files' profile
    // may name a way of getting them that gpumap refuses).
    if !options.unsigned {
        builder = with_shared_profile(builder)?;
    }
    if let Some(endpoint) = &options.s3_endpoint {
        // An endpoint given with the object (its URL's host) decides the style, whatever
        // AWS_VIRTUAL_HOSTED_STYLE_REQUEST says.
        builder = builder
            .with_endpoint(endpoint)
            .with_virtual_hosted_style_request(options.s3_virtual_hosted);
    }
    if let Some(region) = &options.s3_region {
        builder = builder.with_region(region);
    }
    if options.unsigned {
        builder = builder.with_skip_signature(true);
    } else if let Some(given) = &options.s3_credentials {
        builder = builder.with_credentials(Arc::new(object_store::StaticCredentialProvider::new(
            aws_credential(given)?,
        )));
    } else {
        check_found_credentials(&builder)?;
    }
    check_s3_settings(&builder)?;
    builder.build().map_err(|e| invalid(url, &e))
}

/// A store that takes plain PUTs and multipart uploads (S3's, GCS's, Azure's blocks): what
/// writers and prefixes hold.
pub(crate) trait WriteStore: ObjectStore + MultipartStore {}

impl<T: ObjectStore + MultipartStore> WriteStore for T {}

/// The store of the bucket an S3, GCS or Azure `url` names (an object's, or a prefix's), made
/// as [`s3_store`] and the GCS and Azure stores of [`StoreRecipe::store`] are; `None` for a URL
/// of no bucket (HTTP, WebHDFS).
pub(crate) fn bucket_store(
    url: &RemoteUrl,
    options: &RemoteOptions,
) -> Result<Option<Arc<dyn WriteStore>>> {
    Ok(match url {
        RemoteUrl::S3 { bucket, .. } => Some(Arc::new(s3_store(url, bucket, options)?)),
        RemoteUrl::Gcs { bucket, .. } => {
            Some(Arc::new(gcs_store_with(url, bucket, options, client_options(options))?))
        }
        RemoteUrl::Azure { container, .. } => {
            Some(Arc::new(azure_store_with(url, container, options, client_options(options))?))
        }
        RemoteUrl::Http(_) | RemoteUrl::WebHdfs(_) => None,
    })
}

/// The GCS store of `bucket` (for `url`, named in errors), with `client_options`: credentials,
/// and the endpoint (`GOOGLE_BASE_URL`), from the environment as object_store reads it.
fn gcs_store_with(
    url: &RemoteUrl,
    bucket: &str,
    options: &RemoteOptions,
    client_options: ClientOptions,
) -> Result<object_store::gcp::GoogleCloudStorage> {
    let builder = object_store::gcp::GoogleCloudStorageBuilder::from_env();
    if !options.unsigned {
        check_found_gcs_token(&builder)?;
    }
    check_gcs_settings(&builder)?;
    builder
        .with_bucket_name(bucket)
        .with_client_options(client_options)
        .with_http_connector(CheckedConnector)
        .with_retry(no_retries())
        .with_skip_signature(options.unsigned)
        .build()
        .map_err(|e| invalid(url, &e))
}

/// The Azure store of `container` (for `url`, named in errors), with `client_options`: the
/// storage account, its endpoint and the credentials from the environment as object_store
/// reads them (`AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ENDPOINT`, an account key, a SAS,
/// a bearer token, a service principal, else the machine's managed identity).
fn azure_store_with(
    url: &RemoteUrl,
    container: &str,
    options: &RemoteOptions,
    client_options: ClientOptions,
) -> Result<object_store::azure::MicrosoftAzure> {
    let builder = object_store::azure::MicrosoftAzureBuilder::from_env();
    check_azure_settings(&builder, options.unsigned)?;
    builder
        .with_container_name(container)
        .with_client_options(client_options)
        .with_http_connector(CheckedConnector)
        .with_retry(no_retries())
        .with_skip_signature(options.unsigned)
        .build()
        .map_err(|e| invalid(url, &e))
}

/// The credential object_store signs with, from the caller's: a temporary key (`ASIA...`)
/// given without its token takes `AWS_SESSION_TOKEN`'s, as KvikIO does; a permanent key is
/// sent without one, whatever the environment holds.
fn aws_credential(given: &S3Credentials) -> Result<object_store::aws::AwsCredential> {
    let token = given.session_token.clone().or_else(|| {
        given
            .access_key_id
            .starts_with("ASIA")
            .then(|| std::env::var("AWS_SESSION_TOKEN").ok().filter(|t| !t.is_empty()))
            .flatten()
    });
    if token.as_deref().is_some_and(|t| !is_sendable_credential(t)) {
        return Err(unprintable("AWS_SESSION_TOKEN"));
    }
    Ok(object_store::aws::AwsCredential {
        key_id: given.access_key_id.clone(),
        secret_key: given.secret_access_key.clone(),
        token,
    })
}

/// Refuses credentials the builder found (in the environment or the AWS files) that the
/// request signer would panic on: a control character, which no header can hold.
fn check_found_credentials(builder: &object_store::aws::AmazonS3Builder) -> Result<()> {
    use object_store::aws::AmazonS3ConfigKey as Key;
    refuse_unsendable(
        [
            (Key::AccessKeyId, "AWS_ACCESS_KEY_ID"),
            (Key::SecretAccessKey, "AWS_SECRET_ACCESS_KEY"),
            (Key::Token, "AWS_SESSION_TOKEN"),
        ]
        .map(|(key, var)| (builder.get_config_value(&key), var)),
    )
}

/// Refuses a bearer token from the environment that object_store's request would panic on (a
/// control character, which no header can hold).
fn check_found_gcs_token(builder: &object_store::gcp::GoogleCloudStorageBuilder) -> Result<()> {
    use object_store::gcp::GoogleConfigKey;
    let token = builder.get_config_value(&GoogleConfigKey::BearerToken);
    refuse_unsendable([(token, "GOOGLE_BEARER_TOKEN")])
}

/// Refuses the first of `found` (a value a builder found, beside the variable it is known
/// by) that holds a control character, which no header can carry, naming the variable.
fn refuse_unsendable<'a>(found: impl IntoIterator<Item = (Option<String>, &'a str)>) -> Result<()> {
    let mut found = found.into_iter();
    match found.find(|(value, _)| value.as_deref().is_some_and(|v| !is_sendable_credential(v))) {
        Some((_, var)) => Err(unprintable(var)),
        None => Ok(()),
    }
}

/// A credential (named by its variable, its value never shown) that cannot be sent.
fn unprintable(var: &str) -> Error {
    Error::InvalidConfig {
        var: var.to_owned(),
        value: "…".to_owned(),
        reason: "a credential (from the environment or the AWS files) holds a control \
                 character, which no request can carry"
            .to_owned(),
    }
}

/// Refuses a region or an endpoint, from the options, the environment or the AWS files,
/// that the request signer would choke on (object_store panics there): a region is a plain
/// token, an endpoint an `http(s)://host[:port][/path]` URL without query or fragment.
fn check_s3_settings(builder: &object_store::aws::AmazonS3Builder) -> Result<()> {
    use object_store::aws::AmazonS3ConfigKey as Key;
    let refuse = |setting: &str, value: &str, reason: &str| {
        Error::InvalidArgument(format!("{setting} \"{}\": {reason}", value.escape_debug()))
    };
    if let Some(region) = builder.get_config_value(&Key::Region) {
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.';
        if region.is_empty() || region.len() > 64 || !region.chars().all(plain) {
            let reason = "a region is a name such as us-east-1 (letters, digits, '-', '_', '.')";
            return Err(refuse("the S3 region (aws_region, AWS_REGION)", &region, reason));
        }
    }
    if let Some(endpoint) = builder.get_config_value(&Key::Endpoint) {
        if !is_endpoint_url(&endpoint) {
            return Err(refuse(
                "the S3 endpoint (aws_endpoint_url, AWS_ENDPOINT_URL)",
                &shown_endpoint(&endpoint),
                ENDPOINT_RULE,
            ));
        }
    }
    Ok(())
}

/// Refuses a GCS endpoint (`GOOGLE_BASE_URL`) that object_store would panic on when it makes
/// a request of it.
fn check_gcs_settings(builder: &object_store::gcp::GoogleCloudStorageBuilder) -> Result<()> {
    use object_store::gcp::GoogleConfigKey;
    match builder.get_config_value(&GoogleConfigKey::BaseUrl) {
        Some(base) if !is_endpoint_url(&base) => Err(Error::InvalidArgument(format!(
            "the GCS endpoint (GOOGLE_BASE_URL) \"{}\": {ENDPOINT_RULE}",
            shown_endpoint(&base).escape_debug()
        ))),
        _ => Ok(()),
    }
}

/// Refuses Azure settings from the environment that object_store would panic on, or would
/// refuse in words that do not name the variable: no storage account (outside the emulator),
/// an account name that is not one (it goes into the host and the signature's header), an
/// endpoint that is not an http(s) URL of a host (the store's, and those tokens are asked of),
/// and, for signed requests, a tenant that is not a plain name (it goes into the token
/// endpoint's path) and a bearer token or Fabric setting with a control character (they go
/// into headers).
fn check_azure_settings(
    builder: &object_store::azure::MicrosoftAzureBuilder,
    unsigned: bool,
) -> Result<()> {
    use object_store::azure::AzureConfigKey as Key;
    let emulator = builder.get_config_value(&Key::UseEmulator).is_some_and(|v| is_truthy(&v));
    match builder.get_config_value(&Key::AccountName) {
        None if !emulator => {
            return Err(Error::InvalidConfig {
                var: "AZURE_STORAGE_ACCOUNT_NAME".into(),
                value: String::new(),
                reason: "an az://container/blob URL names no storage account; set \
                         AZURE_STORAGE_ACCOUNT_NAME to it"
                    .into(),
            })
        }
        Some(account) if !is_azure_account(&account) => {
            return Err(Error::InvalidConfig {
                var: "AZURE_STORAGE_ACCOUNT_NAME".into(),
                value: account.escape_debug().to_string(),
                reason: "a storage account's name is 3 to 24 lowercase letters and digits".into(),
            })
        }
        _ => {}
    }
    let endpoints = [
        (builder.get_config_value(&Key::Endpoint), "AZURE_STORAGE_ENDPOINT"),
        (
            emulator.then(|| std::env::var("AZURITE_BLOB_STORAGE_URL").ok()).flatten(),
            "AZURITE_BLOB_STORAGE_URL",
        ),
    ];
    // Where tokens are asked for matters to signed requests alone.
    let token_endpoints = [
        (Key::MsiEndpoint, "AZURE_MSI_ENDPOINT (IDENTITY_ENDPOINT)"),
        (Key::AuthorityHost, "AZURE_AUTHORITY_HOST"),
        (Key::FabricTokenServiceUrl, "AZURE_FABRIC_TOKEN_SERVICE_URL"),
    ];
    let token_endpoints = token_endpoints.iter().filter(|_| !unsigned);
    let token_endpoints = token_endpoints.map(|(key, var)| (builder.get_config_value(key), *var));
    for (endpoint, var) in endpoints.into_iter().chain(token_endpoints) {
        if let Some(endpoint) = endpoint.filter(|e| !is_endpoint_url(e)) {
            return Err(Error::InvalidArgument(format!(
                "the Azure endpoint ({var}) \"{}\": {ENDPOINT_RULE}",
                shown_endpoint(&endpoint).escape_debug()
            )));
        }
    }
    if unsigned {
        return Ok(());
    }
    if let Some(tenant) = builder.get_config_value(&Key::AuthorityId) {
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
        if tenant.is_empty() || tenant.len() > 256 || !tenant.chars().all(plain) {
            return Err(Error::InvalidConfig {
                var: "AZURE_TENANT_ID".into(),
                value: tenant.escape_debug().to_string(),
                reason: "a tenant is a GUID or a domain name (letters, digits, '-', '.')".into(),
            });
        }
    }
    refuse_unsendable(
        [
            (Key::Token, "AZURE_STORAGE_TOKEN"),
            (Key::FabricWorkloadHost, "AZURE_FABRIC_WORKLOAD_HOST"),
            (Key::FabricSessionToken, "AZURE_FABRIC_SESSION_TOKEN"),
            (Key::FabricClusterIdentifier, "AZURE_FABRIC_CLUSTER_IDENTIFIER"),
        ]
        .map(|(key, var)| (builder.get_config_value(&key), var)),
    )
}

/// Azure's rule for storage account names: 3 to 24 lowercase letters and digits.
fn is_azure_account(name: &str) -> bool {
    (3..=24).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// A boolean setting as object_store reads one: `true`, `1`, `yes`, `on` (any case) are true.
fn is_truthy(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on" | "y")
}

const ENDPOINT_RULE: &str = "an endpoint is an http:// or https:// URL of a host (and port), \
                             with no user, query or fragment";

/// Whether `text` is an `http(s)://` URL of a host, with no user, query, fragment, space or
/// control character: one object_store can put requests together from as it is.
fn is_endpoint_url(text: &str) -> bool {
    !text.chars().any(|c| c.is_control() || c.is_whitespace())
        && ::url::Url::parse(text).is_ok_and(|u| {
            matches!(u.scheme(), "http" | "https")
                && u.host_str().is_some_and(|h| !h.is_empty())
                && u.query().is_none()
                && u.fragment().is_none()
                && u.username().is_empty()
                && u.password().is_none()
        })
}

/// An endpoint as a refusal shows it: its scheme alone, since the rest could hold a password.
fn shown_endpoint(text: &str) -> String {
    match text.split_once("://") {
        Some((scheme, _)) if scheme.len() <= 16 => format!("{scheme}://…"),
        _ => "…".to_owned(),
    }
}

fn client_options(options: &RemoteOptions) -> ClientOptions {
    ClientOptions::new()
        .with_timeout(options.timeout)
        .with_connect_timeout(options.connect_timeout)
        // The caller chose the scheme; an http:// endpoint is as deliberate as https://.
        .with_allow_http(true)
}

/// object_store's own retries are off: gpumap's retry with the caller's statuses and backoff.
fn no_retries() -> RetryConfig {
    RetryConfig { max_retries: 0, ..RetryConfig::default() }
}

/// A builder's refusal, its message scrubbed (it may quote the URL it was given).
fn invalid(url: &RemoteUrl, e: &object_store::Error) -> Error {
    let reason = failure::scrub(&e.to_string(), url);
    Failure::new(RemoteErrorKind::InvalidUrl, None, reason).into_error(url, "open", 0)
}

/// The environment variables any of which gives object_store its credentials (keys, web
/// identity, container credentials), before the AWS files are looked at.
const ENV_CREDENTIALS: [&str; 4] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
];

/// Whether signed S3 requests find credentials other than the instance metadata service's:
/// in the environment (keys, web identity, container credentials) or in the AWS files'
/// profile. A profile that cannot be read counts as configured: its error is the signed
/// open's to report.
pub(crate) fn s3_credentials_configured() -> bool {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    ENV_CREDENTIALS.iter().any(|name| env(name).is_some())
        || match Profile::load(env) {
            Ok(Some(profile)) => {
                profile.access_key_id.is_some() || profile.unsupported_source.is_some()
            }
            Ok(None) => false,
            Err(_) => true,
        }
}

/// The variables by which object_store finds Google credentials (a service account, the
/// application default credentials' file, a bearer token).
const GCS_ENV_CREDENTIALS: [&str; 6] = [
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_BEARER_TOKEN",
    "SERVICE_ACCOUNT",
];

/// Whether signed GCS requests find credentials other than the metadata server's: in the
/// environment, or gcloud's application default credentials file.
pub(crate) fn gcs_credentials_configured() -> bool {
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    GCS_ENV_CREDENTIALS.iter().any(|name| env(name).is_some())
        || env("HOME").is_some_and(|home| {
            std::path::Path::new(&home)
                .join(".config/gcloud/application_default_credentials.json")
                .exists()
        })
}

/// The variables by which object_store finds Azure credentials (an account key, a SAS, a
/// bearer token, a service principal's secret or federated token); the flags that ask for the
/// Azure CLI's or the emulator's are [`AZURE_ENV_CREDENTIAL_FLAGS`].
const AZURE_ENV_CREDENTIALS: [&str; 8] = [
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_MASTER_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_TOKEN",
    "AZURE_CLIENT_SECRET",
    "AZURE_FEDERATED_TOKEN_FILE",
];

/// Flags that make object_store sign with the Azure CLI's token, or with the emulator's
/// well-known key.
const AZURE_ENV_CREDENTIAL_FLAGS: [&str; 2] = ["AZURE_USE_AZURE_CLI", "AZURE_STORAGE_USE_EMULATOR"];

/// Whether signed Azure requests find credentials other than a managed identity's: in the
/// environment, or by a flag asking for the Azure CLI's or the emulator's.
pub(crate) fn azure_credentials_configured() -> bool {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    AZURE_ENV_CREDENTIALS.iter().any(|name| env(name).is_some())
        || AZURE_ENV_CREDENTIAL_FLAGS.iter().any(|name| env(name).is_some_and(|v| is_truthy(&v)))
}

/// `builder` with what the AWS shared files' profile sets and the environment does not, in the
/// order the AWS tools take them: environment first, then the files.
fn with_shared_profile(
    mut builder: object_store::aws::AmazonS3Builder,
) -> Result<object_store::aws::AmazonS3Builder> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let Some(profile) = Profile::load(env)? else { return Ok(builder) };
    let env_sets = |names: &[&str]| names.iter().any(|n| env(n).is_some());
    let env_credentials = env_sets(&ENV_CREDENTIALS);
    if !env_credentials {
        match (&profile.access_key_id, &profile.secret_access_key, &profile.unsupported_source) {
            (Some(id), Some(secret), _) => {
                builder = builder.with_access_key_id(id).with_secret_access_key(secret);
                if let Some(token) = &profile.session_token {
                    builder = builder.with_token(token);
                }
            }
            (_, _, Some(source)) => {
                return Err(Error::InvalidConfig {
                    var: "AWS_PROFILE".into(),
                    value: env("AWS_PROFILE").unwrap_or_else(|| "default".into()),
                    reason: format!(
                        "the profile gets its credentials through {source}, which gpumap does \
                         not run; put them in the environment (`aws configure \
                         export-credentials --format env`)"
                    ),
                });
            }
            _ => {}
        }
    }
    if !env_sets(&["AWS_REGION", "AWS_DEFAULT_REGION"]) {
        if let Some(region) = &profile.region {
            builder = builder.with_region(region);
        }
    }
    if !env_sets(&["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]) {
        if let Some(endpoint) = &profile.endpoint_url {
            builder = builder.with_endpoint(endpoint);
        }
    }
    Ok(builder)
}

/// The runtime every remote request runs on, made at first use (in a forked child, its own).
pub(crate) fn runtime() -> Result<Arc<tokio::runtime::Runtime>> {
    static RUNTIME: PerProcess<Arc<tokio::runtime::Runtime>> = PerProcess::new();
    RUNTIME.get_or_try_make(|| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("gpumap-remote")
            .enable_all()
            .build()
            .map(Arc::new)
            .map_err(|e| Error::Unavailable {
                what: "the remote I/O runtime",
                reason: e.to_string(),
            })
    })
}

/// `Ok` where a blocking call may wait on the runtime. A caller already inside an async runtime
/// would deadlock a worker (tokio panics instead): it gets an error telling it to use the `p*`
/// futures or a thread of its own. The check is any runtime context, so `spawn_blocking`'s
/// threads are refused too (tokio tells them from workers by nothing public).
pub(crate) fn blocking_allowed() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::InvalidArgument(
            "a blocking remote call was made from inside an async runtime (a task, or \
             spawn_blocking's threads); make it from a thread of its own (std::thread::spawn), \
             or use the pread futures"
                .to_owned(),
        ));
    }
    Ok(())
}

/// Runs `work` to completion on the runtime from a blocking caller (see [`blocking_allowed`]).
pub(crate) fn block_on<T>(work: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    blocking_allowed()?;
    runtime()?.block_on(work)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::aws::AmazonS3Builder;

    #[test]
    fn found_credentials_no_header_can_hold_are_refused_naming_the_variable_not_the_value() {
        let fine = AmazonS3Builder::new()
            .with_access_key_id("AKIAEXAMPLE")
            .with_secret_access_key("s3cr3t/+=")
            .with_token("");
        assert!(check_found_credentials(&fine).is_ok());
        assert!(check_found_credentials(&AmazonS3Builder::new()).is_ok());
        for (builder, var) in [
            (AmazonS3Builder::new().with_access_key_id("AKIA\nX"), "AWS_ACCESS_KEY_ID"),
            (AmazonS3Builder::new().with_secret_access_key("se\u{1}cret"), "AWS_SECRET_ACCESS_KEY"),
            (AmazonS3Builder::new().with_token("tok\u{7f}en"), "AWS_SESSION_TOKEN"),
        ] {
            match check_found_credentials(&builder) {
                Err(Error::InvalidConfig { var: named, value, reason }) => {
                    assert_eq!((named.as_str(), value.as_str()), (var, "…"));
                    assert!(!reason.contains("cret") && !reason.contains("tok"), "{reason}");
                }
                other => panic!("{var} was not refused: {other:?}"),
            }
        }
    }
}
