//! Opening the object store a URL names: `file:///abs/path` (a local
//! directory), `memory://`, or `s3://bucket[/prefix]` (any S3-compatible
//! endpoint: `FLOWER_S3_ENDPOINT` or `AWS_ENDPOINT_URL`; credentials and region
//! from the usual `AWS_*` variables, never from a job spec).

use std::path::Path;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart, path::Path as ObjPath};
use tokio::io::AsyncReadExt;

use crate::{Result, StoreError};

/// Settings for S3 beyond the URL (all optional; the environment fills the rest).
#[derive(Clone, Debug, Default)]
pub struct S3Options {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

impl S3Options {
    /// From `FLOWER_S3_ENDPOINT`/`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            endpoint: var("FLOWER_S3_ENDPOINT").or_else(|| var("AWS_ENDPOINT_URL")),
            region: var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")),
            access_key_id: var("AWS_ACCESS_KEY_ID"),
            secret_access_key: var("AWS_SECRET_ACCESS_KEY"),
        }
    }
}

fn bad(url: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::backend(format!("object store `{url}`: {why}"))
}

/// Open the store `url` names.
pub fn open(url: &str, s3: &S3Options) -> Result<Arc<dyn ObjectStore>> {
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(bad(url, "give an absolute path: file:///path/to/dir"));
        }
        std::fs::create_dir_all(path).map_err(|e| bad(url, e))?;
        return Ok(Arc::new(LocalFileSystem::new_with_prefix(path).map_err(|e| bad(url, e))?));
    }
    if url == "memory://" {
        return Ok(Arc::new(InMemory::new()));
    }
    let Some(rest) = url.strip_prefix("s3://") else {
        return Err(bad(url, "use file:///path, s3://bucket/prefix or memory://"));
    };
    let (bucket, prefix) = match rest.split_once('/') {
        Some((b, p)) => (b, p.trim_matches('/')),
        None => (rest, ""),
    };
    if bucket.is_empty() {
        return Err(bad(url, "no bucket"));
    }
    let mut b =
        AmazonS3Builder::new().with_bucket_name(bucket).with_region(s3.region.as_deref().unwrap_or("us-east-1"));
    if let Some(e) = &s3.endpoint {
        b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
    }
    if let (Some(k), Some(s)) = (&s3.access_key_id, &s3.secret_access_key) {
        b = b.with_access_key_id(k).with_secret_access_key(s);
    }
    let s3store = b.build().map_err(|e| bad(url, e))?;
    Ok(if prefix.is_empty() { Arc::new(s3store) } else { Arc::new(PrefixStore::new(s3store, prefix)) })
}

/// Files up to this size go up in one request; larger ones in parts of it.
pub const PART: usize = 8 << 20;
/// Parts in flight at once while a large file goes up.
const PARTS_IN_FLIGHT: usize = 2;

/// Upload the file at `path` to `key` with bounded memory: whole when small,
/// else in parts of [`PART`] bytes (at most a few parts held at once), so a
/// task's multi-gigabyte file never sits in a worker's memory.
pub async fn put_file(store: &dyn ObjectStore, key: &ObjPath, path: &Path) -> Result<()> {
    let io = |e: std::io::Error| StoreError::backend_in(path.display(), e);
    let mut file = tokio::fs::File::open(path).await.map_err(io)?;
    let size = file.metadata().await.map_err(io)?.len();
    if size <= PART as u64 {
        let mut bytes = Vec::with_capacity(size as usize);
        // At most what was measured, should the file grow meanwhile.
        (&mut file).take(PART as u64).read_to_end(&mut bytes).await.map_err(io)?;
        store.put(key, PutPayload::from(bytes)).await.map_err(crate::workbench::obj_err)?;
        return Ok(());
    }
    let upload = store.put_multipart(key).await.map_err(crate::workbench::obj_err)?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match file.read(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                let _ = writer.abort().await;
                return Err(io(e));
            }
        };
        if n == 0 {
            break;
        }
        if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
            let _ = writer.abort().await;
            return Err(crate::workbench::obj_err(e));
        }
        writer.write(&buf[..n]);
    }
    writer.finish().await.map_err(crate::workbench::obj_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        let s3 = S3Options::default();
        assert!(open("memory://", &s3).is_ok());
        assert!(open("file://relative", &s3).is_err());
        assert!(open("ftp://x", &s3).unwrap_err().to_string().contains("use file:///path"));
        assert!(open("s3:///x", &s3).is_err());
        let dir = tempfile::tempdir().unwrap();
        assert!(open(&format!("file://{}", dir.path().display()), &s3).is_ok());
    }
}
