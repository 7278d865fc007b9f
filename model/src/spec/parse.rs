//! Reading a spec: YAML or JSON into a [`JobSpec`], then validated. Every
//! error names its field (`workers.counter.tools[2]`), including the shapes
//! serde would let through (a sequence where a mapping belongs, NaN, NUL).

use std::path::Path;

use super::JobSpec;

/// An invalid spec: which field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid job spec: {field}: {message}")]
pub struct SpecError {
    /// Dotted path of the field (`workers.counter.tools[1]`), or `(document)`.
    pub field: String,
    pub message: String,
}

impl SpecError {
    pub(super) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: shorten(field.into()), message: message.into() }
    }
}

/// A field path is echoed in errors: a path made of a huge key (a 1 MB
/// worker name) is cut, so an error never carries the input back.
fn shorten(mut field: String) -> String {
    const MAX: usize = 200;
    if field.len() > MAX {
        let mut end = MAX;
        while !field.is_char_boundary(end) {
            end -= 1;
        }
        field.truncate(end);
        field.push('…');
    }
    field
}

impl JobSpec {
    /// Parse and validate a spec. Relative paths stay relative: see [`JobSpec::load`].
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let value: serde_json::Value = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| SpecError::new("(document)", format!("not valid JSON: {e}")))?
        } else {
            let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)
                .map_err(|e| SpecError::new("(document)", format!("not valid YAML: {e}")))?;
            // JSON has no NaN or infinity: converted, `.nan` would silently read as "not set".
            refuse_non_finite(&yaml, "")?;
            serde_yaml_ng::from_str(text).map_err(|e| SpecError::new("(document)", format!("not valid YAML: {e}")))?
        };
        Self::from_value(value)
    }

    /// Deserialize a JSON value (as stored with a job) and validate it.
    pub fn from_value(value: serde_json::Value) -> Result<Self, SpecError> {
        let Some(doc) = value.as_object() else {
            return Err(SpecError::new(
                "(document)",
                "a job spec is a mapping with `name`, `goal`, `coordinator` and `workers`",
            ));
        };
        refuse_nul(&value, "")?;
        check_mappings(doc)?;
        let spec: JobSpec = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            // serde reports a missing field at its parent; name the field itself.
            match missing_field(&inner) {
                Some(name) if path == "." => SpecError::new(name, "missing (required)"),
                Some(name) => SpecError::new(format!("{path}.{name}"), "missing (required)"),
                None => SpecError::new(if path == "." { "(document)".into() } else { path }, inner),
            }
        })?;
        spec.validate()?;
        Ok(spec)
    }

    /// Read a spec file; relative `scenario`/`workspace` paths are resolved
    /// against the spec's directory.
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SpecError::new("(document)", format!("cannot read {}: {e}", path.display())))?;
        let mut spec = Self::parse(&text)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        if let Some(s) = &spec.scenario {
            let p = dir.join(s);
            if !p.is_file() {
                return Err(SpecError::new("scenario", format!("no such file: {}", p.display())));
            }
            spec.scenario = Some(p);
        }
        if let Some(w) = &spec.workspace {
            let p = dir.join(w);
            if !p.is_dir() {
                return Err(SpecError::new("workspace", format!("no such directory: {}", p.display())));
            }
            spec.workspace = Some(p);
        }
        Ok(spec)
    }
}

/// `at.key`, or `key` at the top.
fn child(at: &str, key: &str) -> String {
    if at.is_empty() { key.to_string() } else { format!("{at}.{key}") }
}

/// Refuse a NUL byte in any string or key, naming its exact path: text with
/// NUL cannot be stored (Postgres `text` refuses it), and it is never meant.
fn refuse_nul(v: &serde_json::Value, at: &str) -> Result<(), SpecError> {
    let nul = |at: &str| {
        let at = if at.is_empty() { "(document)".to_string() } else { at.replace('\0', "\\0") };
        Err(SpecError::new(at, "contains a NUL byte (\\0), which stored text cannot hold"))
    };
    match v {
        serde_json::Value::String(s) if s.contains('\0') => nul(at),
        serde_json::Value::Array(items) => {
            items.iter().enumerate().try_for_each(|(i, x)| refuse_nul(x, &format!("{at}[{i}]")))
        }
        serde_json::Value::Object(map) => map.iter().try_for_each(|(k, x)| {
            let here = child(at, k);
            if k.contains('\0') { nul(&here) } else { refuse_nul(x, &here) }
        }),
        _ => Ok(()),
    }
}

/// Refuse `.nan` and `.inf` anywhere in a YAML document, naming the field.
fn refuse_non_finite(v: &serde_yaml_ng::Value, at: &str) -> Result<(), SpecError> {
    use serde_yaml_ng::Value;
    match v {
        Value::Number(n) if !n.is_finite() => {
            Err(SpecError::new(if at.is_empty() { "(document)" } else { at }, format!("{n} is not a finite number")))
        }
        Value::Sequence(items) => {
            items.iter().enumerate().try_for_each(|(i, x)| refuse_non_finite(x, &format!("{at}[{i}]")))
        }
        Value::Mapping(map) => map.iter().try_for_each(|(k, x)| {
            let key = match k {
                Value::String(k) => k.clone(),
                other => serde_yaml_ng::to_string(other).unwrap_or_default().trim().to_string(),
            };
            refuse_non_finite(x, &child(at, &key))
        }),
        Value::Tagged(t) => refuse_non_finite(&t.value, at),
        _ => Ok(()),
    }
}

type Mapping = serde_json::Map<String, serde_json::Value>;

/// The value at `field` must be a mapping when present. serde reads a
/// sequence into a struct field by field (`runtime: []` would parse as all
/// defaults), so the shape is checked before deserializing.
fn mapping<'a>(field: &str, v: Option<&'a serde_json::Value>) -> Result<Option<&'a Mapping>, SpecError> {
    use serde_json::Value;
    let found = match v {
        None => return Ok(None),
        Some(Value::Object(m)) => return Ok(Some(m)),
        Some(Value::Null) => "nothing",
        Some(Value::Bool(_)) => "a boolean",
        Some(Value::Number(_)) => "a number",
        Some(Value::String(_)) => "a string",
        Some(Value::Array(_)) => "a sequence",
    };
    Err(SpecError::new(field, format!("must be a mapping (`key: value` entries), not {found}")))
}

/// Every place the spec expects a mapping is one.
fn check_mappings(doc: &Mapping) -> Result<(), SpecError> {
    mapping("coordinator", doc.get("coordinator"))?;
    if let Some(workers) = mapping("workers", doc.get("workers"))? {
        for (name, w) in workers {
            mapping(&child("workers", name), Some(w))?;
        }
    }
    if let Some(servers) = mapping("mcp_servers", doc.get("mcp_servers"))? {
        for (name, m) in servers {
            let at = child("mcp_servers", name);
            if let Some(m) = mapping(&at, Some(m))? {
                mapping(&child(&at, "env_from"), m.get("env_from"))?;
            }
        }
    }
    let Some(r) = mapping("runtime", doc.get("runtime"))? else { return Ok(()) };
    if let Some(p) = mapping("runtime.pruning", r.get("pruning"))? {
        mapping("runtime.pruning.ephemeral", p.get("ephemeral"))?;
        mapping("runtime.pruning.trim", p.get("trim"))?;
    }
    mapping("runtime.handoff", r.get("handoff"))?;
    if let Some(b) = mapping("runtime.budget", r.get("budget"))?
        && let Some(prices) = mapping("runtime.budget.prices", b.get("prices"))?
    {
        for (model, p) in prices {
            mapping(&child("runtime.budget.prices", model), Some(p))?;
        }
    }
    Ok(())
}

fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest.split('`').next()?.to_string())
}
