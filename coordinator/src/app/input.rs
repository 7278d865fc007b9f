//! The checks on what a request carries, once for every front-end: ids,
//! free text, paths, and their limits. A refusal names the field and never
//! echoes a long or unprintable value.

use super::AppError;

/// Longest id a request may give (a job or session id has 36 characters; a
/// prefix is shorter). Longer ones are refused without being echoed.
pub const MAX_ID_LEN: usize = 64;
/// Longest idempotency key.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;
/// Longest cancel reason.
pub const MAX_REASON: usize = 4096;
/// Longest question id of an answer.
pub const MAX_QUESTION_ID: usize = 256;
/// Longest workbench or workspace path, and one component of it (the usual
/// file-system limits: longer ones could never name a file).
pub const MAX_PATH: usize = 1024;
pub const MAX_PATH_COMPONENT: usize = 255;

/// A required id field, parsed, or `Invalid` naming the field.
pub fn parse_id<T: std::str::FromStr>(field: &str, value: &str) -> Result<T, AppError> {
    check_id(field, value)?;
    value.parse().map_err(|_| AppError::invalid(field, format_args!("`{value}` is not a valid id")))
}

/// An id or id prefix: present, short, printable.
pub fn check_id(field: &str, value: &str) -> Result<(), AppError> {
    if value.is_empty() {
        return Err(AppError::invalid(field, "required"));
    }
    if value.len() > MAX_ID_LEN {
        return Err(AppError::invalid(
            field,
            format_args!("{} bytes is not an id (at most {MAX_ID_LEN})", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(AppError::invalid(field, "control characters are not allowed in an id"));
    }
    Ok(())
}

/// Free text: no NUL or other control characters but newlines and tabs, at
/// most `max` bytes.
pub fn check_text(field: &str, value: &str, max: usize) -> Result<(), AppError> {
    if value.len() > max {
        return Err(AppError::invalid(field, format_args!("{} bytes, over the limit of {max}", value.len())));
    }
    if value.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r')) {
        return Err(AppError::invalid(field, "control characters (such as NUL) are not allowed"));
    }
    Ok(())
}

/// Free text that must say something: not blank, then as [`check_text`].
pub fn required_text(field: &str, value: &str, max: usize, what: &str) -> Result<(), AppError> {
    if value.trim().is_empty() {
        return Err(AppError::invalid(field, what));
    }
    check_text(field, value, max)
}

/// A relative path in a job's workbench or workspace: no NUL, no `..`, no
/// absolute path, within the file-system's length limits. Refusals say what
/// is wrong and where, and echo the path only when it is short and printable.
pub fn check_path(field: &str, path: &str) -> Result<(), AppError> {
    let printable = path.len() <= 200 && !path.chars().any(char::is_control);
    let shown = if printable { format!("`{path}`") } else { format!("the {}-byte path", path.len()) };
    if path.len() > MAX_PATH || path.split('/').any(|c| c.len() > MAX_PATH_COMPONENT) {
        return Err(AppError::invalid(
            field,
            format_args!("{shown} is too long (at most {MAX_PATH} bytes, {MAX_PATH_COMPONENT} per component)"),
        ));
    }
    if let Some((at, c)) = path.char_indices().find(|(_, c)| c.is_control()) {
        return Err(AppError::invalid(field, format_args!("{shown} holds the control character {c:?} at byte {at}")));
    }
    // One spelling per file: `a//b`, `./a` and `a/` are refused, so paths
    // compare as strings.
    if path.starts_with('/') {
        return Err(AppError::invalid(field, format_args!("{shown} is absolute: give a relative path")));
    }
    let bad = path.split('/').find(|c| c.is_empty() || *c == "." || *c == "..");
    if let Some(part) = bad {
        let why = match part {
            "" => "an empty component (`//`, or a trailing `/`)".to_string(),
            p => format!("a `{p}` component"),
        };
        return Err(AppError::invalid(field, format_args!("{shown} is not a relative path: it has {why}")));
    }
    if flower_store::localfs::check_relative(path).is_err() {
        return Err(AppError::invalid(field, format_args!("{shown} is not a relative path")));
    }
    Ok(())
}

/// Every workspace path is a short relative path, and no two collide: the
/// same path twice, or a path beneath another one (`zz` and `zz/b`: `zz`
/// cannot be both a file and a directory).
pub fn check_workspace_paths<'a>(paths: impl Iterator<Item = &'a str> + Clone) -> Result<(), AppError> {
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, p) in paths.clone().enumerate() {
        check_path(&format!("workspace[{i}].path"), p)?;
        if let Some(j) = seen.insert(p, i) {
            return Err(AppError::invalid(
                &format!("workspace[{i}].path"),
                format_args!("`{p}` is also workspace[{j}]"),
            ));
        }
    }
    for (i, p) in paths.enumerate() {
        let mut parent = p;
        while let Some((dir, _)) = parent.rsplit_once('/') {
            if let Some(j) = seen.get(dir) {
                return Err(AppError::invalid(
                    &format!("workspace[{i}].path"),
                    format_args!("`{p}` is beneath `{dir}`, which workspace[{j}] makes a file"),
                ));
            }
            parent = dir;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_model::ErrorKind;

    #[test]
    fn ids_are_checked_without_echoing_long_ones() {
        let long = "a".repeat(10_000);
        let e = parse_id::<uuid::Uuid>("job_id", &long).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(e.message.len() < 100, "{}", e.message);
        let e = parse_id::<uuid::Uuid>("job_id", "a\0b").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(!e.message.contains('\0'));
        assert_eq!(parse_id::<uuid::Uuid>("job_id", "").unwrap_err().message, "job_id: required");
    }

    #[test]
    fn text_and_paths_name_their_field() {
        assert!(check_text("message", "line\nnext\ttab", 100).is_ok());
        assert_eq!(check_text("message", "a\0", 100).unwrap_err().kind, ErrorKind::Invalid);
        assert!(check_text("message", &"x".repeat(101), 100).unwrap_err().message.starts_with("message: 101 bytes"));
        assert!(required_text("message", "  ", 100, "required").unwrap_err().message == "message: required");
        assert!(check_path("path", "artifacts/a.md").is_ok());
        for bad in
            ["../x", "/etc/passwd", "a\0b", "a//b", "./a", "a/", &"p".repeat(5000), &format!("a/{}", "c".repeat(300))]
        {
            let e = check_path("path", bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Invalid, "{bad:?}");
            assert!(e.message.starts_with("path: "), "{}", e.message);
            assert!(e.message.len() < 300, "{}", e.message);
        }
        // The refusal says what is wrong, and where.
        let says = |p: &str| check_path("path", p).unwrap_err().message;
        assert_eq!(says("a\0b"), "path: the 3-byte path holds the control character '\\0' at byte 1");
        assert!(says("a//b").ends_with("an empty component (`//`, or a trailing `/`)"), "{}", says("a//b"));
        assert!(says("x/../y").ends_with("a `..` component"));
        assert!(says("/etc/passwd").contains("is absolute"));
    }

    #[test]
    fn workspace_paths_do_not_collide() {
        assert!(check_workspace_paths(["a", "b/c"].into_iter()).is_ok());
        let twice = check_workspace_paths(["a", "a"].into_iter()).unwrap_err();
        assert_eq!(twice.message, "workspace[1].path: `a` is also workspace[0]");
        let beneath = check_workspace_paths(["zz/b", "zz"].into_iter()).unwrap_err();
        assert!(beneath.message.contains("is beneath `zz`"), "{}", beneath.message);
    }
}
