//! Throwaway databases for one test or benchmark run.

use tokio_postgres::NoTls;
use uuid::Uuid;

use super::backend;
use crate::{Result, StoreError};

/// A throwaway database for one test or benchmark run, dropped afterwards.
pub struct ScratchDatabase {
    admin_url: String,
    pub name: String,
    pub url: String,
}

impl ScratchDatabase {
    /// Create `flower_scratch_<random>` through `admin_url` (a database URL with
    /// CREATE DATABASE rights). Fails loudly when Postgres is not there.
    pub async fn create(admin_url: &str) -> Result<Self> {
        let name = format!("flower_scratch_{}", Uuid::new_v4().simple());
        let (client, conn) = tokio_postgres::connect(admin_url, NoTls)
            .await
            .map_err(|e| StoreError::backend(format!("cannot reach Postgres at {admin_url}: {e}")))?;
        let driver = tokio::spawn(conn);
        client.batch_execute(&format!("CREATE DATABASE {name}")).await?;
        drop(client);
        let _ = driver.await;
        let mut config: tokio_postgres::Config = admin_url.parse().map_err(backend)?;
        config.dbname(&name);
        let url = config_url(&config, &name);
        Ok(Self { admin_url: admin_url.to_string(), name, url })
    }

    /// Drop the database now (also done, best effort, on drop).
    pub async fn drop_now(&self) -> Result<()> {
        let (client, conn) = tokio_postgres::connect(&self.admin_url, NoTls).await?;
        let driver = tokio::spawn(conn);
        client.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)).await?;
        drop(client);
        let _ = driver.await;
        Ok(())
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let (admin, name) = (self.admin_url.clone(), self.name.clone());
        // Dropping needs async I/O; do it on a thread of its own so Drop works
        // inside and outside a runtime alike.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&admin, NoTls).await.ok()?;
                let driver = tokio::spawn(conn);
                let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
                drop(client);
                let _ = driver.await;
                Some(())
            })
        });
        let _ = done.join();
    }
}

/// A URL for `config` pointing at database `name` (host, port and user kept).
fn config_url(config: &tokio_postgres::Config, name: &str) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    format!("postgres://{user}@{host}:{port}/{name}")
}
