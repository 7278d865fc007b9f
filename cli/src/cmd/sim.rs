//! `flower sim`: the simulator as a server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use flower_sim::Scenario;

#[derive(Args)]
pub struct SimArgs {
    /// Address to listen on (loopback by default)
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,
    /// Scenario file to play (see the README's scenario format); without one,
    /// every request gets the default reply
    #[arg(long)]
    pub scenario: Option<PathBuf>,
}

pub async fn serve(args: SimArgs) -> anyhow::Result<ExitCode> {
    let scenario = match &args.scenario {
        Some(p) => Scenario::load(p)?,
        None => Scenario::default(),
    };
    let roles = scenario.roles.len();
    let handle =
        flower_sim::start(scenario, args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    println!("flower sim listening on {} ({roles} scripted roles); POST /v1/messages", handle.base_url());
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    handle.shutdown().await;
    Ok(ExitCode::SUCCESS)
}
