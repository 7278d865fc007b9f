//! Message content blocks, in the exact shape of the Anthropic Messages API so
//! that what is stored is what was sent and received, block for block.

use serde::{Deserialize, Deserializer, Serialize};

/// One block of a message's `content`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: serde_json::Value,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(deserialize_with = "string_or_blocks")]
        content: Vec<ResultBlock>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    Image {
        source: serde_json::Value,
    },
    Thinking {
        thinking: String,
        #[serde(default)]
        signature: String,
    },
}

/// A block inside a `tool_result`: text or image (the API accepts both).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResultBlock {
    Text { text: String },
    Image { source: serde_json::Value },
}

/// `tool_result.content` may be a plain string or a list of blocks.
fn string_or_blocks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ResultBlock>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        Blocks(Vec<ResultBlock>),
    }
    Ok(match Either::deserialize(d)? {
        Either::Text(text) => vec![ResultBlock::Text { text }],
        Either::Blocks(blocks) => blocks,
    })
}

impl ContentBlock {
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }

    /// A tool result holding one text block.
    pub fn tool_result(tool_use_id: impl Into<String>, text: impl Into<String>, is_error: bool) -> Self {
        Self::ToolResult {
            tool_use_id: tool_use_id.into(),
            content: vec![ResultBlock::Text { text: text.into() }],
            is_error,
        }
    }

    /// Characters of text this block carries (body size, for accounting).
    pub fn text_len(&self) -> usize {
        match self {
            Self::Text { text } => text.len(),
            Self::ToolUse { input, .. } => input.to_string().len(),
            Self::ToolResult { content, .. } => content
                .iter()
                .map(|b| match b {
                    ResultBlock::Text { text } => text.len(),
                    ResultBlock::Image { .. } => 0,
                })
                .sum(),
            Self::Image { .. } => 0,
            Self::Thinking { thinking, .. } => thinking.len(),
        }
    }
}

/// All text of a list of result blocks, joined by newlines.
pub fn result_text(blocks: &[ResultBlock]) -> String {
    let mut out = String::new();
    for b in blocks {
        if let ResultBlock::Text { text } = b {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn blocks_use_the_messages_api_shape() {
        let b = ContentBlock::ToolUse { id: "toolu_1".into(), name: "Read".into(), input: json!({"file_path": "a"}) };
        assert_eq!(
            serde_json::to_value(&b).unwrap(),
            json!({"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a"}})
        );
        let r = ContentBlock::tool_result("toolu_1", "hi", false);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "hi"}]})
        );
    }

    #[test]
    fn tool_result_content_may_be_a_string() {
        let r: ContentBlock = serde_json::from_value(
            json!({"type": "tool_result", "tool_use_id": "t", "content": "plain", "is_error": true}),
        )
        .unwrap();
        assert_eq!(r, ContentBlock::tool_result("t", "plain", true));
    }
}
