//! `flower migrate`: apply the Postgres schema and exit — what a deployment's
//! migration job runs before coordinators and workers started with
//! `--schema require-current` accept the database.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use flower_store::{PostgresStore, SchemaPolicy};

#[derive(Args)]
pub struct MigrateArgs {
    /// Postgres URL (postgres://user@host:port/db)
    #[arg(long, env = "FLOWER_DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Only report the schema version; exit 1 if migrations are pending
    #[arg(long)]
    pub check: bool,
    /// Print the versions as JSON
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let needed = flower_store::migrations::latest(flower_store::migrations::POSTGRES);
    let store = PostgresStore::connect_with(&args.database_url, 1, SchemaPolicy::Leave)
        .await
        .context("--database-url / FLOWER_DATABASE_URL")?;
    let (before, after) = if args.check {
        let v = store.schema_version().await?;
        (v, v)
    } else {
        store.migrate_now().await.context("applying the migrations")?
    };
    if args.json {
        println!("{}", serde_json::json!({"before": before, "after": after, "latest": needed}));
    } else if after < needed {
        println!("schema at version {after}; this release needs {needed}: run `flower migrate`");
    } else if before == after {
        println!("schema at version {after} (up to date)");
    } else {
        println!("schema migrated from version {before} to {after}");
    }
    Ok(if after < needed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
