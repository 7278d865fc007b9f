//! `flower ui`: the web console over the embedded store (the jobs `flower
//! run` ran or runs in this home).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use flower_console::Console;
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub struct UiArgs {
    /// Address to serve on (port 0: any free port; the address is printed)
    #[arg(long, default_value = "127.0.0.1:7780")]
    pub listen: SocketAddr,
    /// Ask for a credential in the browser: this token (an admin's), or an API key made with
    /// `flower auth create` (without a token, whoever reaches the address sees the jobs)
    #[arg(long, env = "FLOWER_UI_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub async fn ui(home: PathBuf, args: UiArgs) -> anyhow::Result<ExitCode> {
    let runtime =
        flower_runtime::EmbeddedRuntime::open(&home).with_context(|| format!("opening {}", home.display()))?;
    // Jobs are run by `flower run` in other processes: this one reads them and acts on them.
    let auth = flower_coordinator::app::auth::AuthConfig { token: args.token.filter(|t| !t.is_empty()), jwt: None };
    let app = flower_runtime::jobs::reader_app(runtime.store(), runtime.objects()).with_auth(auth);
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("--listen {}", args.listen))?;
    println!("console on http://{}/ (the jobs of {}; Ctrl-C stops)", listener.local_addr()?, home.display());
    let shutdown = CancellationToken::new();
    Console::new(app, None).serve(listener, shutdown.clone());
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    shutdown.cancel();
    Ok(ExitCode::SUCCESS)
}
