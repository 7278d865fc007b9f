//! Namespaces, API keys and the audit log as calls of the application
//! (docs/design.md, section 17): who may make or revoke a key, and read
//! what was done.

use std::time::Duration;

use flower_model::ErrorKind;
use flower_model::access::{ApiKey, AuditRecord, Namespace, Role, check_namespace};
use flower_store::StoreError;

use super::access::{self, Caller, Owner, Principal};
use super::audit::Verb;
use super::views::page;
use super::{App, AppError, Result};

/// Longest name a key may be given.
pub const MAX_KEY_NAME: usize = 200;

/// A key as made: its record and the key itself, shown this once.
#[derive(Clone, Debug)]
pub struct CreatedKey {
    pub key: ApiKey,
    pub secret: String,
}

/// A key to make.
#[derive(Clone, Debug, Default)]
pub struct KeyRequest {
    /// Empty: the caller's namespace.
    pub namespace: String,
    pub role: String,
    pub name: String,
    /// None: it never expires.
    pub expires_in: Option<Duration>,
}

fn key_not_found(id: &str) -> AppError {
    AppError::new(ErrorKind::NotFound, format!("key `{id}` not found"))
}

impl App {
    /// Who the caller is.
    pub fn whoami(&self) -> Result<Principal> {
        Ok(self.caller()?.principal)
    }

    /// A new namespace (admin).
    pub async fn create_namespace(&self, name: &str) -> Result<Namespace> {
        let caller = self.caller()?;
        check_namespace(name).map_err(|m| AppError::invalid("name", m))?;
        self.authorize_in(&caller, Verb::CreateNamespace, name, name).await?;
        let store = self.b.store.clone();
        self.audited(&caller, Verb::CreateNamespace, name, name, async {
            if !store.create_namespace(name).await? {
                return Err(AppError::new(ErrorKind::AlreadyExists, format!("namespace `{name}` exists already")));
            }
            let all = store.namespaces().await?;
            all.into_iter()
                .find(|n| n.name == name)
                .ok_or_else(|| AppError::not_found(format_args!("namespace `{name}`")))
        })
        .await
    }

    /// The namespaces the caller sees.
    pub async fn namespaces(&self) -> Result<Vec<Namespace>> {
        let p = self.caller()?.principal;
        Ok(self.b.store.namespaces().await?.into_iter().filter(|n| p.sees(&n.name)).collect())
    }

    /// A new key; its role may not be above the caller's.
    pub async fn create_key(&self, r: KeyRequest) -> Result<CreatedKey> {
        let caller = self.caller()?;
        let role: Role = r.role.parse().map_err(|m| AppError::invalid("role", m))?;
        super::input::check_text("name", &r.name, MAX_KEY_NAME)?;
        let namespace = match r.namespace.as_str() {
            "" => caller.principal.namespace.clone(),
            named => {
                check_namespace(named).map_err(|m| AppError::invalid("namespace", m))?;
                named.to_string()
            }
        };
        self.authorize_in(&caller, Verb::CreateKey, &namespace, &namespace).await?;
        if role > caller.principal.role {
            let e =
                AppError::permission_denied(format!("role: a `{}` may not make a `{role}` key", caller.principal.role));
            self.record(&caller, Verb::CreateKey, &namespace, &namespace, Err(&e)).await;
            return Err(e);
        }
        let now = flower_model::now_ms();
        let expires_at = r.expires_in.map(|d| now.saturating_add(d.as_millis().min(i64::MAX as u128) as i64));
        let made = self.make_key(&caller, &namespace, role, r.name, expires_at, None);
        self.audited(&caller, Verb::CreateKey, &namespace, "", made).await
    }

    async fn make_key(
        &self,
        caller: &Caller,
        namespace: &str,
        role: Role,
        name: String,
        expires_at: Option<i64>,
        replaces: Option<String>,
    ) -> Result<CreatedKey> {
        let new = access::new_key();
        let key = ApiKey {
            id: new.id,
            namespace: namespace.to_string(),
            role,
            name,
            digest: new.digest,
            created_at: flower_model::now_ms(),
            created_by: caller.principal.subject.clone(),
            expires_at,
            last_used_at: None,
            revoked_at: None,
        };
        match self.b.store.create_key(key.clone(), replaces.clone()).await {
            Ok(()) => {}
            Err(StoreError::NotFound(_)) => {
                return Err(AppError::invalid("namespace", format_args!("no namespace `{namespace}`")));
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(old) = &replaces {
            self.auth.forget(old);
        }
        tracing::info!(key = %key.id, namespace, role = %role, "API key created");
        Ok(CreatedKey { key, secret: new.secret })
    }

    /// The key `id`, if the caller may manage it (another namespace's is
    /// `NOT_FOUND`).
    async fn managed_key(&self, caller: &Caller, verb: Verb, id: &str) -> Result<ApiKey> {
        super::input::check_id("key_id", id)?;
        let key = match self.b.store.get_key(id).await {
            Ok(k) if caller.principal.sees(&k.namespace) => k,
            Ok(_) | Err(StoreError::NotFound(_)) => {
                let e = key_not_found(id);
                self.record(caller, verb, &caller.principal.namespace, id, Err(&e)).await;
                return Err(e);
            }
            Err(e) => return Err(e.into()),
        };
        if !caller.principal.allows(verb.action(), &key.namespace, Owner::Other) || key.role > caller.principal.role {
            let e = AppError::permission_denied(format!("role `{}` may not manage this key", caller.principal.role));
            self.record(caller, verb, &key.namespace, id, Err(&e)).await;
            return Err(e);
        }
        Ok(key)
    }

    /// A new key in place of `id` (same namespace, role, name and expiry),
    /// the old one revoked in the same write.
    pub async fn rotate_key(&self, id: &str) -> Result<CreatedKey> {
        let caller = self.caller()?;
        let old = self.managed_key(&caller, Verb::RotateKey, id).await?;
        if old.revoked_at.is_some() {
            let e = AppError::precondition(format!("key `{id}` is revoked: make a new one"));
            self.record(&caller, Verb::RotateKey, &old.namespace, id, Err(&e)).await;
            return Err(e);
        }
        let made =
            self.make_key(&caller, &old.namespace, old.role, old.name.clone(), old.expires_at, Some(old.id.clone()));
        self.audited(&caller, Verb::RotateKey, &old.namespace, id, made).await
    }

    /// Revoke `id` at once.
    pub async fn revoke_key(&self, id: &str) -> Result<ApiKey> {
        let caller = self.caller()?;
        let key = self.managed_key(&caller, Verb::RevokeKey, id).await?;
        let store = self.b.store.clone();
        let revoked = self
            .audited(&caller, Verb::RevokeKey, &key.namespace, id, async {
                Ok(store.revoke_key(id, flower_model::now_ms()).await?)
            })
            .await?;
        self.auth.forget(id);
        tracing::info!(key = %id, namespace = %key.namespace, "API key revoked");
        Ok(revoked)
    }

    /// The keys of `namespace` (empty: the caller's; an admin's: all).
    pub async fn keys(&self, namespace: &str) -> Result<Vec<ApiKey>> {
        let scope = self.scope_for(access::Action::ManageKeys, namespace, "list keys")?;
        Ok(self.b.store.keys(scope.as_deref()).await?)
    }

    /// The namespace a listing names ([`App::namespace_scope`]), when the
    /// caller's role allows `action` there.
    fn scope_for(&self, action: access::Action, namespace: &str, what: &str) -> Result<Option<String>> {
        let scope = self.namespace_scope("namespace", namespace)?;
        let p = self.caller()?.principal;
        let ns = scope.as_deref().unwrap_or(&p.namespace);
        if !p.allows(action, ns, Owner::Other) {
            return Err(AppError::permission_denied(format!("role `{}` may not {what}", p.role)));
        }
        Ok(scope)
    }

    /// The audit log of `namespace` (empty: the caller's; an admin's: all)
    /// after `after`, at most `limit` records.
    pub async fn audit_log(&self, namespace: &str, after: i64, limit: u32) -> Result<Vec<AuditRecord>> {
        let scope = self.scope_for(access::Action::Audit, namespace, "read the audit log")?;
        if after < 0 {
            return Err(AppError::invalid("after_seq", "must be 0 or a sequence number already seen"));
        }
        Ok(self.b.store.audit_log(scope.as_deref(), after, page(limit, 100)).await?)
    }
}

/// A key the operator provides (from a Secret) for [`App::bootstrap`].
#[derive(Clone, Debug)]
pub struct ProvidedKey {
    pub namespace: String,
    pub role: Role,
    pub name: String,
    /// The key itself (`flk_<id>_<secret>`), never stored.
    pub secret: String,
}

impl App {
    /// Make `namespaces` and `keys` exist (a deployment's bootstrap, from
    /// the chart's values and a Secret): each namespace created if missing;
    /// each key stored (its digest) if its id is new, left as it is when it
    /// is there with the same digest, namespace and role (a revoked one
    /// stays revoked), refused when its id is there with another key or
    /// another namespace or role. Each namespace of `limits` gets those
    /// limits (the deployment's values are the truth at each start: a raise
    /// given since lasts until then). Recorded as `bootstrap`.
    pub async fn bootstrap(
        &self,
        namespaces: &[String],
        limits: &[(String, flower_model::access::Limits)],
        keys: &[ProvidedKey],
    ) -> Result<()> {
        let caller = super::access::Caller {
            principal: Principal {
                namespace: flower_model::access::DEFAULT_NAMESPACE.into(),
                role: Role::Admin,
                subject: "bootstrap".into(),
            },
            origin: "bootstrap".into(),
            until: None,
        };
        let wanted = namespaces.iter().chain(limits.iter().map(|(ns, _)| ns)).chain(keys.iter().map(|k| &k.namespace));
        for ns in wanted {
            check_namespace(ns).map_err(|m| AppError::invalid("namespace", m))?;
            if self.b.store.create_namespace(ns).await? {
                self.record(&caller, Verb::CreateNamespace, ns, ns, Ok(())).await;
            }
        }
        for (ns, l) in limits {
            l.check().map_err(|(field, m)| AppError::invalid(&format!("limits.{ns}.{field}"), m))?;
            if self.b.store.namespace(ns).await?.limits != *l {
                self.b.store.set_limits(ns, l).await?;
                self.record(&caller, Verb::SetLimits, ns, ns, Ok(())).await;
            }
        }
        for k in keys {
            let id = access::key_id(&k.secret).ok_or_else(|| {
                AppError::invalid(
                    "key",
                    format_args!("the key of `{}` is not an API key (flk_<16 hex>_<64 hex>)", k.name),
                )
            })?;
            match self.b.store.get_key(id).await {
                Ok(stored) if access::key_matches(&k.secret, &stored.digest) => {
                    if (stored.namespace.as_str(), stored.role) != (k.namespace.as_str(), k.role) {
                        return Err(AppError::new(
                            ErrorKind::Conflict,
                            format!(
                                "key `{id}` is a `{}` of `{}`, not a `{}` of `{}`: a key keeps its namespace and \
                                 role; give the bootstrap a new key (and revoke this one)",
                                stored.role, stored.namespace, k.role, k.namespace
                            ),
                        ));
                    }
                    continue;
                }
                Ok(_) => {
                    return Err(AppError::new(
                        ErrorKind::AlreadyExists,
                        format!("key `{id}` exists with another secret: give the bootstrap a new key"),
                    ));
                }
                Err(StoreError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            let key = ApiKey {
                id: id.to_string(),
                namespace: k.namespace.clone(),
                role: k.role,
                name: k.name.clone(),
                digest: access::key_digest(&k.secret),
                created_at: flower_model::now_ms(),
                created_by: "bootstrap".into(),
                expires_at: None,
                last_used_at: None,
                revoked_at: None,
            };
            self.b.store.create_key(key, None).await?;
            self.record(&caller, Verb::CreateKey, &k.namespace, id, Ok(())).await;
        }
        Ok(())
    }
}
