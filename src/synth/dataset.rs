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
                messages.push(ChatMessage {
                    role: "system",
                    content: s,
                });
            }
            if let Some(c) = self
                .user_context_message
                .as_deref()
                .filter(|s| !s.is_empty())
            {
                messages.push(ChatMessage {
                    role: "user",
                    content: c,
                });
            }
            for earlier in &self.turns[..=i] {
                messages.push(ChatMessage {
                    role: "user",
                    content: &earlier.text,
                });
            }
            let body = ChatBody {
                messages,
                model,
                stream: false,
                max_completion_tokens: turn.max_tokens,
            };
            // Strings, booleans and integers always serialise.
            bodies.push(serde_json::to_string(&body).expect("body serialises"));
        }
        bodies
    }
}

/// One chat message of a request body.
#[derive(Serialize)]
pub struct ChatMessage<'a> {
    pub role: &'a str,
    pub content: &'a str,
}

/// An OpenAI chat request body with AIPerf's key order.
#[derive(Serialize)]
pub struct ChatBody<'a> {
    pub messages: Vec<ChatMessage<'a>>,
    pub model: &'a str,
    pub stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
}
