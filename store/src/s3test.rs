//! An S3-compatible server (s3s over a local directory) that a test starts in
//! its own process on a loopback port, so S3 code paths run against a real
//! HTTP S3 endpoint without anything installed.

use std::net::SocketAddr;
use std::path::PathBuf;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

use crate::objects::S3Options;

pub const ACCESS_KEY: &str = "flower-test-access";
pub const SECRET_KEY: &str = "flower-test-secret-key";

pub struct S3TestServer {
    pub addr: SocketAddr,
    pub bucket: String,
    _root: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl S3TestServer {
    /// Start on `127.0.0.1:0` with one bucket.
    pub async fn start(bucket: &str) -> std::io::Result<Self> {
        let root = tempfile::tempdir()?;
        std::fs::create_dir_all(root.path().join(bucket))?;
        let fs =
            s3s_fs::FileSystem::new(PathBuf::from(root.path())).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = builder.build();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            while let Ok((socket, _)) = listener.accept().await {
                let conn = http.serve_connection(TokioIo::new(socket), service.clone()).into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        Ok(Self { addr, bucket: bucket.to_string(), _root: root, task })
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Options a client needs to reach this server.
    pub fn options(&self) -> S3Options {
        S3Options {
            endpoint: Some(self.endpoint()),
            region: Some("us-east-1".into()),
            access_key_id: Some(ACCESS_KEY.into()),
            secret_access_key: Some(SECRET_KEY.into()),
        }
    }

    /// `s3://bucket/prefix`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    /// Environment variables that point a `flower` process at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("FLOWER_S3_ENDPOINT", self.endpoint()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
        ]
    }
}

impl Drop for S3TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
