//! Who may do what (docs/design.md, section 17): a caller is a
//! [`Principal`] — a namespace, a [`Role`] and a subject — and every call of
//! the application layer is an [`Action`] its role allows or not. API keys
//! are made here: shown once, stored as a digest, compared in constant time.

use sha2::{Digest, Sha256};

pub use flower_model::access::Role;

/// A call of the application layer, as authorisation sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Read,
    Submit,
    /// Interrupt, answer or continue a job.
    Steer,
    Cancel,
    ManageKeys,
    /// Read the audit log.
    Audit,
    ManageNamespaces,
    /// Raise the namespace's spending limits (answering a job's question).
    RaiseBudget,
}

/// Whose job a call acts on, relative to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The caller submitted it (or the call creates it).
    Caller,
    /// Someone else of the same namespace.
    Other,
}

/// A caller: the namespace its credential is bound to, its role, and who it
/// is (a key's id or a token's subject), for the audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub namespace: String,
    pub role: Role,
    pub subject: String,
}

/// A principal and where its call comes from (the audit log's "from where").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub principal: Principal,
    /// The front-end and the peer: `grpc 127.0.0.1:53122`, `console …`, `cli`.
    pub origin: String,
    /// When the credential stops being valid (a key's expiry, a signed
    /// token's `exp`), in ms; what keeps a caller longer (a console
    /// session) ends there.
    pub until: Option<i64>,
}

impl Caller {
    /// The user of an open deployment (no credential configured: one user
    /// on their own machine), or of the embedded store: an admin.
    pub fn local(origin: impl Into<String>) -> Self {
        Caller {
            principal: Principal {
                namespace: flower_model::access::DEFAULT_NAMESPACE.into(),
                role: Role::Admin,
                subject: "local".into(),
            },
            origin: origin.into(),
            until: None,
        }
    }
}

impl Principal {
    /// Whether this caller may know that a thing of `namespace` exists.
    pub fn sees(&self, namespace: &str) -> bool {
        self.role == Role::Admin || self.namespace == namespace
    }

    /// Whether this caller may do `action` on a job of `namespace` owned as
    /// `owner`. A job of another namespace is never allowed (and the
    /// front-end says `NOT_FOUND`: its existence is not revealed), except to
    /// an admin.
    pub fn allows(&self, action: Action, namespace: &str, owner: Owner) -> bool {
        if self.role != Role::Admin && namespace != self.namespace {
            return false;
        }
        match action {
            Action::Read => true,
            Action::Submit => self.role >= Role::Submitter,
            Action::Steer => self.role >= Role::Operator || (self.role == Role::Submitter && owner == Owner::Caller),
            Action::Cancel => self.role >= Role::Operator || (self.role == Role::Submitter && owner == Owner::Caller),
            Action::ManageKeys | Action::Audit | Action::RaiseBudget => self.role >= Role::Operator,
            Action::ManageNamespaces => self.role == Role::Admin,
        }
    }
}

/// The prefix every API key starts with (so a leaked one is recognisable).
pub const KEY_PREFIX: &str = "flk_";

/// A new API key: the secret shown once to whoever made it, and what is
/// stored — its id (the part after the prefix up to `_`, not secret) and
/// the digest of the whole key.
#[derive(Clone, Debug)]
pub struct NewKey {
    pub secret: String,
    pub id: String,
    pub digest: String,
}

/// Make an API key: `flk_<id>_<secret>`, 8 random bytes of id and 32 of secret.
pub fn new_key() -> NewKey {
    let id = hex::encode(rand::random::<[u8; 8]>());
    let secret = format!("{KEY_PREFIX}{id}_{}", hex::encode(rand::random::<[u8; 32]>()));
    let digest = key_digest(&secret);
    NewKey { secret, id, digest }
}

/// The id a presented key names, when it has the shape of one.
pub fn key_id(presented: &str) -> Option<&str> {
    let rest = presented.strip_prefix(KEY_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    (id.len() == 16 && secret.len() == 64 && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'_')).then_some(id)
}

/// What is stored of a key: its SHA-256, hex.
pub fn key_digest(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// Whether `presented` is the key whose digest is `stored` (constant time).
pub fn key_matches(presented: &str, stored: &str) -> bool {
    flower_model::secret::same(key_digest(presented).as_bytes(), stored.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(ns: &str, role: Role) -> Principal {
        Principal { namespace: ns.into(), role, subject: "k".into() }
    }

    #[test]
    fn each_role_does_what_it_says_and_no_more() {
        use Action::*;
        let viewer = p("team-a", Role::Viewer);
        assert!(viewer.allows(Read, "team-a", Owner::Other));
        for a in [Submit, Steer, Cancel, ManageKeys, ManageNamespaces] {
            assert!(!viewer.allows(a, "team-a", Owner::Caller), "{a:?}");
        }
        let submitter = p("team-a", Role::Submitter);
        assert!(submitter.allows(Submit, "team-a", Owner::Caller));
        assert!(submitter.allows(Steer, "team-a", Owner::Caller) && submitter.allows(Cancel, "team-a", Owner::Caller));
        assert!(!submitter.allows(Cancel, "team-a", Owner::Other), "someone else's job");
        assert!(!submitter.allows(Steer, "team-a", Owner::Other));
        let operator = p("team-a", Role::Operator);
        assert!(operator.allows(Cancel, "team-a", Owner::Other) && operator.allows(ManageKeys, "team-a", Owner::Other));
        assert!(!operator.allows(ManageNamespaces, "team-a", Owner::Other));
        assert!(operator.allows(Audit, "team-a", Owner::Other) && !submitter.allows(Audit, "team-a", Owner::Other));
        let admin = p("team-a", Role::Admin);
        assert!(admin.allows(ManageNamespaces, "team-b", Owner::Other));
    }

    #[test]
    fn another_namespace_is_out_of_reach_but_for_an_admin() {
        for role in [Role::Viewer, Role::Submitter, Role::Operator] {
            let caller = p("team-a", role);
            assert!(!caller.allows(Action::Read, "team-b", Owner::Other), "{role:?}");
            assert!(!caller.allows(Action::Cancel, "team-b", Owner::Caller), "{role:?}");
        }
        assert!(p("team-a", Role::Admin).allows(Action::Cancel, "team-b", Owner::Other));
    }

    #[test]
    fn keys_are_shown_once_and_stored_as_a_digest() {
        let k = new_key();
        assert!(k.secret.starts_with(KEY_PREFIX) && !k.digest.contains(&k.secret));
        assert_eq!(key_id(&k.secret), Some(k.id.as_str()));
        assert!(key_matches(&k.secret, &k.digest));
        let mut wrong = k.secret.clone();
        wrong.pop();
        wrong.push(if k.secret.ends_with('0') { '1' } else { '0' });
        assert!(!key_matches(&wrong, &k.digest));
        assert_ne!(new_key().id, k.id);
        for bad in ["", "flk_", "flk_zz_yy", "abc_0123456789abcdef_00", &k.secret[..k.secret.len() - 1]] {
            assert_eq!(key_id(bad), None, "{bad:?}");
        }
    }
}
