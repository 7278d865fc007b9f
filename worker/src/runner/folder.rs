//! An attempt's working directory: opened (a spare one of its job reused,
//! else made, a tmpfs of its own where the worker may mount one), filled
//! (the workspace checked out, the workbench materialised at `.flower/`),
//! given the limits its tools apply, and at the end collected (the final
//! workbench sync, the workspace changeset) and released for reuse.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use flower_agent::ToolOutput;
use flower_agent::hooks::{HookContext, PostToolHook};
use flower_bus::TaskMessage;
use flower_model::{JobId, JobSpec, Task, TaskId, Usage};
use flower_store::localfs::Manifest;
use flower_store::workbench::MOUNT;
use flower_store::workspace::Workspace;
use flower_store::{StoreError, Workbench};

use super::jobs::CachedJob;
use super::spare::empty_for_reuse;
use super::{Failure, Worker};
use crate::isolation::NetworkPolicy;
use crate::sandbox::Sandbox;
use crate::tools::{ToolLimits, may_write};

/// An attempt's working directory and what its tools and final sync need.
pub(super) struct TaskDir {
    pub(super) path: PathBuf,
    pub(super) sandbox: Sandbox,
    pub(super) limits: ToolLimits,
    /// What fills the directory (see [`Filler`]).
    pub(super) filler: Filler,
}

/// What fills an opened directory: the workspace checked out, the workbench
/// materialised at `.flower/`, and the manifests they are later compared to.
#[derive(Clone)]
pub(super) struct Filler {
    path: PathBuf,
    workspace: Workspace,
    /// The workspace as checked out, to diff the attempt's changes against.
    base: Arc<std::sync::Mutex<Manifest>>,
    pub(super) workbench: Workbench,
    pub(super) sync: Arc<WorkbenchSync>,
    /// Whether filling began: a directory never filled was not written.
    filled: Arc<AtomicBool>,
    /// What tools may add to a bounded (tmpfs) folder once it is filled.
    room: Option<u64>,
}

impl Filler {
    pub(super) async fn fill(&self) -> Result<(), StoreError> {
        self.filled.store(true, Ordering::Release);
        let base = self.workspace.load().await?;
        self.workspace.checkout(&base, &self.path).await?;
        *self.base.lock().unwrap_or_else(|p| p.into_inner()) = base;
        let wb_base = self.workbench.materialize(&self.path.join(MOUNT)).await?;
        *self.sync.base.lock().await = wb_base;
        if let Some(room) = self.room {
            let path = self.path.clone();
            tokio::task::spawn_blocking(move || crate::taskdir::resize(&path, room))
                .await
                .map_err(StoreError::backend_from)?
                .map_err(|e| StoreError::backend_in(format_args!("bounding {}", self.path.display()), e))?;
        }
        Ok(())
    }

    fn base(&self) -> Manifest {
        self.base.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// An attempt's job and working directory, or why they could not be had.
pub(super) type Opened = Result<(CachedJob, TaskDir), (Failure, Usage)>;

/// When an opened directory is filled (its workspace and workbench).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fill {
    /// Before it is handed over.
    Now,
    /// By the caller, while the claim commits ([`Filler::fill`]).
    Later,
}

impl Worker {
    /// The attempt's job (cached) and its working directory, made ready
    /// before the claim is known (see [`Worker::handle`]), filled as `fill` says.
    pub(super) async fn open_attempt(&self, msg: &TaskMessage, attempt: u32, fill: Fill) -> Opened {
        let cached = self.job(msg.job_id).await?;
        let (job, spec) = (msg.job_id, &cached.1);
        let dir = match fill {
            Fill::Now => self.open_dir(job, spec, msg.task_id, attempt).await,
            Fill::Later => self.open_empty(job, spec, msg.task_id, attempt).await,
        };
        Ok((cached, dir.map_err(|f| (f, Usage::default()))?))
    }

    /// A directory made ready for an attempt the claim refused: emptied for
    /// the job's next attempt, as after a run.
    pub(super) async fn discard(&self, job: JobId, opened: Option<Opened>) {
        if let Some(Ok((_, dir))) = opened {
            self.release_dir(job, &dir).await;
        }
    }

    /// A working directory for the attempt (the workspace checked out, the
    /// workbench mounted at `.flower/`) and the limits its tools apply: a
    /// spare one of the job's ([`super::spare`]), or a new one.
    async fn open_dir(&self, job: JobId, spec: &JobSpec, task: TaskId, attempt: u32) -> Result<TaskDir, Failure> {
        let dir = self.open_empty(job, spec, task, attempt).await?;
        dir.filler.fill().await.map_err(|e| Failure::store("preparing the working directory", e))?;
        Ok(dir)
    }

    /// [`Worker::open_dir`] before its filling: the directory exists and is
    /// opened, its workspace and workbench not there yet ([`Filler::fill`]).
    async fn open_empty(&self, job: JobId, spec: &JobSpec, task: TaskId, attempt: u32) -> Result<TaskDir, Failure> {
        let reused = if self.opts.keep_workdirs { None } else { self.spare.take(job) };
        let path = match &reused {
            Some(path) => path.clone(),
            None => self.opts.work_root.join(job.to_string()).join(format!("{task}-{attempt}")),
        };
        if reused.is_none() {
            self.make_dir(&path).await.map_err(|e| Failure::store("preparing the working directory", e))?;
        }
        let sandbox =
            Sandbox::open(&path).map_err(|e| Failure::fatal(format!("opening the working directory: {e}")))?;
        let limits = self.tool_limits(spec, &path, &format!("{task}-{attempt}"))?;
        let workbench = Workbench::new(self.objects.clone(), job);
        let sync = Arc::new(WorkbenchSync {
            workbench: workbench.clone(),
            mount: path.join(MOUNT),
            base: tokio::sync::Mutex::new(Manifest::new()),
        });
        let filler = Filler {
            path: path.clone(),
            workspace: Workspace::new(self.objects.clone(), job),
            base: Default::default(),
            workbench,
            sync,
            filled: Default::default(),
            room: self.opts.tools.bounded_dirs().then(|| spec.runtime.workspace_limit.as_u64()),
        };
        Ok(TaskDir { path, sandbox, limits, filler })
    }

    /// What the tools of the attempt `name` in `dir` apply: the job's
    /// limits, this worker's isolation, the task's control group, and its
    /// egress proxy when the job was granted destinations.
    fn tool_limits(&self, spec: &JobSpec, dir: &Path, name: &str) -> Result<ToolLimits, Failure> {
        let tools = &self.opts.tools;
        let group = tools.launcher().and_then(|l| l.task_group(name));
        let egress = match (tools.launcher(), spec.network.egress.is_empty()) {
            (Some(l), false) if l.network == NetworkPolicy::None => {
                if !l.egress_possible() {
                    return Err(Failure::fatal(
                        "network.egress: this worker cannot give tools a network of their own (no network namespace), so it grants no egress",
                    ));
                }
                Some(Arc::new(self.egress_proxy(spec, dir)?))
            }
            _ => None,
        };
        Ok(ToolLimits {
            bash_timeout: spec.runtime.bash_timeout,
            bash_output_limit: spec.runtime.bash_output_limit.as_u64() as usize,
            isolation: tools.isolation().clone(),
            group,
            max_file_size: Some(spec.runtime.workspace_limit.as_u64()),
            egress,
        })
    }

    /// The task's egress proxy for the destinations its job was granted,
    /// each checked again against this worker's policy.
    fn egress_proxy(&self, spec: &JobSpec, dir: &Path) -> Result<crate::egress::EgressProxy, Failure> {
        let policy = self.opts.tools.policy();
        let mut grants = Vec::new();
        for (i, d) in spec.network.egress.iter().enumerate() {
            let allow = policy.egress_allowed(d).ok_or_else(|| {
                Failure::fatal(format!(
                    "refused by this worker's policy: network.egress[{i}]: `{d}` is not a destination it lets tools reach"
                ))
            })?;
            grants.push(crate::egress::Grant { destination: d.clone(), address: allow.is_address() });
        }
        crate::egress::EgressProxy::start(dir, grants)
            .map_err(|e| Failure::fatal(format!("starting the task's egress proxy: {e}")))
    }

    /// A new directory for an attempt, replacing what an earlier try left.
    async fn make_dir(&self, workdir: &Path) -> Result<(), StoreError> {
        let dir = workdir.to_path_buf();
        let bounded = self.opts.tools.bounded_dirs();
        tokio::task::spawn_blocking(move || {
            crate::taskdir::remove(&dir)?;
            std::fs::create_dir_all(&dir)?;
            if bounded {
                crate::taskdir::mount_at(&dir)?;
            }
            Ok::<_, std::io::Error>(())
        })
        .await
        .map_err(StoreError::backend_from)?
        .map_err(|e| StoreError::backend_in(workdir.display(), e))
    }

    /// Keep what the attempt wrote (see [`Worker::collect`]), then remove its
    /// directory unless directories are kept for debugging.
    pub(super) async fn close_dir(&self, task: &Task, attempt: u32, dir: &TaskDir) -> Result<(), StoreError> {
        let kept = self.collect(task, attempt, dir).await;
        self.release_dir(task.job_id, dir).await;
        kept
    }

    /// Empty a finished attempt's directory for the job's next attempt, or
    /// remove it when it cannot be reused (unless directories are kept). A
    /// directory never filled is as it was taken: reused as it is.
    pub(super) async fn release_dir(&self, job: JobId, dir: &TaskDir) {
        if self.opts.keep_workdirs {
            return;
        }
        if !dir.filler.filled.load(Ordering::Acquire) {
            return self.spare.put(job, dir.path.clone()).await;
        }
        let path = dir.path.clone();
        let emptied = tokio::task::spawn_blocking(move || empty_for_reuse(&path).map(|()| path)).await;
        match emptied {
            Ok(Ok(path)) => self.spare.put(job, path).await,
            _ => remove_dir(dir.path.clone()).await,
        }
    }

    /// Final workbench sync, and the workspace changeset for the job's owner.
    async fn collect(&self, task: &Task, attempt: u32, dir: &TaskDir) -> Result<(), StoreError> {
        let f = &dir.filler;
        f.sync.sync().await?;
        let cs = f.workspace.diff(&f.base(), &dir.path, dir.limits.max_file_size.unwrap_or(u64::MAX)).await?;
        if !cs.is_empty() {
            f.workspace.put_changeset(task.id, attempt, &cs).await?;
            self.changesets.lock().unwrap_or_else(|p| p.into_inner()).insert((task.id, attempt));
        }
        Ok(())
    }
}

/// Remove a task folder (its tmpfs first), logging what could not be.
pub(super) async fn remove_dir(path: PathBuf) {
    let at = path.clone();
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || crate::taskdir::remove(&at)).await {
        tracing::warn!(dir = %path.display(), error = %e, "a task folder could not be removed");
    }
}

/// Post-tool hook: after any call that may write, push workbench changes to
/// object storage so the coordinator and other tasks see them at once.
pub(super) struct WorkbenchSync {
    workbench: Workbench,
    mount: PathBuf,
    base: tokio::sync::Mutex<Manifest>,
}

impl WorkbenchSync {
    async fn sync(&self) -> Result<(), StoreError> {
        let mut base = self.base.lock().await;
        self.workbench.sync(&self.mount, &mut base).await.map(|_| ())
    }
}

#[async_trait]
impl PostToolHook for WorkbenchSync {
    async fn after(&self, tool: &str, input: &serde_json::Value, _output: &mut ToolOutput, _ctx: &HookContext) {
        if !may_write(tool) {
            return;
        }
        if let Err(e) = self.sync().await {
            tracing::warn!(error = %e, "workbench sync failed; retried after the next write");
            return;
        }
        // A Write/Edit that landed in the workbench refreshes its index.
        let path = input.get("file_path").and_then(|p| p.as_str()).unwrap_or_default();
        if matches!(tool, "Write" | "Edit") && path.trim_start_matches("./").starts_with(".flower/") {
            match self.workbench.refresh_index().await {
                Ok((index, true)) => {
                    let _ = tokio::fs::write(self.mount.join(flower_store::workbench::INDEX), index).await;
                    let _ = self.sync().await;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "workbench index not refreshed"),
            }
        }
    }
}
