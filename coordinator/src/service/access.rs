//! The `Access` gRPC API: namespaces, API keys and the audit log, an
//! adapter over the application layer's calls ([`crate::app::keys`]).

use std::time::Duration;

use flower_proto::v1 as pb;
use flower_proto::v1::access_server::Access;
use tonic::{Request, Response, Status};

use super::api::{changer, reader};
use crate::app::App;
use crate::app::audit::Verb;
use crate::app::keys::{CreatedKey, KeyRequest};
use crate::app::limits::NamespaceStatus;

pub struct AccessApi {
    app: App,
}

impl AccessApi {
    pub fn new(app: App) -> Self {
        Self { app }
    }

    async fn read<T>(&self, req: &Request<T>) -> Result<App, Status> {
        reader(&self.app, req).await
    }

    async fn change<T>(&self, req: &Request<T>, verb: Verb, target: &str) -> Result<App, Status> {
        changer(&self.app, req, verb, target).await
    }
}

fn created(k: CreatedKey) -> pb::CreatedKey {
    pb::CreatedKey { key: Some((&k.key).into()), secret: k.secret }
}

fn namespace(n: &flower_model::access::Namespace) -> pb::Namespace {
    n.into()
}

/// A namespace with its spend, as `GetNamespace` answers (and the CLI
/// prints it from the embedded store).
impl From<&NamespaceStatus> for pb::Namespace {
    fn from(s: &NamespaceStatus) -> Self {
        let mut n = namespace(&s.namespace);
        n.spend = Some(pb::NamespaceSpend {
            tokens_today: s.spent.tokens_today,
            cost_today_usd: s.spent.cost_today,
            cost_this_month_usd: s.spent.cost_this_month,
            live_jobs: s.live_jobs,
            waiting_for_budget: s.waiting_for_budget,
            queued: s.queued,
            live_tasks: s.tasks.live,
            held_tasks: s.tasks.held,
        });
        n
    }
}

#[tonic::async_trait]
impl Access for AccessApi {
    async fn who_am_i(&self, req: Request<pb::WhoAmIRequest>) -> Result<Response<pb::Principal>, Status> {
        let p = self.read(&req).await?.whoami()?;
        Ok(Response::new(pb::Principal { namespace: p.namespace, role: p.role.as_str().into(), subject: p.subject }))
    }

    async fn create_namespace(
        &self,
        req: Request<pb::CreateNamespaceRequest>,
    ) -> Result<Response<pb::Namespace>, Status> {
        let app = self.change(&req, Verb::CreateNamespace, &req.get_ref().name).await?;
        Ok(Response::new(namespace(&app.create_namespace(&req.get_ref().name).await?)))
    }

    async fn list_namespaces(
        &self,
        req: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::ListNamespacesResponse>, Status> {
        let all = self.read(&req).await?.namespaces().await?;
        Ok(Response::new(pb::ListNamespacesResponse { namespaces: all.iter().map(namespace).collect() }))
    }

    async fn create_key(&self, req: Request<pb::CreateKeyRequest>) -> Result<Response<pb::CreatedKey>, Status> {
        let app = self.change(&req, Verb::CreateKey, &req.get_ref().namespace).await?;
        let r = req.into_inner();
        let expires_in = (r.expires_in_s > 0).then(|| Duration::from_secs(r.expires_in_s));
        let made =
            app.create_key(KeyRequest { namespace: r.namespace, role: r.role, name: r.name, expires_in }).await?;
        Ok(Response::new(created(made)))
    }

    async fn list_keys(&self, req: Request<pb::ListKeysRequest>) -> Result<Response<pb::ListKeysResponse>, Status> {
        let keys = self.read(&req).await?.keys(&req.get_ref().namespace).await?;
        Ok(Response::new(pb::ListKeysResponse { keys: keys.iter().map(Into::into).collect() }))
    }

    async fn rotate_key(&self, req: Request<pb::KeyRequest>) -> Result<Response<pb::CreatedKey>, Status> {
        let app = self.change(&req, Verb::RotateKey, &req.get_ref().key_id).await?;
        Ok(Response::new(created(app.rotate_key(&req.get_ref().key_id).await?)))
    }

    async fn revoke_key(&self, req: Request<pb::KeyRequest>) -> Result<Response<pb::ApiKey>, Status> {
        let app = self.change(&req, Verb::RevokeKey, &req.get_ref().key_id).await?;
        Ok(Response::new((&app.revoke_key(&req.get_ref().key_id).await?).into()))
    }

    async fn list_audit(&self, req: Request<pb::ListAuditRequest>) -> Result<Response<pb::ListAuditResponse>, Status> {
        let app = self.read(&req).await?;
        let r = req.into_inner();
        let records = app.audit_log(&r.namespace, r.after_seq, r.limit).await?;
        Ok(Response::new(pb::ListAuditResponse { records: records.iter().map(Into::into).collect() }))
    }

    async fn get_namespace(&self, req: Request<pb::GetNamespaceRequest>) -> Result<Response<pb::Namespace>, Status> {
        let status = self.read(&req).await?.namespace_status(&req.get_ref().name).await?;
        Ok(Response::new((&status).into()))
    }

    async fn set_limits(&self, req: Request<pb::SetLimitsRequest>) -> Result<Response<pb::Namespace>, Status> {
        let app = self.change(&req, Verb::SetLimits, &req.get_ref().namespace).await?;
        let r = req.into_inner();
        let limits = r.limits.map(Into::into).unwrap_or_default();
        Ok(Response::new(namespace(&app.set_limits(&r.namespace, limits).await?)))
    }
}
