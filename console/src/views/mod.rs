//! The pieces the console's pages are made of, as maud markup: every value
//! spliced into `html!` is escaped, so job content (names, transcripts,
//! questions, paths) can be given as it is. `PreEscaped` is never used for
//! job content.
//!
//! - `layout`: the document around a page, its headers, the problem page
//!   and the sign-in form
//! - `insights`: the jobs list's insights strip
//! - `job`: the job page's header, actions and sections
//! - `tree`: the task tree
//! - `charts`: the timeline (waterfall) and the context meter, as SVG
//! - here: the small formats every page uses (durations, shares, money,
//!   the state badge, cut text, a path in a link)

use std::borrow::Cow;

use flower_model::JobState;
use maud::{Markup, html};

pub mod charts;
pub mod insights;
pub mod job;
pub mod layout;
pub mod tree;

/// A duration for people: `830 ms`, `42s`, `3m 5s`, `2h 10m`, `3d 4h`.
pub fn human_ms(ms: i64) -> String {
    if (0..1000).contains(&ms) {
        return format!("{ms} ms");
    }
    let s = ms.max(0) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A share as a whole percentage, `–` when there is none.
pub fn pct(r: Option<f64>) -> String {
    r.map_or("–".into(), |x| format!("{:.0}%", x * 100.0))
}

/// An estimated cost in dollars, `–` when there is none.
pub fn money(c: Option<f64>) -> String {
    c.map_or("–".into(), |x| format!("${x:.4}"))
}

/// A job's state as a badge (`console.css` colours it; tests find it by class).
pub fn state_badge(state: JobState) -> Markup {
    let s = state.as_str();
    html! { span class={ "state state-" (s) } data-state=(s) { (s) } }
}

/// A workbench path as it goes into a link's path: every byte but ASCII
/// letters, digits, `-._~` and the `/` between components percent-encoded
/// (a path may hold `#`, `?`, `%` or spaces; the route decodes them).
pub fn path_in_url(path: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// At most `max` characters of `text`, saying how many more there were.
pub fn cut(text: &str, max: usize) -> Cow<'_, str> {
    let count = text.chars().count();
    if count <= max {
        return Cow::Borrowed(text);
    }
    let kept: String = text.chars().take(max).collect();
    Cow::Owned(format!("{kept}… [{} more characters]", count - max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_cut() {
        let shown = html! { p title=("<script>\"x\" & 'y'</script>") { ("<script>\"x\" & 'y'</script>") } };
        let text = "&lt;script&gt;&quot;x&quot; &amp; 'y'&lt;/script&gt;";
        assert_eq!(shown.into_string(), format!("<p title=\"{text}\">{text}</p>"));
        assert_eq!(cut("abcdef", 3), "abc… [3 more characters]");
        assert_eq!(cut("abc", 3), "abc");
    }

    #[test]
    fn paths_in_links_are_percent_encoded() {
        assert_eq!(path_in_url("artifacts/sizes.md"), "artifacts/sizes.md");
        assert_eq!(path_in_url("a b/c#d?e%f/é"), "a%20b/c%23d%3Fe%25f/%C3%A9");
    }
}
