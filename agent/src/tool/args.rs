//! Tool arguments as types: a tool reads its input into a struct deriving
//! `Deserialize` and `JsonSchema`, and the schema the model is sent is
//! derived from that same struct ([`schema_of`]), so what is sent and what
//! is read cannot drift apart. A field's doc comment is its description in
//! the schema; the struct's own doc comment is not sent.
//!
//! A bad input becomes an error naming the field ([`args`]); the MCP server
//! reads its tools' arguments with the same parts ([`parse_args`]).

use schemars::transform::{RecursiveTransform, Transform};
use schemars::{JsonSchema, Schema};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::ToolError;

/// The input schema of `T`, as a plain inline object schema: no `$schema`,
/// `title` or definitions, subschemas inlined, the struct's own doc comment
/// left out. Two things schemars adds are taken out (in [`plain`]), as the
/// tools' schemas never carried them: `null` as a type of an optional
/// argument (an optional argument is left out, though `null` is read as
/// absent), and the `format` of an integer (`uint64`).
pub fn schema_of<T: JsonSchema>() -> Value {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12();
    settings.inline_subschemas = true;
    settings.meta_schema = None;
    let mut schema = settings.into_generator().into_root_schema_for::<T>();
    RecursiveTransform(plain).transform(&mut schema);
    let mut value = schema.to_value();
    if let Some(root) = value.as_object_mut() {
        root.remove("title");
        root.remove("description");
    }
    value
}

/// One schema (each subschema in turn, by [`RecursiveTransform`]) without
/// what [`schema_of`] leaves out.
fn plain(schema: &mut Schema) {
    let Some(obj) = schema.as_object_mut() else { return };
    if let Some(Value::Array(types)) = obj.get_mut("type") {
        types.retain(|t| t != "null");
        if let [one] = types.as_slice() {
            let one = one.clone();
            obj.insert("type".into(), one);
        }
    }
    if let Some(Value::Array(values)) = obj.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    if obj.get("type").is_some_and(|t| t == "integer") {
        obj.remove("format");
    }
}

/// Why a tool input could not be read: the field (a path such as
/// `todos[0].status`; empty for the input as a whole) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgsError {
    pub field: String,
    pub message: String,
}

/// Read `input` as `T`, or say which field is wrong and how.
pub fn parse_args<T: DeserializeOwned>(input: Value) -> Result<T, ArgsError> {
    serde_path_to_error::deserialize(input).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        let message = e.inner().to_string();
        match message.strip_prefix("missing field `").and_then(|m| m.strip_suffix('`')) {
            Some(field) if path.is_empty() => {
                ArgsError { field: field.to_string(), message: "missing (required)".into() }
            }
            Some(field) => ArgsError { field: format!("{path}.{field}"), message: "missing (required)".into() },
            None => ArgsError { field: path, message: readable(&message) },
        }
    })
}

/// serde's words for a bad value, put the way round a reader looks for
/// them ("expected a string, got integer `12`"), and without Rust type
/// names ("expected struct ReadArgs" is "expected an object").
fn readable(message: &str) -> String {
    let message = match message.strip_prefix("invalid type: ").and_then(|m| m.rsplit_once(", expected ")) {
        Some((got, expected)) => format!("expected {expected}, got {got}"),
        None => message.to_string(),
    };
    match message.find("expected struct ") {
        Some(at) => {
            let rest = &message[at + "expected struct ".len()..];
            let name_len = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
            format!("{}expected an object{}", &message[..at], &rest[name_len..])
        }
        None => message,
    }
}

/// A tool's input as `T`, or an error the model reads, naming the field
/// ("`pattern`: missing (required)", "`limit`: expected u64, got string \"x\"").
pub fn args<T: DeserializeOwned>(input: Value) -> Result<T, ToolError> {
    parse_args(input).map_err(|e| {
        ToolError::RespondToModel(if e.field.is_empty() {
            format!("the tool input: {}", e.message)
        } else {
            format!("`{}`: {}", e.field, e.message)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    enum Mode {
        Fast,
        Thorough,
    }

    /// Not sent to the model.
    #[derive(Debug, Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Probe {
        /// What to look for
        pattern: String,
        #[schemars(range(min = 1))]
        limit: Option<u64>,
        mode: Option<Mode>,
        items: Option<Vec<Item>>,
    }

    // No doc comment: a nested struct's would be its description.
    #[derive(Debug, Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Item {
        name: String,
    }

    #[test]
    fn the_schema_is_plain_and_inline() {
        assert_eq!(
            schema_of::<Probe>(),
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "What to look for"},
                    "limit": {"type": "integer", "minimum": 1},
                    "mode": {"type": "string", "enum": ["fast", "thorough"]},
                    "items": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
                    }
                },
                "required": ["pattern"]
            })
        );
    }

    fn error(input: Value) -> String {
        match args::<Probe>(input) {
            Err(ToolError::RespondToModel(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(error(json!({})), "`pattern`: missing (required)");
        assert_eq!(error(json!({"pattern": "p", "limit": "x"})), "`limit`: expected u64, got string \"x\"");
        assert_eq!(error(json!({"pattern": 1})), "`pattern`: expected a string, got integer `1`");
        assert!(error(json!({"pattern": "p", "mode": "slow"})).starts_with("`mode`: unknown variant `slow`"));
        assert_eq!(error(json!({"pattern": "p", "items": [{}]})), "`items[0].name`: missing (required)");
        assert_eq!(error(json!("p")), "the tool input: expected an object, got string \"p\"");
        let ok: Probe = args(json!({"pattern": "p", "limit": null, "extra": true})).unwrap();
        assert_eq!((ok.pattern.as_str(), ok.limit), ("p", None));
    }
}
