//! Artifacts' content in an S3-compatible object store, through Apache Arrow's `object_store`:
//! each file artifact an object named by its SHA-256 (`PREFIX/sha256/<first two hex>/<hex>`),
//! which every machine of a team reads. The client is async; it runs on a runtime of its own,
//! on its own thread, so that callers stay synchronous, inside a runtime of theirs or not.
//!
//! Credentials never pass through kavi's configuration: the client reads them as the AWS tools
//! do, from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` (or a
//! container's or an instance's credentials).

use std::future::Future;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::StreamExt;
use kavi_foundation::files::open_regular;
use kavi_foundation::hash::HashingSink;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{ClientOptions, ObjectStoreExt, RetryConfig, WriteMultipart};

/// Where the store is, as kavi.toml's `[object_store]` says (its checks are the configuration's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectSettings {
    pub bucket: String,
    /// An S3-compatible server's URL; `None`: AWS's own, for the region.
    pub endpoint: Option<String>,
    /// `None`: `AWS_REGION` or `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
    /// The folder of the bucket kavi's objects go in, without slashes at its ends.
    pub prefix: String,
    /// How long one request may take (each part of a large upload is one).
    pub timeout: Duration,
}

/// Uploads of files larger than this go in parts of this size, so that an artifact of any size
/// costs about two parts of memory (S3 takes parts of 5 MiB and more).
const PART_SIZE: usize = 8 * 1024 * 1024;

/// A connection to the object store kavi keeps artifacts in.
pub struct Objects {
    settings: ObjectSettings,
    client: Arc<AmazonS3>,
    /// Made the first time a request is sent: most commands send none.
    runtime: OnceLock<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Two clients of the same store are alike: an artifact compares by where it was put.
impl PartialEq for Objects {
    fn eq(&self, other: &Self) -> bool {
        self.settings == other.settings
    }
}

impl Eq for Objects {}

impl Drop for Objects {
    /// A runtime dropped on a thread of another runtime would panic waiting for its workers:
    /// it is let go without waiting (nothing is in flight once every call has returned).
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// An object store's error in kavi's words: a missing object is `NotFound`; anything else
/// (the store unreachable, access refused) an error that says which store.
fn store_error(e: object_store::Error, store: &str) -> io::Error {
    match e {
        object_store::Error::NotFound { path, .. } => io::Error::new(
            io::ErrorKind::NotFound,
            format!("no object {path} in the object store {store}"),
        ),
        e => io::Error::other(format!("the object store {store} failed: {e}")),
    }
}

impl Objects {
    /// A client for the store `settings` names, with the environment's credentials. Nothing is
    /// sent yet.
    pub fn new(settings: ObjectSettings) -> io::Result<Self> {
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(&settings.bucket);
        if let Some(region) = &settings.region {
            builder = builder.with_region(region);
        }
        let mut options = ClientOptions::new()
            .with_timeout(settings.timeout)
            .with_connect_timeout(settings.timeout.min(Duration::from_secs(10)));
        if let Some(endpoint) = &settings.endpoint {
            builder = builder.with_endpoint(endpoint);
            options = options.with_allow_http(endpoint.starts_with("http://"));
        }
        // A store that does not answer fails the command within about `timeout`, not the
        // client's default of three minutes of retries.
        let retry = RetryConfig {
            max_retries: 2,
            retry_timeout: settings.timeout,
            ..RetryConfig::default()
        };
        let client = builder
            .with_client_options(options)
            .with_retry(retry)
            .build()
            .map_err(|e| {
                io::Error::other(format!("the object store's settings are not usable: {e}"))
            })?;
        Ok(Self {
            settings,
            client: Arc::new(client),
            runtime: OnceLock::new(),
        })
    }

    /// The store as messages name it: its bucket, and its server when it is not AWS's.
    fn named(&self) -> String {
        match &self.settings.endpoint {
            Some(endpoint) => format!("s3://{} at {endpoint}", self.settings.bucket),
            None => format!("s3://{}", self.settings.bucket),
        }
    }

    /// The key the artifact `sha256` is kept under.
    fn key(&self, sha256: &str) -> String {
        let named = crate::relative_path(sha256);
        if self.settings.prefix.is_empty() {
            named
        } else {
            format!("{}/{named}", self.settings.prefix)
        }
    }

    /// Where the artifact `sha256` is kept, as the ledger records it: `s3://BUCKET/KEY`.
    pub fn location(&self, sha256: &str) -> String {
        format!("s3://{}/{}", self.settings.bucket, self.key(sha256))
    }

    /// The key of `location` in this store's bucket; an error for one in another bucket, which
    /// this machine was not set up to read.
    fn key_of(&self, location: &str) -> io::Result<Key> {
        let in_bucket = location
            .strip_prefix("s3://")
            .and_then(|rest| rest.split_once('/'))
            .filter(|(bucket, _)| *bucket == self.settings.bucket);
        match in_bucket {
            Some((_, key)) => Key::parse(key).map_err(|e| {
                io::Error::other(format!(
                    "the recorded location {location} is not a key: {e}"
                ))
            }),
            None => Err(io::Error::other(format!(
                "{location} is not in the bucket this machine's kavi.toml names ({})",
                self.settings.bucket
            ))),
        }
    }

    /// The store's runtime, made on first use.
    fn runtime(&self) -> io::Result<&tokio::runtime::Runtime> {
        if let Some(runtime) = self.runtime.get() {
            return Ok(runtime);
        }
        let made = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kavi-objects")
            .enable_all()
            .build()?;
        // Another thread may have made one meanwhile: either serves.
        if let Err(spare) = self.runtime.set(made) {
            spare.shutdown_background();
        }
        Ok(self.runtime.get().expect("set above"))
    }

    /// Runs `work` on the store's runtime and waits for it, from any thread.
    fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = io::Result<T>> + Send + 'static,
    ) -> io::Result<T> {
        let (done, result) = mpsc::sync_channel(1);
        self.runtime()?.spawn(async move {
            let _ = done.send(work.await);
        });
        result
            .recv()
            .map_err(|_| io::Error::other("the object store's client stopped unexpectedly"))?
    }

    /// Puts the file at `path`, the artifact `sha256` of `size` bytes, in the store, unless it
    /// is there already; returns its location. The file is hashed as it is sent, and refused
    /// (the upload undone) when it no longer matches: what every machine reads is checked.
    pub fn put_file(&self, sha256: &str, size: u64, path: &Path) -> io::Result<String> {
        let key = Key::from(self.key(sha256));
        let client = self.client.clone();
        let named = self.named();
        let mut file = open_regular(path)?;
        let expected = sha256.to_owned();
        let shown = path.display().to_string();
        self.run(async move {
            match client.head(&key).await {
                Ok(meta) if meta.size == size => return Ok(()),
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_error(e, &named)),
            }
            let changed = || {
                io::Error::other(format!(
                    "cannot put {shown} in the object store: it no longer matches its hash \
                     {expected}"
                ))
            };
            let mut hasher = HashingSink::default();
            let mut part = vec![0; PART_SIZE];
            let first = read_full(&mut file, &mut part)?;
            hasher.write_all(&part[..first])?;
            if first < PART_SIZE {
                if hasher.finish() != (expected.clone(), size) {
                    return Err(changed());
                }
                part.truncate(first);
                client
                    .put(&key, part.into())
                    .await
                    .map_err(|e| store_error(e, &named))?;
                return Ok(());
            }
            let upload = client
                .put_multipart(&key)
                .await
                .map_err(|e| store_error(e, &named))?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
            writer.write(&part[..first]);
            loop {
                let read = match read_full(&mut file, &mut part) {
                    Ok(read) => read,
                    Err(e) => {
                        let _ = writer.abort().await;
                        return Err(e);
                    }
                };
                if read == 0 {
                    break;
                }
                hasher.write_all(&part[..read])?;
                if let Err(e) = writer.wait_for_capacity(2).await {
                    let _ = writer.abort().await;
                    return Err(store_error(e, &named));
                }
                writer.write(&part[..read]);
            }
            if hasher.finish() != (expected.clone(), size) {
                let _ = writer.abort().await;
                return Err(changed());
            }
            writer.finish().await.map_err(|e| store_error(e, &named))?;
            Ok(())
        })?;
        Ok(self.location(sha256))
    }

    /// Writes the object at `location` to `writer` as it arrives, a piece at a time. The
    /// bytes are not checked here: whoever reads them hashes them. A missing object is an
    /// error of kind `NotFound`.
    pub fn copy_to(&self, location: &str, writer: &mut dyn Write) -> io::Result<()> {
        let key = self.key_of(location)?;
        let client = self.client.clone();
        let named = self.named();
        let (pieces, arriving) = mpsc::sync_channel::<io::Result<bytes::Bytes>>(4);
        // The download runs on the store's runtime while this thread writes what arrives; it
        // ends when the object has come, or when this thread stops taking it.
        self.runtime()?.spawn(async move {
            let mut stream = match client.get(&key).await {
                Ok(got) => got.into_stream(),
                Err(e) => {
                    let _ = pieces.send(Err(store_error(e, &named)));
                    return;
                }
            };
            while let Some(piece) = stream.next().await {
                let piece = piece.map_err(|e| store_error(e, &named));
                let failed = piece.is_err();
                if pieces.send(piece).is_err() || failed {
                    return;
                }
            }
        });
        for piece in arriving {
            writer.write_all(&piece?)?;
        }
        Ok(())
    }

    /// Removes the object of the artifact `sha256` at its recorded `location`; one already gone
    /// is what was wanted. Only a key named by that hash is removed: a location that names
    /// anything else (edited where the ledger keeps it) is refused, so that nothing but an
    /// artifact's own object can be removed through it.
    pub fn delete(&self, sha256: &str, location: &str) -> io::Result<()> {
        let key = self.key_of(location)?;
        let named = crate::relative_path(sha256);
        let own = key.as_ref() == named || key.as_ref().ends_with(&format!("/{named}"));
        if !own || sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(io::Error::other(format!(
                "{location} is not the object of artifact {sha256}: not removed"
            )));
        }
        let client = self.client.clone();
        let store = self.named();
        self.run(async move {
            match client.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(store_error(e, &store)),
            }
        })
    }
}

/// Reads into `buffer` until it is full or the reader ends; how much was read.
fn read_full(reader: &mut impl Read, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects(prefix: &str) -> Objects {
        Objects::new(ObjectSettings {
            bucket: "team".into(),
            endpoint: Some("http://127.0.0.1:9".into()),
            region: Some("us-east-1".into()),
            prefix: prefix.into(),
            timeout: Duration::from_secs(1),
        })
        .unwrap()
    }

    /// An artifact's object is named by its hash under the prefix, and the recorded location is
    /// read back only in the bucket this machine names.
    #[test]
    fn an_object_is_named_by_its_hash_and_read_in_its_own_bucket_only() {
        let sha = "ab".repeat(32);
        let located = objects("kavi/artifacts").location(&sha);
        assert_eq!(located, format!("s3://team/kavi/artifacts/sha256/ab/{sha}"));
        assert_eq!(
            objects("").location(&sha),
            format!("s3://team/sha256/ab/{sha}")
        );
        // Another machine with another prefix reads the key the ledger recorded.
        let key = objects("").key_of(&located).unwrap();
        assert_eq!(key.as_ref(), format!("kavi/artifacts/sha256/ab/{sha}"));
        let error = objects("")
            .key_of(&format!("s3://other/sha256/ab/{sha}"))
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("is not in the bucket this machine's kavi.toml names (team)"),
            "{error}"
        );
    }

    /// Only an artifact's own object is removed through a recorded location: one whose key is
    /// not named by the hash (another artifact's, or any other key of the bucket) is refused
    /// before anything is sent.
    #[test]
    fn only_an_artifacts_own_object_is_removed() {
        let objects = objects("kavi");
        let sha = "ab".repeat(32);
        let other = "cd".repeat(32);
        for location in [
            objects.location(&other),
            "s3://team/kavi/keep/this".to_owned(),
            format!("s3://team/kavi/sha256/ab/{sha}/extra"),
            format!("s3://team/kavi/sha256/ab/x{sha}"),
        ] {
            let error = objects.delete(&sha, &location).unwrap_err();
            assert!(
                error
                    .to_string()
                    .ends_with(&format!("is not the object of artifact {sha}: not removed")),
                "{location}: {error}"
            );
        }
        // A hash that is not one names no object either.
        let error = objects
            .delete("ab", "s3://team/kavi/sha256/ab/ab")
            .unwrap_err();
        assert!(error.to_string().contains("not removed"), "{error}");
    }

    /// A store nobody answers at is an error that names it, within the timeout, not a hang
    /// or a panic; the same from inside another runtime, as a node's action calls it.
    #[test]
    fn a_store_that_cannot_be_reached_is_an_error_naming_it() {
        let objects = objects("");
        let mut sink = Vec::new();
        let error = objects
            .copy_to(&objects.location(&"0".repeat(64)), &mut sink)
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("the object store s3://team at http://127.0.0.1:9 failed: "),
            "{error}"
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let file = tempfile::NamedTempFile::new().unwrap();
        let error = runtime
            .block_on(async { objects.put_file(&"0".repeat(64), 0, file.path()) })
            .unwrap_err();
        assert_ne!(error.kind(), io::ErrorKind::NotFound, "{error}");
        // Dropped inside that runtime: let go, not waited for.
        runtime.block_on(async { drop(objects) });
    }
}
