//! The synthesized dataset: conversations, turns, and their JSONL forms.
//! Owns the data shapes and serialisation; must never generate content.

use serde::Serialize;

/// One user turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Turn {
    /// The prompt text.
    pub text: String,
    /// The OSL for this turn, when one is configured.
    pub max_tokens: Option<u64>,
}

/// One conversation (AIPerf `Conversation`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Conversation {
    pub session_id: String,
    pub system_message: Option<String>,
    pub user_context_message: Option<String>,
    pub turns: Vec<Turn>,
}

/// A whole synthetic dataset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dataset {
    pub conversations: Vec<Conversation>,
}

impl Conversation {
    /// One JSONL line (no newline): `session_id`, `system_message`, `user_context_message`,
    /// `turns[{text, max_tokens}]`.
    pub fn to_json_line(&self) -> String {
        // Serialising plain strings and integers cannot fail.
        serde_json::to_string(self).expect("conversation serialises")
    }

    /// OpenAI chat request bodies, one per turn, in AIPerf's message order: system message,
    /// user-context message, then the user turns up to this one. Assistant replies are not
    /// known at synthesis time, so earlier user turns appear without them. Key order:
    /// `messages`, `model`, `stream`, `max_completion_tokens`.
    pub fn to_openai_chat_bodies(&self, model: &str) -> Vec<String> {
        let mut bodies = Vec::with_capacity(self.turns.len());
        for (i, turn) in self.turns.iter().enumerate() {
            let mut messages = Vec::new();
            if let Some(s) = self.system_message.as_deref().filter(|s| !s.is_empty()) {
                messages.push(serde_json::json!({"role": "system", "content": s}));
            }
            if let Some(c) = self
                .user_context_message
                .as_deref()
                .filter(|s| !s.is_empty())
            {
                messages.push(serde_json::json!({"role": "user", "content": c}));
            }
            for earlier in &self.turns[..i] {
                messages.push(serde_json::json!({"role": "user", "content": earlier.text}));
            }
            messages.push(serde_json::json!({"role": "user", "content": turn.text}));
            let mut body = serde_json::Map::new();
            body.insert("messages".into(), serde_json::Value::Array(messages));
            body.insert("model".into(), model.into());
            body.insert("stream".into(), false.into());
            if let Some(m) = turn.max_tokens {
                body.insert("max_completion_tokens".into(), m.into());
            }
            bodies.push(serde_json::Value::Object(body).to_string());
        }
        bodies
    }
}
