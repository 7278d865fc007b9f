//! The store's own transactions on a pooled connection ([`PostgresStore::tx`],
//! [`PostgresStore::tx_ending`]: `BEGIN` queued with the first statements, the
//! `COMMIT` sent with the last one or after it, a connection in an unknown
//! state closed rather than pooled), and the statement helpers every module
//! sends through the connection's statement cache.

use deadpool_postgres::ClientWrapper;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::PostgresStore;
use crate::{Result, StoreError};

impl PostgresStore {
    /// Run `f` in one transaction.
    pub(super) async fn tx<T: Send + 'static>(
        &self,
        f: impl for<'a> FnOnce(&'a Tx<'a>) -> futures::future::BoxFuture<'a, Result<T>>,
    ) -> Result<T> {
        self.tx_ending(move |tx| {
            let work = f(tx);
            Box::pin(async move { Ok((work.await?, Ending::Open)) })
        })
        .await
    }

    /// Run `f` in one transaction, which `f` may end itself: its last
    /// statement carrying the `COMMIT` ([`super::events::write_events_ending`]).
    ///
    /// The `BEGIN` costs no round trip of its own: it is sent, and the
    /// statements of `f` queue behind it on the connection; its answer is
    /// read at the end. On an error the transaction is rolled back before
    /// the connection goes back to the pool; a connection whose state is
    /// unknown (the work dropped midway, a failed `BEGIN` or `ROLLBACK`)
    /// is closed instead, which ends its transaction on the server.
    pub(super) async fn tx_ending<T>(
        &self,
        f: impl for<'a> FnOnce(&'a Tx<'a>) -> futures::future::BoxFuture<'a, Result<(T, Ending)>>,
    ) -> Result<T> {
        let mut held = Held(Some(self.pool.get().await?));
        let out = {
            let client = held.client()?;
            let mut begin = std::pin::pin!(client.batch_execute("BEGIN"));
            // The first poll sends it (the answer is read below).
            let sent = futures::poll!(begin.as_mut());
            let worked = f(&Tx(client)).await;
            let begun = match sent {
                std::task::Poll::Ready(begun) => begun,
                std::task::Poll::Pending => begin.await,
            };
            begun?;
            match worked {
                Ok((out, Ending::Sent)) => Ok(out),
                Ok((out, Ending::Open)) => {
                    client.batch_execute("COMMIT").await?;
                    Ok(out)
                }
                Err(e) => {
                    // After a `COMMIT` sent with a failed statement (which
                    // rolled back), this `ROLLBACK` finds no transaction: a
                    // warning, not an error.
                    client.batch_execute("ROLLBACK").await?;
                    Err(e)
                }
            }
        };
        held.release();
        out
    }
}

/// A pooled connection inside one transaction of [`PostgresStore::tx_ending`]:
/// statements go through its statement cache like any other.
pub(super) struct Tx<'a>(&'a ClientWrapper);

impl std::ops::Deref for Tx<'_> {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        self.0
    }
}

/// A pooled connection that goes back to the pool only when released;
/// dropped otherwise, it is taken out of the pool and closed.
struct Held(Option<deadpool_postgres::Client>);

impl Held {
    fn client(&self) -> Result<&ClientWrapper> {
        self.0.as_deref().ok_or_else(|| StoreError::backend("connection already released"))
    }

    /// The connection is outside any transaction: back to the pool.
    fn release(&mut self) {
        self.0.take();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

/// Every statement goes through the connection's statement cache: parsed and
/// planned once per connection, then one round trip per execution.
pub(super) async fn db_query(c: &ClientWrapper, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
    let statement = c.prepare_cached(sql).await?;
    Ok(c.query(&statement, params).await?)
}

pub(super) async fn db_query_opt(c: &ClientWrapper, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>> {
    let statement = c.prepare_cached(sql).await?;
    Ok(c.query_opt(&statement, params).await?)
}

pub(super) async fn db_query_one(c: &ClientWrapper, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row> {
    let statement = c.prepare_cached(sql).await?;
    Ok(c.query_one(&statement, params).await?)
}

pub(super) async fn db_execute(c: &ClientWrapper, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
    let statement = c.prepare_cached(sql).await?;
    Ok(c.execute(&statement, params).await?)
}

/// Prepare `statements` on the connection (those not prepared yet, in one
/// round trip; none when all are), so that what is sent after goes out in
/// the order it is sent.
pub(super) async fn prepare_all(c: &ClientWrapper, statements: &[&str]) -> Result<()> {
    futures::future::try_join_all(statements.iter().map(|sql| c.prepare_cached(sql))).await?;
    Ok(())
}

/// How a transaction's work left it: its `COMMIT` already sent (with its
/// last statement), or still to be sent.
pub(super) enum Ending {
    Sent,
    Open,
}

/// The `COMMIT` sent with a transaction's last statement. After an error
/// in the transaction it rolls it back, as a `ROLLBACK` would.
pub(super) const COMMIT_SENT: &str = "COMMIT";
