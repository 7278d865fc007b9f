//! `flower auth` and `flower audit`: namespaces, API keys and the audit log
//! of a service (`--server`, over the `Access` API), or of the embedded
//! store (as its local admin).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use flower_coordinator::app::App;
use flower_coordinator::app::keys::KeyRequest;
use flower_model::access::{ApiKey, AuditRecord, Namespace};
use flower_proto::v1 as pb;

use super::client::{ServerArgs, app_error};

#[derive(Subcommand)]
pub enum AuthCommand {
    /// Who the credential is: its namespace, role and subject
    Whoami(Common),
    /// Make an API key, shown once (operator of its namespace, or admin)
    Create(CreateArgs),
    /// List keys (never their secrets)
    List(ListArgs),
    /// A new key in place of one (same namespace, role, name and expiry); the old one is revoked at once
    Rotate(KeyArgs),
    /// Revoke a key at once
    Revoke(KeyArgs),
    /// Namespaces: create (admin), list, show with their spend, set limits (admin)
    #[command(subcommand)]
    Namespace(NamespaceCommand),
}

#[derive(Subcommand)]
pub enum NamespaceCommand {
    /// Create a namespace (admin)
    Create(NamespaceArgs),
    /// The namespaces this credential sees
    List(Common),
    /// A namespace's limits, and what its jobs spent today and this month (UTC)
    Show(ShowArgs),
    /// Set a namespace's limits (admin): the flags given change, the others stay
    Limits(LimitsArgs),
}

#[derive(Args)]
pub struct ShowArgs {
    /// The namespace (default: the caller's)
    #[arg(default_value = "")]
    pub name: String,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct LimitsArgs {
    pub name: String,
    /// Jobs started and not ended at once (more wait, queued)
    #[arg(long)]
    pub max_jobs: Option<u32>,
    /// Tasks queued for a worker or running at once (more wait, held: no worker slot taken)
    #[arg(long)]
    pub max_tasks: Option<u32>,
    /// US dollars per UTC day, priced as a job's budget is
    #[arg(long)]
    pub cost_per_day: Option<f64>,
    /// US dollars per UTC month
    #[arg(long)]
    pub cost_per_month: Option<f64>,
    /// Tokens per UTC day (input, cache reads and writes, output)
    #[arg(long)]
    pub tokens_per_day: Option<u64>,
    /// How long a job waits for a raise before it ends failed (default 15m; 0s: at once)
    #[arg(long, value_parser = humantime::parse_duration)]
    pub wait: Option<std::time::Duration>,
    /// Start from no limit at all (then apply the flags given)
    #[arg(long)]
    pub clear: bool,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct Common {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Args)]
pub struct CreateArgs {
    /// viewer, submitter, operator or admin (at most the caller's own)
    #[arg(long)]
    pub role: String,
    /// The key's namespace (default: the caller's)
    #[arg(long, default_value = "")]
    pub namespace: String,
    /// What the key is for
    #[arg(long, default_value = "")]
    pub name: String,
    /// Lifetime, e.g. `90d`, `12h` (default: never expires)
    #[arg(long, value_parser = humantime::parse_duration)]
    pub expires_in: Option<std::time::Duration>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct ListArgs {
    /// The namespace (default: the caller's; an admin's: every namespace)
    #[arg(long, default_value = "")]
    pub namespace: String,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct KeyArgs {
    /// The key's id (the 16 hex digits after `flk_`)
    pub key_id: String,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct NamespaceArgs {
    pub name: String,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args)]
pub struct AuditArgs {
    /// The namespace (default: the caller's; an admin's: every namespace)
    #[arg(long, default_value = "")]
    pub namespace: String,
    /// Records after this sequence number
    #[arg(long, default_value_t = 0)]
    pub after: i64,
    /// How many records
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    #[command(flatten)]
    pub common: Common,
}

/// The embedded store's application, as its local admin.
fn local(home: &std::path::Path) -> anyhow::Result<App> {
    let store = super::open_store(home)?;
    let objects = std::sync::Arc::new(object_store::local::LocalFileSystem::new_with_prefix(home)?);
    Ok(flower_runtime::jobs::reader_app(store, objects))
}

fn key_from(k: pb::ApiKey) -> anyhow::Result<ApiKey> {
    ApiKey::try_from(k).map_err(anyhow::Error::msg)
}

fn when(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".into(), super::format_ms)
}

fn print_keys(keys: &[ApiKey], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(keys)?);
        return Ok(());
    }
    println!(
        "{:<16}  {:<16}  {:<9}  {:<20}  {:<20}  {:<20}  NAME",
        "ID", "NAMESPACE", "ROLE", "EXPIRES", "LAST USED", "REVOKED"
    );
    for k in keys {
        println!(
            "{:<16}  {:<16}  {:<9}  {:<20}  {:<20}  {:<20}  {}",
            k.id,
            k.namespace,
            k.role,
            when(k.expires_at),
            when(k.last_used_at),
            when(k.revoked_at),
            k.name
        );
    }
    Ok(())
}

fn print_created(key: &ApiKey, secret: &str, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::json!({"key": key, "secret": secret}));
    } else {
        println!("{secret}");
        eprintln!(
            "key {} ({} of namespace {}): shown this once; store it now (flower keeps only its digest)",
            key.id, key.role, key.namespace
        );
    }
    Ok(())
}

pub async fn run(home: std::path::PathBuf, command: AuthCommand) -> anyhow::Result<ExitCode> {
    match command {
        AuthCommand::Whoami(c) => whoami(&home, c).await,
        AuthCommand::Create(a) => create(&home, a).await,
        AuthCommand::List(a) => list(&home, a).await,
        AuthCommand::Rotate(a) => rotate(&home, a).await,
        AuthCommand::Revoke(a) => revoke(&home, a).await,
        AuthCommand::Namespace(NamespaceCommand::Create(a)) => create_namespace(&home, a).await,
        AuthCommand::Namespace(NamespaceCommand::List(c)) => namespaces(&home, c).await,
        AuthCommand::Namespace(NamespaceCommand::Show(a)) => show_namespace(&home, a).await,
        AuthCommand::Namespace(NamespaceCommand::Limits(a)) => set_limits(&home, a).await,
    }?;
    Ok(ExitCode::SUCCESS)
}

async fn whoami(home: &std::path::Path, c: Common) -> anyhow::Result<()> {
    let (namespace, role, subject) = if c.server.configured() {
        let p = c.server.connect_access().await?.who_am_i(pb::WhoAmIRequest {}).await.map_err(app_error)?.into_inner();
        (p.namespace, p.role, p.subject)
    } else {
        let p = local(home)?.whoami()?;
        (p.namespace, p.role.as_str().to_string(), p.subject)
    };
    if c.json {
        println!("{}", serde_json::json!({"namespace": namespace, "role": role, "subject": subject}));
    } else {
        println!("{subject}: {role} of namespace {namespace}");
    }
    Ok(())
}

async fn create(home: &std::path::Path, a: CreateArgs) -> anyhow::Result<()> {
    let (key, secret) = if a.common.server.configured() {
        let r = pb::CreateKeyRequest {
            namespace: a.namespace,
            role: a.role,
            name: a.name,
            expires_in_s: a.expires_in.map_or(0, |d| d.as_secs().max(1)),
        };
        let made = a.common.server.connect_access().await?.create_key(r).await.map_err(app_error)?.into_inner();
        (key_from(made.key.unwrap_or_default())?, made.secret)
    } else {
        let r = KeyRequest { namespace: a.namespace, role: a.role, name: a.name, expires_in: a.expires_in };
        let made = local(home)?.create_key(r).await?;
        (made.key, made.secret)
    };
    print_created(&key, &secret, a.common.json)
}

async fn list(home: &std::path::Path, a: ListArgs) -> anyhow::Result<()> {
    let keys = if a.common.server.configured() {
        let r = pb::ListKeysRequest { namespace: a.namespace };
        let listed = a.common.server.connect_access().await?.list_keys(r).await.map_err(app_error)?.into_inner();
        listed.keys.into_iter().map(key_from).collect::<anyhow::Result<Vec<_>>>()?
    } else {
        local(home)?.keys(&a.namespace).await?
    };
    print_keys(&keys, a.common.json)
}

async fn rotate(home: &std::path::Path, a: KeyArgs) -> anyhow::Result<()> {
    let (key, secret) = if a.common.server.configured() {
        let r = pb::KeyRequest { key_id: a.key_id };
        let made = a.common.server.connect_access().await?.rotate_key(r).await.map_err(app_error)?.into_inner();
        (key_from(made.key.unwrap_or_default())?, made.secret)
    } else {
        let made = local(home)?.rotate_key(&a.key_id).await?;
        (made.key, made.secret)
    };
    print_created(&key, &secret, a.common.json)
}

async fn revoke(home: &std::path::Path, a: KeyArgs) -> anyhow::Result<()> {
    let key = if a.common.server.configured() {
        let r = pb::KeyRequest { key_id: a.key_id };
        key_from(a.common.server.connect_access().await?.revoke_key(r).await.map_err(app_error)?.into_inner())?
    } else {
        local(home)?.revoke_key(&a.key_id).await?
    };
    print_keys(&[key], a.common.json)
}

fn namespace_from(n: pb::Namespace) -> Namespace {
    n.into()
}

/// A namespace with its spend, as `show` prints it.
fn status_of(n: pb::Namespace) -> (Namespace, pb::NamespaceSpend) {
    let spend = n.spend.unwrap_or_default();
    (n.into(), spend)
}

async fn status(
    home: &std::path::Path,
    server: &ServerArgs,
    name: &str,
) -> anyhow::Result<(Namespace, pb::NamespaceSpend)> {
    if server.configured() {
        let r = pb::GetNamespaceRequest { name: name.to_string() };
        return Ok(status_of(server.connect_access().await?.get_namespace(r).await.map_err(app_error)?.into_inner()));
    }
    Ok(status_of((&local(home)?.namespace_status(name).await?).into()))
}

async fn show_namespace(home: &std::path::Path, a: ShowArgs) -> anyhow::Result<()> {
    let (n, spend) = status(home, &a.common.server, &a.name).await?;
    print_status(&n, &spend, a.common.json)
}

fn print_status(n: &Namespace, spend: &pb::NamespaceSpend, json: bool) -> anyhow::Result<()> {
    if json {
        let out = serde_json::json!({
            "name": n.name,
            "created_at": n.created_at,
            "limits": n.limits,
            "spend": {
                "tokens_today": spend.tokens_today,
                "cost_today_usd": spend.cost_today_usd,
                "cost_this_month_usd": spend.cost_this_month_usd,
                "live_jobs": spend.live_jobs,
                "waiting_for_budget": spend.waiting_for_budget,
                "queued": spend.queued,
                "live_tasks": spend.live_tasks,
                "held_tasks": spend.held_tasks,
            },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let l = &n.limits;
    let of = |v: Option<String>| v.unwrap_or_else(|| "no limit".into());
    println!("namespace {}  (created {})", n.name, super::format_ms(n.created_at));
    println!(
        "  jobs running      {}  (limit: {}; {} queued)",
        spend.live_jobs,
        of(l.max_jobs.map(|v| v.to_string())),
        spend.queued
    );
    println!(
        "  tasks running     {}  (limit: {}; {} held)",
        spend.live_tasks,
        of(l.max_tasks.map(|v| v.to_string())),
        spend.held_tasks
    );
    println!("  tokens today      {}  (limit: {})", spend.tokens_today, of(l.tokens_per_day.map(|v| v.to_string())));
    println!(
        "  cost today        ${:.4}  (limit: {})",
        spend.cost_today_usd,
        of(l.cost_per_day_usd.map(|v| format!("${v:.4}")))
    );
    println!(
        "  cost this month   ${:.4}  (limit: {})",
        spend.cost_this_month_usd,
        of(l.cost_per_month_usd.map(|v| format!("${v:.4}")))
    );
    println!(
        "  waiting for budget {}  (a raise is waited for {})",
        spend.waiting_for_budget,
        humantime::format_duration(l.raise_wait())
    );
    Ok(())
}

async fn set_limits(home: &std::path::Path, a: LimitsArgs) -> anyhow::Result<()> {
    let mut limits = if a.clear { Default::default() } else { status(home, &a.common.server, &a.name).await?.0.limits };
    limits.max_jobs = a.max_jobs.or(limits.max_jobs);
    limits.max_tasks = a.max_tasks.or(limits.max_tasks);
    limits.cost_per_day_usd = a.cost_per_day.or(limits.cost_per_day_usd);
    limits.cost_per_month_usd = a.cost_per_month.or(limits.cost_per_month_usd);
    limits.tokens_per_day = a.tokens_per_day.or(limits.tokens_per_day);
    limits.wait = a.wait.or(limits.wait);
    if a.common.server.configured() {
        let r = pb::SetLimitsRequest { namespace: a.name.clone(), limits: Some((&limits).into()) };
        a.common.server.connect_access().await?.set_limits(r).await.map_err(app_error)?;
    } else {
        local(home)?.set_limits(&a.name, limits).await?;
    }
    let (n, spend) = status(home, &a.common.server, &a.name).await?;
    print_status(&n, &spend, a.common.json)
}

async fn create_namespace(home: &std::path::Path, a: NamespaceArgs) -> anyhow::Result<()> {
    let made = if a.common.server.configured() {
        let r = pb::CreateNamespaceRequest { name: a.name };
        namespace_from(
            a.common.server.connect_access().await?.create_namespace(r).await.map_err(app_error)?.into_inner(),
        )
    } else {
        local(home)?.create_namespace(&a.name).await?
    };
    print_namespaces(&[made], a.common.json)
}

async fn namespaces(home: &std::path::Path, c: Common) -> anyhow::Result<()> {
    let all = if c.server.configured() {
        let r = pb::ListNamespacesRequest {};
        let listed = c.server.connect_access().await?.list_namespaces(r).await.map_err(app_error)?.into_inner();
        listed.namespaces.into_iter().map(namespace_from).collect()
    } else {
        local(home)?.namespaces().await?
    };
    print_namespaces(&all, c.json)
}

fn print_namespaces(all: &[Namespace], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(all)?);
    } else {
        for n in all {
            println!("{}  (created {})", n.name, super::format_ms(n.created_at));
        }
    }
    Ok(())
}

/// `flower audit`: the audit log, oldest first.
pub async fn audit(home: std::path::PathBuf, a: AuditArgs) -> anyhow::Result<ExitCode> {
    let records: Vec<AuditRecord> = if a.common.server.configured() {
        let r = pb::ListAuditRequest { namespace: a.namespace, after_seq: a.after, limit: a.limit };
        let listed = a.common.server.connect_access().await?.list_audit(r).await.map_err(app_error)?.into_inner();
        listed.records.into_iter().map(AuditRecord::try_from).collect::<Result<_, _>>().map_err(anyhow::Error::msg)?
    } else {
        local(&home)?.audit_log(&a.namespace, a.after, a.limit).await?
    };
    if a.common.json {
        println!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(ExitCode::SUCCESS);
    }
    for r in &records {
        println!(
            "{:>6}  {}  {:<15}  {:<16}  {:<24}  {:<16}  {:<36}  {}{}",
            r.seq,
            super::format_ms(r.at),
            r.outcome.as_str(),
            r.action,
            r.subject,
            r.namespace,
            r.target,
            r.origin,
            if r.detail.is_empty() { String::new() } else { format!("  ({})", r.detail) }
        );
    }
    Ok(ExitCode::SUCCESS)
}
