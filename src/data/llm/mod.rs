//! Text data for the LLM trainers: conversations and their messages, datasets read from JSONL
//! files in TRL's formats, and chat templates.
//!
//! A [`Message`] is one turn of a conversation, as TRL's conversational datasets and
//! `transformers`' `apply_chat_template` write it: `{"role": "user", "content": "…"}`.
//!
//! ```
//! use torchrl::data::llm::Message;
//! let m: Message = serde_json::from_str(r#"{"role": "user", "content": "2 + 2 ="}"#).unwrap();
//! assert_eq!(m, Message::new("user", "2 + 2 ="));
//! ```

use serde::{Deserialize, Serialize};

pub mod chat;
pub mod dataset;
pub mod prepare;

pub use chat::ChatTemplate;
pub use dataset::{Dataset, DatasetFormat, Example, ExampleData, Text};

/// One turn of a conversation: who speaks (`"system"`, `"user"`, `"assistant"`, or any role a
/// chat template accepts) and what they say.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// The speaker.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}
